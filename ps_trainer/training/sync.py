"""Synchronous replicas, and the clean end of a synchronous run.

A synchronous replica's train op ends by taking a token from its queue, which
only the chief's sync thread fills, after it has aggregated
`replicas_to_aggregate` gradients (sync_replicas.py). Two things then hang in
plain TF1:
  * a worker still inside its last step when the chief stops waits for a
    token forever;
  * the chief's sync thread sits in the accumulators' take_grad for a step that
    never comes, and MonitoredSession.close() waits out a 120 s grace period.
With backup workers, one more: a replica whose step began two global steps
before the last one gets a token of the last one, yet TF's StopAtStepHook
(global step read at the start + 1) lets it start another step. That step's
gradient waits for a partner that has gone home. Seen in CI: 1 PS + 3
workers, 2 per step; the chief waited out --wait_timeout_secs. And a stop
(SIGTERM, Ctrl-C) has one of its own: each task stops after its current
step, but the signal reaches the tasks one by one, so a worker can end after
step k while the chief has begun step k+1, which needs that worker's
gradient; the chief waited out its grace period (20 s) and ended with a
last-resort checkpoint (reproduced; likely the CI stop that took 30.5 s).
`SyncReplicasHook` replaces the optimizer's own hook to fix all four: the
sync thread counts the steps it applies and, at the last one, hands every
replica a token and ends (no step past --train_steps is aggregated, and the
chief stops right after its current step); a stopping chief whose step is
still blocked a second later hands itself a token; at the end the
chief hands out tokens until every worker has said it is done; and the sync
thread runs in a session of its own that the chief closes, cancelling the
blocked take_grad.

The chief's end, its final checkpoint and the release of the other workers,
is in sync_end.py.
"""

import math
import threading
import time
from typing import Callable, Optional

import tensorflow as tf

from ps_trainer.cluster import waits
from ps_trainer.console import errors
from ps_trainer.console import process_end
from ps_trainer.faults import sync_end


class SyncReplicasHook(tf.compat.v1.train.SessionRunHook):
  """Runs the sync optimizer's per-session set-up, and ends a sync run cleanly.

  Args:
    sync_optimizer: the wrapped optimizer, after apply_gradients().
    is_chief: whether this replica runs the sync thread.
    num_workers: training replicas; the chief releases them at the end.
    session_factory: () -> a new tf Session on the same target and graph,
      for the chief's sync thread; None in local mode, where a second
      session would not share the queues (the thread then uses the hook's).
    workers_done: (session) -> how many other replicas have said they are
      done; None when there are no other replicas.
    drain_timeout_secs: bound on the chief's wait for the other replicas.
    stop: the task's StopRequest: a stopping chief waits for the others
      only `stopping_drain_secs`, a bounded part of its grace period, and a
      step of its own only `stopping_step_secs`.
    others_gone: () -> True when none of the other replicas answers (they
      crashed: they will never say done); None when their addresses are
      unknown.
    restarted: () -> True when this chief's session resumed a run whose
      sync state lives on (resume.ChiefStart.resumed_mid_run): a restarted
      chief, or one that restored a lost PS. The other workers may then be
      blocked on their token queues with gradients nobody will aggregate; the
      chief hands each a token instead of starting with none.
    last_step: the global step at which the run ends (--train_steps); the
      chief's sync thread applies none past it. None: no end.
    boundary_secs: how long the chief's end lets an aggregation in progress
      finish before it cancels the sync thread (final_checkpoint_guard).
    ready_timeout_secs: how long a session's start waits for the chief to
      initialize the model (--wait_timeout_secs).
  """

  def __init__(self, sync_optimizer, is_chief: bool, num_workers: int,
               session_factory: Callable[[], tf.compat.v1.Session],
               workers_done: Optional[Callable] = None,
               drain_timeout_secs: float = 120.0, stop=None,
               stopping_drain_secs: float = 8.0,
               stopping_step_secs: float = 1.0,
               others_gone: Optional[Callable[[], bool]] = None,
               restarted: Optional[Callable[[], bool]] = None,
               last_step: Optional[int] = None,
               boundary_secs: float = 0.25,
               ready_timeout_secs: float = 300.0):
    self._opt = sync_optimizer
    self._ready_timeout_secs = ready_timeout_secs
    self._is_chief = is_chief
    self._num_workers = num_workers
    self._session_factory = session_factory
    self._workers_done = workers_done
    self._drain_timeout_secs = drain_timeout_secs
    self._stop = stop
    self._stopping_drain_secs = stopping_drain_secs
    self._stopping_step_secs = stopping_step_secs
    self._others_gone = others_gone
    self._restarted = restarted
    self._last_step = last_step
    self._boundary_secs = boundary_secs
    self._thread = None
    self._sync_session = None
    self._stopping = threading.Event()
    self._last_step_applied = threading.Event()
    self._step_started = None  # When the chief's step in flight began.
    self._ended = threading.Event()
    self._stop_watch = None

  def begin(self):
    if self._is_chief:
      self._local_init_op = self._opt.chief_init_op
      # One token per replica: enough to release every worker blocked in its
      # last step, whatever step it was on.
      self._release_op = self._opt.release_op
      self._release_others_op = self._opt.release_others_op
      self._release_own_op = self._opt.release_own_op
      self._sync_op = self._opt.sync_op
      self._global_step = tf.compat.v1.train.get_global_step()
    else:
      self._local_init_op = self._opt.local_step_init_op
    self._ready_op = self._opt.ready_for_local_init_op

  def after_create_session(self, session, coord):
    waits.wait_until(waits.all_initialized(session, self._ready_op),
                     "the chief to initialize the model",
                     timeout_secs=self._ready_timeout_secs,
                     stop=self._stop)
    session.run(self._local_init_op)
    self._step_started = None  # A step of a session that failed is over.
    if self._is_chief:
      self._stop_sync_thread()  # A recreated session (recovery) restarts it.
      # A resumed run: the other workers may be blocked in a step, and a
      # token each lets them out (none for the chief: no step of this
      # session is blocked yet, and its first would return for nothing).
      # Otherwise no tokens: every replica's first gradient waits for the
      # first aggregated step, so the chief cannot run ahead.
      if self._restarted is not None and self._restarted():
        session.run(self._release_others_op)
      self._start_sync_thread(session, coord)
      if (self._stop_watch is None and self._stop is not None
          and self._session_factory is not None and self._num_workers > 1):
        self._stop_watch = threading.Thread(
            target=self._end_own_step_when_stopping,
            name="ps_trainer_sync_stop", daemon=True)
        self._stop_watch.start()

  def final_checkpoint_guard(self) -> sync_end.FinalCheckpointGuard:
    """A hook whose end() stops the aggregation: place it before the saver."""
    return sync_end.FinalCheckpointGuard(self)

  def stop_aggregating(self):
    """Stops the sync thread between two aggregations (sync_end.py's docstring).

    The thread checks for a stop between its sync ops; one in progress (its
    gradients arrive within a millisecond of each other) ends by itself
    within `boundary_secs`. One still waiting then is blocked in take_grad
    for gradients that have not come, and closing its session cancels it
    before any apply. Only a gradient arriving in the instant of the cancel
    could still be half applied. Local mode has no other replica, so no
    aggregation can come.
    """
    self._stop_sync_thread(finish_within_secs=self._boundary_secs)

  def _start_sync_thread(self, session, coord):
    self._stopping.clear()
    self._sync_session = (self._session_factory() if self._session_factory
                          else None)
    self._thread = threading.Thread(
        target=self._sync_loop_thread,
        args=(self._sync_session or session, coord),
        name="ps_trainer_sync", daemon=True)
    self._thread.start()

  def _sync_loop_thread(self, session, coord):
    with process_end.tf_work():
      self._sync_loop(session, coord)

  def _sync_loop(self, session, coord):
    try:
      # Only this thread moves the global step in a sync run, one step per
      # sync op: counting costs no read of the PS per step.
      applied = int(session.run(self._global_step))
      last_step = math.inf if self._last_step is None else self._last_step
      while not self._stopping.is_set():
        if applied >= last_step:
          self._end_at_last_step(session)
          return
        session.run(self._sync_op)
        applied += 1
    except Exception as e:  # pylint: disable=broad-except
      if not self._stopping.is_set():
        # The session is lost (a PS went away): "lost the session" follows.
        errors.say("chief: the aggregation of sync steps stopped: "
                   + errors.first_line(str(e)))
        try:
          coord.request_stop(e)
        except Exception:  # pylint: disable=broad-except
          pass  # Already joined: the session is being recovered anyway.
        sync_end.give_tokens(session, self._release_op)

  def _end_at_last_step(self, session):
    """The last step is applied: a token for every replica's current step.

    With the tokens of the last aggregation, that covers each replica's
    step in flight and the one more a replica may start (see the module
    docstring); the chief's own hook stops it after its current step. The
    flag goes first: a chief step that took these tokens along with the last
    step's must already see it, or it would start another step that no
    token will ever end.
    """
    self._last_step_applied.set()
    session.run(self._release_op)

  def before_run(self, run_context):
    self._step_started = time.monotonic()

  def after_run(self, run_context, run_values):
    self._step_started = None
    if self._last_step_applied.is_set():
      run_context.request_stop()

  def _end_own_step_when_stopping(self):
    """A stopping chief's step must not wait for workers that stopped first.

    Once a stop is requested, the chief's step in flight gets
    `stopping_step_secs` to end as usual; if it is still blocked, the chief
    hands itself a token, and the step returns. Only itself: a token to a
    worker still in its step would end that step early and drop its next
    gradient. The chief's gradient stays in the accumulators, where a
    backup's may still complete a step with it. Reading the in-flight time
    from another thread is racy by a step at most, and a spare token during
    a stop is harmless: the replica stops after that step anyway.

    Runs until the hook ends. MonitoredSession skips end() when the session
    closes on an error, and this daemon thread then polls (five times a
    second, nothing else) until the process exits, as it soon does.
    """
    stop_seen = None
    told = False
    while not self._ended.wait(0.2):
      if not self._stop.requested:
        continue
      stop_seen = stop_seen or time.monotonic()
      blocked_since = self._step_started
      if (blocked_since is None or time.monotonic() - max(
          stop_seen, blocked_since) < self._stopping_step_secs):
        continue
      if not told:
        errors.say(f"{self._stop.who}: stopping, but this step still waits for "
                   "other workers' gradients; ending it without them")
        told = True
      if self._release_in_own_session(self._release_own_op):
        return

  def _release_in_own_session(self, release_op) -> bool:
    """Runs `release_op` in a session of this thread's own; True if it ran."""
    with process_end.tf_work():
      try:
        session = self._session_factory()
      except Exception:  # pylint: disable=broad-except
        return False
      try:
        return sync_end.give_tokens(session, release_op)
      finally:
        session.close()
        del session  # Deleted inside tf_work(), not at the function's end.

  def close(self):
    """After the session loop, however it ended: TF skips end() when the
    session closes on an error, which would leave the sync thread blocked in
    its own session, inside process_end.tf_work(), until the process ends."""
    self._ended.set()
    self._stop_sync_thread()

  def end(self, session):
    self._ended.set()
    if self._stop_watch is not None:
      # It wakes within 0.2 s; a release in flight is bounded here.
      self._stop_watch.join(timeout=10)
    if self._is_chief:
      # Aggregation first (FinalCheckpointGuard has done it already when
      # present): a worker released from its step sends another gradient
      # for the same global step, and a running sync thread would make
      # steps of those alone.
      self._stop_sync_thread()
      self._release_workers(session)

  def _release_workers(self, session):
    if self._workers_done is None:
      return
    stopping = self._stop is not None and self._stop.requested
    bound = self._stopping_drain_secs if stopping else self._drain_timeout_secs
    # A stop that came in the run's last step ends the run all the same.
    sync_end.release_workers(
        session, self._release_op, self._num_workers - 1, self._workers_done,
        self._others_gone, bound,
        stopping=stopping and not self._last_step_applied.is_set())

  def _stop_sync_thread(self, finish_within_secs: float = 0.0):
    """Ends the sync thread, after letting a sync op in progress finish
    for up to `finish_within_secs` (the thread checks between ops)."""
    if self._thread is None:
      return
    self._stopping.set()
    if self._sync_session is None:
      # Local mode: MonitoredSession's close of the shared session cancels
      # the thread's blocked run; it is a daemon, nothing waits for it.
      self._thread = None
      return
    self._thread.join(timeout=finish_within_secs)
    # Closing the sync thread's own session cancels its blocked take_grad.
    self._sync_session.close()
    self._thread.join(timeout=30)
    if self._thread.is_alive():
      errors.warn("the chief's aggregation of sync steps did not stop within "
                  "30 s")
    self._thread = None
