"""Short runs on a PS from a sync replica's stall watch: bounded, one at a time.

The watch reads and writes small variables on the PS tasks (the hang vote's
flags: hang_vote.py; the global step: hung_step.py) while its own step may be
hung. TF creates a session without any bound when a task it needs does not
answer, and the watch must never block on one: so each run is on a thread of
its own, waited for a bound, and while one such run waits no other starts.
A failed run answers None; the watch looks again later, and
--wait_timeout_secs still bounds the step.
"""

import threading
from typing import Callable, Optional

import tensorflow as tf

from ps_trainer.cluster import ps_flags
from ps_trainer.cluster import waits
from ps_trainer.console import errors
from ps_trainer.console import process_end
from ps_trainer.settings import cluster as cluster_lib


class PsRuns:
  """One replica's bounded runs on the PS tasks.

  Args:
    target: this task's server target.
    info: this task's ClusterInfo.
    timeout_secs: the bound on each run.
  """

  def __init__(self, target: str, info: cluster_lib.ClusterInfo,
               timeout_secs: float = 10.0):
    self._target = target
    self._info = info
    self._timeout = timeout_secs
    self._running = None  # The thread of the last run.

  def run(self, ps_index: int, build: Callable, what: str):
    """build()'s fetch, run on PS `ps_index`; None when it failed, with a
    warning that this replica could not `what` ("read the global step", say),
    and without one when an earlier run still waits (its warning was said)
    or that PS does not accept connections (the step's notes name it)."""
    if self._running is not None and self._running.is_alive():
      return None  # Its warning was said.
    if not waits.reachable(self._info.jobs["ps"][ps_index], timeout_secs=1.0):
      return None  # The step's notes name it.
    outcome = {}

    def attempt():
      with process_end.tf_work():  # Its session is made and deleted here.
        try:
          outcome["value"] = ps_flags.run_on_ps(
              self._target, self._info, [ps_index], self._timeout, build)
        except tf.errors.OpError as e:
          outcome["error"] = errors.first_line(e.message)
        except Exception as e:  # pylint: disable=broad-except
          # Not TF's: a failed run must still leave the watch to its bound.
          outcome["error"] = (f"{type(e).__name__}: "
                              f"{errors.first_line(str(e))}")

    self._running = threading.Thread(target=attempt, name="ps_trainer_ps_run",
                                     daemon=True)
    self._running.start()
    self._running.join(self._timeout)
    if "value" in outcome:
      return outcome["value"]
    failure = outcome.get("error", f"no answer within {self._timeout:.0f} s")
    who = self._info.replica_name(self._info.replica_index)
    errors.warn(f"{who}: could not {what} on ps {ps_index}: {failure}")
    return None


def global_step_reader(runs: PsRuns, device: str
                       ) -> Callable[[], Optional[int]]:
  """() -> the global step now, read on its PS through `runs`; None when
  that failed. `device` is where the training graph placed it, e.g.
  "/job:ps/task:1"."""
  ps_index = tf.DeviceSpec.from_string(device).task or 0

  def build():
    with tf.device(device):
      # Made as the training graph makes it, so the same variable on the PS.
      return tf.compat.v1.train.get_or_create_global_step().read_value()

  def read() -> Optional[int]:
    value = runs.run(ps_index, build, "read the global step")
    return None if value is None else int(value)

  return read
