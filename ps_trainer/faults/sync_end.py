"""The chief's end of a synchronous run: its final checkpoint, then the workers' release.

The final checkpoint must be the model as it ended. The checkpoint saver's end() comes before the
hooks every replica runs, the sync hook among them (session.py keeps MonitoredTrainingSession's
order), so the sync thread went on aggregating while the saver read the variables: with other
workers still training (only the chief was stopped; with backups they need no gradient of the
chief's) a step could land mid-save, leaving some variables a step ahead of the saved global step,
and steps after the checkpoint were lost. `FinalCheckpointGuard` is a hook for the chief's own
list, which ends before the saver: it stops the sync thread between two aggregations, and only
then is the checkpoint written (test_sync_end.py: 124 steps made in the half second after the
final checkpoint without it, none with it).

The workers are released after it: `release_workers` hands out tokens until every other replica
has said it is done, so none stays blocked on its token queue in its last step, as in plain TF1.
"""

import time
from typing import Callable, Optional, Protocol

import tensorflow as tf

from ps_trainer.cluster import waits
from ps_trainer.console import errors


class Aggregation(Protocol):
  """The chief's sync thread, as the guard sees it (sync.SyncReplicasHook)."""

  def stop_aggregating(self) -> None:
    ...


class FinalCheckpointGuard(tf.compat.v1.train.SessionRunHook):
  """Ends `sync_hook`'s aggregation when the session ends: place it before the saver.

  A failure here is logged, not raised: MonitoredSession would skip the hooks after this one, the
  checkpoint saver among them.
  """

  def __init__(self, sync_hook: Aggregation):
    self.sync_hook = sync_hook

  def end(self, session):
    try:
      self.sync_hook.stop_aggregating()
    except Exception as e:  # pylint: disable=broad-except
      errors.warn("could not stop the aggregation of sync steps before the final checkpoint: "
                  + errors.first_line(str(e)))


def release_workers(session, release_op, others: int, workers_done: Callable,
                    others_gone: Optional[Callable[[], bool]], bound_secs: float,
                    stopping: bool = False):
  """Runs `release_op` until `others` replicas say they are done, for up to `bound_secs`.

  Args:
    workers_done: (session) -> how many other replicas have said they are done.
    others_gone: () -> True when none of the other replicas answers: a replica that finished says
      done before it exits, so one that answers no more without saying so has crashed and never
      will. None when their addresses are unknown.
    stopping: the chief stops before the run's end. The others may be stopping too (then they
      say done), or train on and wait for the chief to be started again: not being told is
      then what is meant to happen, not a warning.
  """
  them = "it" if others == 1 else "them"
  leaving = f"stopping without {them}" if stopping else f"ending the run without {them}"
  start = time.monotonic()

  def what():
    if others == 1:
      return "the other worker to finish its last synchronous step"
    return (f"{others - workers_done(session)} of {others} other "
            "workers to finish their last synchronous step")

  def released():
    session.run(release_op)
    if workers_done(session) >= others:
      return True
    if others_gone is not None and time.monotonic() - start > 2 and others_gone():
      silent = "it does not answer" if others == 1 else "none of them answers"
      errors.say(f"chief: {what()}, but {silent}; {leaving}")
      return True
    return False

  try:
    waits.wait_until(released, what, bound_secs, poll_secs=0.2, who="chief")
  except waits.WaitTimeout as e:
    if not stopping:
      errors.warn(f"{e}; {leaving}")
    else:
      errors.say(f"chief: {e}; {leaving}: one that trains on waits for this chief to be started "
                 "again")


def give_tokens(session, release_op) -> bool:
  """Runs `release_op` within 5 s; True if it ran.

  For the steps nobody else will end: a stopping chief's own, and these. After the sync thread
  failed (a PS died), the chief's own step and the other workers' may be blocked on the token
  queue of a PS that is still up: nothing would ever end them, and the chief would not see the
  coordinator's stop request that starts its recovery (CI run: 2 PS, ps 1 killed while both
  workers waited for tokens; both gave up after --wait_timeout_secs). With a token each, the steps
  return, the chief recovers, and the workers' next steps meet the lost PS and recover too.
  """
  try:
    session.run(release_op, options=tf.compat.v1.RunOptions(timeout_in_ms=5000))
    return True
  except Exception:  # pylint: disable=broad-except
    return False  # The PS holding the queue is gone.
