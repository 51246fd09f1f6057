"""The MonitoredSession a replica trains in.

The same hooks and session creators as MonitoredTrainingSession, with one
difference: before each session is created - the first and every one that
replaces a session lost to a PS or chief that went away - this replica waits,
saying whom it waits for, until the tasks it needs answer. TF's own creators
wait silently (for a PS) or poll every 30 s (for the chief's model).

MonitoredSession recovers only from Unavailable and Aborted errors. A step
that spans several PS tasks can instead fail with Cancelled when one of them
dies (the other partitions of the step are cancelled, and that is the status
that reaches the replica); left alone, the replica would exit while the rest
of the job carries on (a CI run: 2 PS, sync, ps 1 killed). Such a cancel is
reported as the lost peer it is, so the session is recreated as for any
other - a bounded number of times, so a step that is cancelled for another
reason still ends the run.

And an AbortedError that is not a lost peer at all: a run TF turned away
because its request ids repeat by chance (repeats.py). That run is run again
in the same session, with a line saying so, rather than a new session made.
"""

import collections
import logging
import time
from typing import Callable, Optional, Sequence

import tensorflow as tf

from ps_trainer.cluster import repeats
from ps_trainer.console import errors

train = tf.compat.v1.train


# At most this many cancelled steps within the window are taken for a lost
# peer; one more ends the run with the Cancelled error.
MAX_CANCELS_TAKEN = 3
CANCEL_WINDOW_SECS = 60.0


class CancelBudget:
  """How many cancelled steps may still be taken for a lost peer."""

  def __init__(self, limit: int = MAX_CANCELS_TAKEN,
               window_secs: float = CANCEL_WINDOW_SECS,
               clock: Callable[[], float] = time.monotonic):
    self._limit = limit
    self._window_secs = window_secs
    self._clock = clock
    self._taken = collections.deque()

  def take(self) -> bool:
    now = self._clock()
    while self._taken and now - self._taken[0] > self._window_secs:
      self._taken.popleft()
    if len(self._taken) >= self._limit:
      return False
    self._taken.append(now)
    return True


# Different fetch structures one session compiles; a hook that builds new
# fetches on every step falls back to plain runs past this.
MAX_CALLABLES = 32


def _signature(fetches):
  """A hashable key for a fetch structure whose leaves are graph elements."""
  if isinstance(fetches, dict):
    return ("d",) + tuple((id(k), _signature(v)) for k, v in fetches.items())
  if isinstance(fetches, (list, tuple)):
    return ("l",) + tuple(_signature(f) for f in fetches)
  return fetches if isinstance(fetches, str) else id(fetches)


class _Callables:
  """Runs repeated fetch structures through callables compiled once.

  MonitoredSession merges every hook's fetches into one nested dict on each
  step, and Session.run walks that structure anew each time: about a third of
  a local step of the reference MLP went there (py-spy). The hooks fetch the
  same tensors on every step, so each structure is compiled once
  (Session.make_callable) and reused. Runs with feeds go the plain way.
  """

  def __init__(self, session):
    self._session = session
    self._compiled = {}

  def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
    if feed_dict:
      return self._session.run(fetches, feed_dict=feed_dict, options=options,
                               run_metadata=run_metadata)
    key = _signature(fetches)
    compiled = self._compiled.get(key)
    if compiled is None:
      if len(self._compiled) >= MAX_CALLABLES:
        return self._session.run(fetches, options=options,
                                 run_metadata=run_metadata)
      # The structure is kept with its callable, so its ids stay unique.
      compiled = (self._session.make_callable(fetches, accept_options=True),
                  fetches)
      self._compiled[key] = compiled
    if options is not None and options.ByteSize():
      return compiled[0](options=options, run_metadata=run_metadata)
    return compiled[0]()


class _ReplicaSession(repeats.RepeatProofSession):
  """The session a replica's hooks see: compiled runs (_Callables), runs
  that TF turns away as repeats run again (repeats.py), and cancelled steps
  reported as a lost peer (UnavailableError)."""

  def __init__(self, session, budget: CancelBudget,
               stopping: Callable[[], bool],
               on_lost: Callable[[Exception], None] = lambda e: None,
               on_run_done: Callable[[], None] = lambda: None,
               on_repeat: Callable[[Exception], None] = lambda e: None):
    super().__init__(session, on_repeat)
    self._callables = _Callables(session)
    self._budget = budget
    self._stopping = stopping
    self._on_lost = on_lost
    self._on_run_done = on_run_done

  def _run_once(self, fetches, feed_dict, options, run_metadata):
    return self._callables.run(fetches, feed_dict, options, run_metadata)

  def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
    try:
      values = super().run(fetches, feed_dict, options, run_metadata)
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
      self._on_lost(e)  # MonitoredSession recovers; the new one says why.
      raise
    except tf.errors.CancelledError as e:
      if self._stopping() or not self._budget.take():
        raise
      lost = tf.errors.UnavailableError(
          e.node_def, e.op, "a step was cancelled, as happens when a PS "
          f"goes away: {errors.first_line(e.message)}")
      self._on_lost(lost)
      raise lost from e
    self._on_run_done()
    return values


class _LostSessionCloseFilter(logging.Filter):
  """Drops TF's multi-line error about closing a session lost to a PS or
  chief that went away: the replica says so in one line of its own."""

  def filter(self, record) -> bool:
    return not str(record.msg).startswith(
        "An error occurred when attempting to close the session")


_LOST_SESSION_CLOSE_FILTER = _LostSessionCloseFilter()


class _AnnouncedCreator(train.SessionCreator):
  """Runs `before()` ahead of each session; says so when a session is replaced."""

  def __init__(self, inner: train.SessionCreator, before: Callable[[], None],
               who: str, stopping: Callable[[], bool],
               on_run_done: Callable[[], None]):
    self._inner = inner
    self._before = before
    self._who = who
    self._stopping = stopping
    self._on_run_done = on_run_done
    self._cancels = CancelBudget()
    self._created = 0
    self._lost_to = None  # The error that ended the last session, if seen.

  def create_session(self):
    if self._created:
      why = ""
      if self._lost_to is not None:
        why = (f": {type(self._lost_to).__name__}: "
               f"{errors.first_line(self._lost_to.message)}")
      print(f"{self._who}: lost the session (a PS or the chief stopped "
            f"answering{why}); reconnecting", flush=True)
      self._lost_to = None
    self._before()
    session = self._inner.create_session()
    self._created += 1
    return _ReplicaSession(session, self._cancels, self._stopping,
                           on_lost=self._note_lost,
                           on_run_done=self._on_run_done,
                           on_repeat=self._say_repeat)

  def _note_lost(self, error: Exception) -> None:
    self._lost_to = error

  def _say_repeat(self, unused_error: Exception) -> None:
    errors.say(f"{self._who}: TensorFlow turned a run away as a repeat of an "
               "earlier one (its request ids repeat by chance: "
               "docs/faults-and-recovery.md); running it again")


def monitored_session(*, who: str, is_chief: bool, target: str, config,
                      scaffold: train.Scaffold, hooks: list, chief_hooks: list,
                      log_dir: Optional[str], save_checkpoint_secs,
                      save_checkpoint_steps, save_summaries_steps: int,
                      before_session: Callable[[], None],
                      first_hooks: Sequence[train.SessionRunHook] = (),
                      stopping: Callable[[], bool] = lambda: False,
                      on_run_done: Callable[[], None] = lambda: None):
  """A MonitoredSession as MonitoredTrainingSession would build it.

  The chief restores from and checkpoints into `log_dir` and writes
  summaries there; hooks run in MonitoredTrainingSession's order (chief
  hooks, summaries, checkpoints, then `hooks`), after `first_hooks`: a
  hook that times the step (the stall watch) must see it end before the
  others' after_run, a checkpoint save among them, counts as its time.
  `stopping()` is True once this task was asked to stop: a cancelled step
  is then not a lost peer. `on_run_done()` is called after each run that
  returns, the hooks' own at the end of the run included.
  """
  # Once per process: addFilter keeps one copy of a filter.
  tf.get_logger().addFilter(_LOST_SESSION_CLOSE_FILTER)
  if is_chief:
    inner = train.ChiefSessionCreator(scaffold=scaffold, master=target,
                                      config=config, checkpoint_dir=log_dir)
    all_hooks = list(first_hooks) + list(chief_hooks)
    if log_dir:
      all_hooks.append(train.SummarySaverHook(
          scaffold=scaffold, save_steps=save_summaries_steps,
          output_dir=log_dir))
      all_hooks.append(train.CheckpointSaverHook(
          log_dir, save_secs=save_checkpoint_secs,
          save_steps=save_checkpoint_steps, scaffold=scaffold))
    all_hooks.extend(hooks)
  else:
    inner = train.WorkerSessionCreator(scaffold=scaffold, master=target,
                                       config=config)
    all_hooks = list(first_hooks) + list(hooks)
  return train.MonitoredSession(
      session_creator=_AnnouncedCreator(inner, before_session, who, stopping,
                                        on_run_done),
      hooks=all_hooks, stop_grace_period_secs=10)
