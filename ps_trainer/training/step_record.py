"""--record_steps: every step of a worker, one JSON line: when, which step, its loss,
and in async mode its gradient's staleness.

Staleness is what asynchronous training is argued about: a worker reads the
variables at one global step and its update lands at a later one, after other
workers' updates. A step's staleness is the number of other updates applied
between its read and its own update:

    staleness = (global step its update produced - 1) - (global step it read)

Both numbers come from the step itself: the global step read next to the
variables, and the value the global step's increment returned. `./launch.sh
compare` turns this on and draws the distribution.

Lines go to <log_dir>/steps/<task>.jsonl:
  {"time": Unix time at its end, "step": global step after it,
   "loss": its training loss, "staleness": n}   (staleness: async only)
They are buffered and flushed at the end of the first step at least
FLUSH_SECS after the last flush, so a worker killed with SIGKILL while it
trains loses about its last second of lines, not a buffer full (one stalled
in a step keeps the lines of the second before it).
"""

import json
import os
import time
from typing import Callable, Optional

import tensorflow as tf

# Longest time a written line waits in the buffer: what a SIGKILL can lose.
# Once a second costs a step nothing; a flush per step would be a write(2)
# per step.
FLUSH_SECS = 1.0


class StepRecordHook(tf.compat.v1.train.SessionRunHook):
  """Appends one line per step of this worker (see the module doc).

  Args:
    path: the .jsonl file (appended to: a restarted task continues it).
    loss: the training loss tensor.
    read_step: the global step as this step read it.
    applied_step: the global step this step's own update produced; None in
      sync mode, where the chief applies aggregated updates and drops stale
      gradients (staleness 0 by construction).
    clock: Unix time now; stamps the lines and paces the flushes.
  """

  def __init__(self, path: str, loss, read_step,
               applied_step: Optional[tf.Tensor] = None,
               clock: Callable[[], float] = time.time):
    self._path = path
    fetches = {"loss": loss, "read_step": read_step}
    if applied_step is not None:
      fetches["applied_step"] = applied_step
    self._fetches = fetches
    self._clock = clock
    self._file = None
    # -inf: the first line is flushed at once, so the file shows a start.
    self._flushed_at = float("-inf")

  def after_create_session(self, session, coord):
    if self._file is None:
      os.makedirs(os.path.dirname(self._path), exist_ok=True)
      self._file = open(self._path, "a", buffering=1 << 16)

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    got = run_values.results
    now = self._clock()
    line = {"time": round(now, 4), "loss": round(float(got["loss"]), 6)}
    if "applied_step" in got:
      applied = int(got["applied_step"])
      line["step"] = applied
      line["staleness"] = max(applied - 1 - int(got["read_step"]), 0)
    else:
      line["step"] = int(got["read_step"]) + 1
    self._file.write(json.dumps(line) + "\n")
    # A clock set back is due too: else flushes would wait for it to catch up.
    if not 0 <= now - self._flushed_at < FLUSH_SECS:
      self._file.flush()
      self._flushed_at = now

  def end(self, session):
    self.close()

  def close(self):
    if self._file is not None:
      self._file.close()
      self._file = None
