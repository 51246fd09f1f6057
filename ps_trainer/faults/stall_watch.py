"""The stall watch: bounds on a training step and on a session start.

TensorFlow waits without bound, and in silence, for a peer that is gone (a
step) or that accepts connections but does not serve (creating a session).
A thread of this hook notices, names whom the task waits for, and ends the
task, or starts it again when every peer answers (stops.StopRequest).
"""

import threading
import time
from typing import Callable, Optional

import tensorflow as tf

from ps_trainer.console import errors
from ps_trainer.faults import hung_step
from ps_trainer.faults import stops


# A session start (StallWatchHook) gets this many --wait_timeout_secs. Its
# waits are bounded by one each (for the PS tasks, and for a worker the
# chief's signature, its model and, in sync mode, its readiness, the last
# three short once the first is there); TF's own creation of the session,
# and the chief's restore, by none. So is the work of the other hooks after
# a step (a checkpoint save): long for a big model, endless when the PS it
# writes from stopped serving; and so is each call at the end of the run.
START_TIMEOUTS = 4

# What a task does outside its steps, each bounded as above.
_STARTING, _AFTER_STEP, _ENDING = "starting", "after a step", "ending"
# What TF does at the end of a run, one call after another: on the chief, and
# on another worker, which neither saves nor evaluates.
_CHIEF_ENDING_CALLS = ("the final checkpoint, the test split's evaluation, "
                       "closing the session or telling the PS tasks this "
                       "worker is done")
_WORKER_ENDING_CALLS = ("closing the session or telling the PS tasks this "
                        "worker is done")


class StallWatchHook(tf.compat.v1.train.SessionRunHook):
  """Says what a long step waits for, and ends the task if it never finishes.

  A step blocks inside TensorFlow when a peer is gone: a sync step waits for
  the gradients of a worker that died, any step for a PS that stopped
  answering. TF says nothing and waits forever; this hook's thread notices,
  names the unreachable peers every `note_every_secs`, and after
  `timeout_secs` ends the task through `stop.force_exit` (so the chief's last
  resort still writes a checkpoint).

  A step can also hang inside TF while every peer answers (TF's repeat
  hang: hung_step.py). No Python code can end that step, but the task can
  start again. So when `restart_if()` says every peer answers, the task
  restarts itself (`stop.restart`) rather than exit: a few times in a row at
  most, where a restart after which the task trained for `timeout_secs` is
  forgotten (a long run meets many repeats). With `hang_restarts` (async
  replicas) or `sync_replica` (sync replicas) it does so sooner, once
  hung_step.HangRules says the step is hung; a sync worker whose step hung
  in a run that is over exits 0 instead.

  Starting a session can hang too: a peer that accepts connections but does
  not serve (stopped with SIGSTOP or Ctrl-Z, a paused VM, another program on
  its port) passes every wait for its address, and TF then creates the
  session without any bound. So from `session_starting()` (before each
  session, the first or one after a lost session; attempts that fail and are
  made again count together) to the first step, the task gets
  START_TIMEOUTS x `timeout_secs`; its own waits in that time are bounded
  each. A session start is not a step: its time never counts as one.

  The hook runs first (session.monitored_session's first_hooks), so the step
  it times is the run alone; the other hooks' work after it (a checkpoint
  save) gets START_TIMEOUTS x `timeout_secs` too, ending where `tail()`, the
  last hook, sees it end. So does each call into TF at the end of the run,
  from `end()` (or `ending()`) to `finished()`: the final checkpoint, each
  batch of the test split's evaluation, and telling the PS tasks this
  worker is done (its session creation has no bound of its own). Once a
  stop was requested, the stop's own deadline bounds these instead.

  Args:
    stop: the task's StopRequest.
    what: () -> what the step waits for, e.g. "gradients of worker 1 at
      10.0.0.3:2222 (unreachable)".
    timeout_secs: the bound on one step.
    restart_if: () -> whether the task may start again rather than exit;
      None: never.
    silent_when_named: () -> whether `what()`, when last called, found a
      peer not answering.
    hang_restarts: restart sooner for a step that looks hung (above).
    sync_replica: a hung_step.SyncReplica: restart sooner for a sync step
      that looks hung (above).
    clock: the monotonic clock of every bound (tests pass their own).
    start_peers: () -> the peers a session start needs, e.g. "ps 0 at
      10.0.0.1:2222"; None: session starts are not bounded.
    is_chief: whether the end of the run saves and evaluates too (what its
      notes name).
    silent_ps: () -> "ps 0 at 10.0.0.1:2222, ..." for the PS tasks that
      refuse connections now, "" when all answer: work after a step blocked
      on one that is gone (a checkpoint save as a PS died) is then noted
      every `note_every_secs` and gets `timeout_secs`, as a step, not the
      START_TIMEOUTS of a slow save.
  """

  def __init__(self, stop: stops.StopRequest, what: Callable[[], str],
               timeout_secs: float, note_every_secs: float = 10.0,
               poll_secs: float = 1.0,
               restart_if: Optional[Callable[[], bool]] = None,
               start_peers: Optional[Callable[[], str]] = None,
               silent_when_named: Callable[[], bool] = lambda: False,
               hang_restarts: bool = False,
               sync_replica: Optional[hung_step.SyncReplica] = None,
               is_chief: bool = True,
               silent_ps: Callable[[], str] = lambda: "",
               clock: Callable[[], float] = time.monotonic):
    self._stop = stop
    self._ending_calls = (_CHIEF_ENDING_CALLS if is_chief
                          else _WORKER_ENDING_CALLS)
    self._what = what
    self._restart_if = restart_if
    self._silent_when_named = silent_when_named
    self._rules = hung_step.HangRules(timeout_secs, hang_restarts,
                                      sync_replica, clock)
    self._clock = clock
    self._timeout = timeout_secs
    self._note_every = note_every_secs
    self._poll = poll_secs
    self._outside_steps_timeout = START_TIMEOUTS * timeout_secs
    self._start_peers = start_peers
    self._step_started = None
    # When this session's first step ended, until the restarts are forgotten.
    self._training_since = None
    self._restarts_forgotten = False
    # (_STARTING, _AFTER_STEP or _ENDING, since when), or None during a step.
    self._outside = None
    self._silent_ps = silent_ps
    # The _AFTER_STEP or _ENDING wait last noted, its next note, and the PS
    # tasks that refused connections then (looked for after a step only).
    self._noted = None
    self._done = threading.Event()
    self._thread = None

  def session_starting(self) -> None:
    """Before each session is created: a failed step's clock stops here."""
    self._step_started = None
    self._training_since = None
    self._rules.session_starting()
    if not self._outside_is(_STARTING):  # Not a failed attempt made again.
      self._outside = (_STARTING, self._clock())
    self._watch_in_background()

  def tail(self) -> tf.compat.v1.train.SessionRunHook:
    """The hook to run last: where the work after a step ends."""
    return _AfterStepEnd(self)

  def after_create_session(self, session, coord):
    self._rules.session_created()
    self._watch_in_background()

  def before_run(self, run_context):
    self._outside = None
    self._step_started = self._clock()

  def after_run(self, run_context, run_values):
    now = self._clock()
    if self._step_started is not None:
      self._rules.step_ended(now - self._step_started)
    self._step_started = None
    self._outside = (_AFTER_STEP, now)
    if self._training_since is None:
      self._training_since = now
    elif (not self._restarts_forgotten
          and now - self._training_since >= self._timeout):
      self._stop.forget_restarts()
      self._restarts_forgotten = True

  def after_step_done(self) -> None:
    self._outside = None

  def end(self, session):
    """TF's clean close: the end of the run (final checkpoint, evaluation)."""
    self.ending()

  def ending(self) -> None:
    """From here to finished(), TF gets START_TIMEOUTS x `timeout_secs` for
    each call (run_done() ends one), and for the last one, leaving."""
    self._step_started = None
    self._outside = (_ENDING, self._clock())

  def run_done(self) -> None:
    """A run of the session came back (session.monitored_session's
    on_run_done): at the end of a run, progress."""
    if self._outside_is(_ENDING):
      self._outside = (_ENDING, self._clock())

  def finished(self) -> None:
    """The task is done with TF's session and the PS tasks: the watch ends."""
    self._done.set()

  def _outside_is(self, kind: str) -> bool:
    outside = self._outside
    return outside is not None and outside[0] == kind

  def _watch_in_background(self):
    if self._thread is None:
      self._thread = threading.Thread(target=self._watch,
                                      name="ps_trainer_stall_watch",
                                      daemon=True)
      self._thread.start()

  def _watch(self):
    step = None  # The step watched: its notes and looks for a hang are its own.
    while not self._done.wait(self._poll):
      if self._gave_up_outside_steps():
        return  # Not reached: the process ends.
      self._note_outside()
      started = self._step_started
      self._rules.leave_if_owed(started)
      if started is None:
        continue
      if started != step:
        step, next_note, next_look, silent = (started, self._note_every, 0.0,
                                              False)
      waited = self._clock() - started
      if waited >= self._timeout:
        self._give_up(waited)
        return  # Not reached: the process ends or starts again.
      hang_bound = self._rules.bound()
      if ((not silent or self._rules.looks_when_silent)
          and waited >= max(hang_bound, next_look)):
        next_look = waited + self._note_every  # Peers are probed: not often.
        silent = silent or self._a_peer_silent_now()
        hung = self._why_hung(started, hang_bound, silent)
        if hung:
          if hung.leaves:
            self._leave(waited, hung.why)
          else:
            self._restart_or_exit(waited, hung.why, hung.answering)
          return  # Not reached: the process ends or starts again.
      if waited >= next_note:
        what = self._what()
        silent = silent or self._silent_when_named()
        errors.say(f"{self._stop.who}: this step has waited {waited:.0f} s for "
                   f"{what}; giving up after {self._timeout:.0f} s"
                   f"{self._sooner(hang_bound, silent)}")
        next_note += self._note_every
        if self._may_act_on(started):
          self._rules.step_noted(started)

  def _note_outside(self) -> None:
    """Every note_every_secs that the work after a step, or one call at the
    end of the run, waits; the task would otherwise say nothing meanwhile.

    At the end, after its result, TF can take many seconds to close a session
    that a paused PS once held up. After a step, the note names the PS tasks
    that refuse connections (one died during a checkpoint save), or says it
    waits for TensorFlow (a big checkpoint takes its time).
    """
    outside = self._outside
    if (outside is None or outside[0] == _STARTING
        or self._start_peers is None or self._stop.requested):
      return
    if self._noted is None or self._noted[0] != outside:
      self._noted = (outside, self._note_every, "")
    waited = self._clock() - outside[1]
    _, next_note, _ = self._noted
    if waited < next_note:
      return
    silent = ""
    if outside[0] == _ENDING:
      errors.say(f"{self._stop.who}: the end of the run has waited "
                 f"{waited:.0f} s for TensorFlow ({self._ending_calls}); "
                 f"giving up after {self._outside_steps_timeout:.0f} s")
    else:
      silent = self._silent_ps()
      if silent:
        why, limit = f"; not answering: {silent}", self._timeout
      else:
        why, limit = " for TensorFlow", self._outside_steps_timeout
      errors.say(f"{self._stop.who}: the work after a step (a checkpoint "
                 f"save?) has waited {waited:.0f} s{why}; giving up after "
                 f"{limit:.0f} s")
    self._noted = (outside, next_note + self._note_every, silent)

  def _gave_up_outside_steps(self) -> bool:
    """Ends a session start, the work after a step or a call at the end of
    the run that overran."""
    outside = self._outside
    if outside is None or self._start_peers is None or self._stop.requested:
      return False
    kind, since = outside
    waited = self._clock() - since
    limit = self._outside_steps_timeout
    silent = self._silent_after_step(outside)
    if silent:  # A PS that is gone, not one slow to save.
      limit = self._timeout
    if waited < limit:
      return False
    bound = f"(at most {limit:.0f} s, {START_TIMEOUTS} x --wait_timeout_secs)"
    peers = self._start_peers()
    not_serving = f"{peers} may not be serving (stopped, paused or wedged)"
    if silent:
      bound = f"(--wait_timeout_secs={limit:.0f})"
      not_serving = f"not answering: {silent}"
    doing = {
        _STARTING: (
            f"starting a session without reaching a step {bound}, though "
            f"the tasks it needs accepted connections ({peers}): one of them "
            "may not be serving (stopped, paused or wedged), or a restore is "
            "that slow; the newest checkpoint is kept"),
        _AFTER_STEP: (f"in the work after a step (a checkpoint save?) "
                      f"{bound}: {not_serving}"),
        _ENDING: (
            f"waiting for TensorFlow at the end of the run "
            f"({self._ending_calls}) {bound}: {not_serving}; the newest "
            "checkpoint is kept"),
    }[kind]
    self._stop.force_exit(f"gave up after {waited:.0f} s {doing}", 1)
    return True

  def _silent_after_step(self, outside) -> str:
    """The PS tasks found refusing connections at the last note on this
    work after a step (_note_outside), else ""."""
    noted = self._noted
    return noted[2] if noted is not None and noted[0] == outside else ""

  def _why_hung(self, started: float, hang_bound: float, silent: bool):
    """At a look past the hang bound: HangRules.why_hung, if this task may
    start again or leave, and is still in that step."""
    if not self._may_act_on(started):
      return None
    return self._rules.why_hung(started, hang_bound, silent,
                                lambda step: self._step_started == step,
                                may_restart=self._stop.restarts_left() > 0)

  def _sooner(self, hang_bound: float, silent: bool) -> str:
    """A note's word on the restart that may come before the timeout: a
    step stuck with every peer answering can look like a hang that never
    ends, where the task starts again at the hang bound."""
    if silent or hang_bound >= self._timeout or not self._can_restart():
      return ""
    return (f" (starting again sooner, from {hang_bound:.0f} s, if it stays "
            "stuck while every peer answers)")

  def _may_act_on(self, started: float) -> bool:
    """Whether the watch may still start this task again, or have it leave,
    for the step begun at `started`: it may restart, no stop was asked, and
    that step is still running."""
    return (self._restart_if is not None and not self._stop.requested
            and self._step_started == started)

  def _a_peer_silent_now(self) -> bool:
    """Names the peers that do not answer now (no grace): whether any."""
    self._what()
    return self._silent_when_named()

  def _can_restart(self) -> bool:
    return (self._restart_if is not None and not self._stop.requested
            and self._stop.restarts_left() > 0)

  def _give_up(self, waited: float) -> None:
    # restart_if() before what(): naming the stall also notes who is silent
    # now, which must not count as silent already when it was last named.
    if self._can_restart() and self._restart_if():
      self._restart_or_exit(waited, f"--wait_timeout_secs={self._timeout:.0f}")
      return  # Not reached: the program has started again.
    self._exit(waited)

  def _leave(self, waited: float, bound: str) -> None:
    """A worker's step hung in a run that is over: nothing is left to do but
    say it is done (a last resort). Started again, it would wait for a chief
    that has finished. (The chief starts again: its new session has nothing
    to train and writes result.json and the export.)"""
    self._stop.force_exit(f"a step waited {waited:.0f} s ({bound}): nothing "
                          "is left to train", 0)

  def _restart_or_exit(self, waited: float, bound: str,
                       answering: bool = True) -> None:
    try:
      self._stop.restart(f"a step waited {waited:.0f} s ({bound})"
                         + (" while every peer answers" if answering else ""))
    except OSError as e:  # The program could not be started again.
      self._exit(waited, f"; starting again failed: {e}")

  def _exit(self, waited: float, failed: str = "") -> None:
    self._stop.force_exit(
        f"gave up after a step waited {waited:.0f} s for {self._what()}"
        f"{failed} (--wait_timeout_secs={self._timeout:.0f}); the newest "
        "checkpoint is kept, restart the task to go on", 1)


class _AfterStepEnd(tf.compat.v1.train.SessionRunHook):
  """StallWatchHook.tail(): the last hook, so the others' work is over."""

  def __init__(self, watch: StallWatchHook):
    self._watch = watch

  def after_run(self, run_context, run_values):
    self._watch.after_step_done()
