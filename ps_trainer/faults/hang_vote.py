"""Sync replicas agree that TF's repeat hang stalls them all.

A step of one replica can hang inside TF while every peer answers (TF's
repeat hang: hung_step.py). An async replica then starts itself again once
its step is past the hang bound. A sync replica cannot tell that alone: its
step also waits, legitimately, for the other replicas' gradients, so one
replica's hung step stalls every replica, and so does a chief writing a
checkpoint or a worker starting again.

What tells them apart: in the long legitimate waits we know of, some
replica is not in a step (the chief saving, a worker starting), while a hang
leaves every replica in one. So each replica whose step is past the bound,
with every peer answering, sets its flag on PS 0 (ps_flags.hang_flags); one
that then finds every flag set starts again, and clears the flags and moves
the count of agreed restarts on, so that the others start again too: the
hung one is among them, and no one can tell which it is. A replica whose
step ends clears its flag, and so does each new session of a replica (one
stopped while its flag was set), trying again until that works: a flag left
set could complete a vote in a legitimate wait.

With backup workers no vote completes, and the global step tells instead
(hung_step.py). Every run on PS 0 goes through ps_runs.PsRuns, bounded.
"""

from typing import Optional

import tensorflow as tf

from ps_trainer.cluster import ps_flags
from ps_trainer.faults import ps_runs
from ps_trainer.settings import cluster as cluster_lib


class HangVote:
  """One sync replica's part in the vote, run from its stall watch's thread.

  Args:
    runs: this replica's bounded runs on the PS tasks (shared with its other
      reads there, so that one waiting run holds up the rest).
    info: this task's ClusterInfo.
  """

  def __init__(self, runs: ps_runs.PsRuns, info: cluster_lib.ClusterInfo):
    self._runs = runs
    self._index = info.replica_index
    self._count = info.num_workers
    # The count of agreed restarts when this replica set its flag.
    self._restarts_at_join = None

  def verdict(self, may_decide: bool, may_begin: bool = True
              ) -> Optional[str]:
    """Sets this replica's flag (its step looks hung) if it is not set yet;
    returns why this replica starts again now, or None: it waits on.

    `may_decide`: whether every peer answers now, without which this
    replica may follow an agreement but not make one. `may_begin`: whether
    it may set the first flag; one in its session's first steps, which can
    be slow, only joins a vote that another replica began (one that started
    again in the middle of a hang, say).
    """
    if self._restarts_at_join is None and not self._join(may_begin):
      return None
    flags = self._run(lambda f: f.read_value())
    if flags is None:
      return None
    # Moved on, not merely changed: a PS 0 started again counts from 0.
    if flags[self._count] > self._restarts_at_join:
      return "another replica found every replica's step stuck as long"
    if not (may_decide and all(flags[:self._count])):
      return None
    moved = [0] * self._count + [int(flags[self._count]) + 1]
    if self._run(lambda f: f.assign(moved)) is None:
      return None
    return f"so were the steps of all {self._count} replicas"

  def leave(self) -> bool:
    """Clears this replica's flag (its step ended, or a session starts);
    whether it is clear now. A flag left set could complete a vote in a
    rightful wait, so the caller tries again until it is.

    It reads first and writes only a flag that is set: a write to PS 0 at
    each session start is what ps_flags.clear_done keeps to the case that
    needs it.
    """
    self._restarts_at_join = None
    flags = self._run(lambda f: f.read_value())
    if flags is None:
      return False
    return not flags[self._index] or self._run(
        lambda f: tf.compat.v1.scatter_update(f, [self._index], [0])) is not None

  def _join(self, may_begin: bool) -> bool:
    """Sets this replica's flag; whether it did."""
    # The count first: a replica that sees this flag set and moves the count
    # on does so after this read, so this replica sees the count move.
    flags = self._run(lambda f: f.read_value())
    if flags is None or not (may_begin or any(flags[:self._count])):
      return False
    if self._run(lambda f: tf.compat.v1.scatter_update(
        f, [self._index], [1])) is None:
      return False
    self._restarts_at_join = int(flags[self._count])
    return True

  def _run(self, make_fetch):
    """make_fetch(PS 0's hang flags), run; None when the run failed, which
    leaves the vote undecided until the next look."""
    return self._runs.run(
        0, lambda: make_fetch(ps_flags.hang_flags(self._count)),
        "take part in the vote on a hung sync step")
