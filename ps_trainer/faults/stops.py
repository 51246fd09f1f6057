"""Ending a task on purpose: signals, steps that never finish, last resorts.

SIGINT and SIGTERM request a stop: the session loop ends after the current
step, the chief writes its final checkpoint, every replica tells the PS tasks
it is done. A task can be blocked inside TensorFlow when the signal arrives
(a sync step waiting for a worker that died), where no Python code of the
main thread runs; so the signals are received by a thread of their own
(sigwait), which can still end the task if the clean stop does not come in
time, after the last resorts (the chief's emergency checkpoint) had their
chance. A task whose step is stuck inside TensorFlow while its peers answer
starts itself again instead (`restart`). No TensorFlow here: main.py installs
this before TF loads; the hooks that consult it are in hooks.py.
"""

import os
import signal
import sys
import threading
import time
from typing import Callable, List

from ps_trainer.console import errors
from ps_trainer.console import process_end

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long a requested stop may take before the task exits anyway.
GRACE_SECS = 20.0
# All last resorts together: after the grace, a forced exit ends within
# GRACE_SECS + this (30 s).
_LAST_RESORT_SECS = 10.0
# A PS's grace. A chief whose step cannot end (TF's repeat hang) writes its
# last checkpoint as its forced exit's last resort, through the PS tasks: when
# the whole job is stopped, a PS that left after GRACE_SECS too took it away
# (seen 2026-11-26). So a PS outlasts a forced exit; it leaves as soon as no
# worker answers, which after a clean stop is within seconds. A launcher's
# SIGKILL comes after this (launch.sh, deploy/kubernetes/tfjob.yaml).
PS_GRACE_SECS = GRACE_SECS + _LAST_RESORT_SECS + 5.0
# How long a supervisor waits after its SIGTERM before it sends SIGKILL:
# past a PS's grace. launch.sh (STOP_GRACE_SECS), the bench's runs and
# deploy/kubernetes/tfjob.yaml (terminationGracePeriodSeconds) all wait this
# long; bash and YAML cannot import it, so tests/test_launch.py holds them
# equal.
SUPERVISOR_KILL_SECS = 40.0

# Ctrl-C in a terminal reaches a local cluster's tasks twice: from the terminal
# (its process group) and from launch.sh, which passes its signals on. The same
# signal again this soon after the first is that one, and goes unsaid.
SAME_SIGNAL_SECS = 2.0

# How many times in a row a task may start itself again (StopRequest.restart),
# counted across the restarts in this environment variable. In a row: once a
# restarted task has trained for a while, its restarts are forgotten
# (forget_restarts), so a long run can get past a rare hang many times.
MAX_RESTARTS = 3
RESTARTS_ENV = "PS_TRAINER_RESTARTS"


class StopRequest:
  """Whether this task was asked to stop, and the means to end it for sure:
  a forced exit once its last resorts had their chance, or a start of itself
  again (`restart`, at most MAX_RESTARTS in a row). Both hold one lock, so
  two threads never end the task two ways at once.

  Args:
    who: names the task in messages, e.g. "worker 1".
    how: what a stop means for this task, for the message.
    grace_secs: how long a requested stop may take before the task exits
      anyway.
  """

  def __init__(self, who: str, how: str = "stopping after the current step",
               grace_secs: float = GRACE_SECS):
    self.who = who
    self._how = how
    self.grace_secs = grace_secs
    self.signum = None
    self._event = threading.Event()
    self._lock = threading.Lock()
    self._deadline_at = None  # While a requested stop is being carried out.
    self._disarm = None  # Set: that stop's deadline forces nothing.
    self._then = None  # What the task does once its stop was carried out.
    # Set from restart()'s last look at `requested` to its execv: a signal
    # then is left pending for the program execv starts.
    self._handing_over = False
    self._watcher = None  # The thread that receives the signals (install).
    self._last_resorts: List[tuple] = []  # (action, what, before_restart)
    # Reentrant: a restart asked to stop meanwhile exits through force_exit.
    self._exiting = threading.RLock()

  @property
  def requested(self) -> bool:
    return self._event.is_set()

  @property
  def signal_name(self) -> str:
    return signal.Signals(self.signum).name if self.signum else "a request"

  def exit_status(self) -> int:
    """128 + the signal number, as a shell reports a task ended by a signal."""
    return 128 + (self.signum or signal.SIGTERM)

  def install(self) -> None:
    """Receives SIGINT and SIGTERM from now on (call before TF starts threads).

    Blocking the signals here makes every thread started later inherit the
    block, so only the watcher thread sees them, whatever the main thread is
    doing inside TensorFlow.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    self._watch_signals()

  def _watch_signals(self) -> None:
    self._watcher = threading.Thread(target=self._watch,
                                     name="ps_trainer_signals", daemon=True)
    self._watcher.start()

  def add_last_resort(self, action: Callable[[], None], what: str,
                      before_restart: bool = True) -> None:
    """`action` runs (bounded) before a forced exit, and before a restart
    unless `before_restart` is False; `what` names it."""
    self._last_resorts.append((action, what, before_restart))

  def request(self, signum: int) -> None:
    """What a received signal does (public for tests).

    A repeated signal does not cut the stop short: Ctrl-C reaches every task
    of a terminal's process group and launchers follow up with SIGTERM; a PS
    that left early would cost the chief its final checkpoint. The grace
    period bounds the stop anyway. It is said, unless it is the first signal
    again within SAME_SIGNAL_SECS. After `ended`, a signal gives what the
    task still does its own grace period.
    """
    name = signal.Signals(signum).name
    with self._lock:
      if self._handing_over:
        # Sent again, it stays pending (every thread blocks it) through
        # execv, and the new program's watcher receives it.
        os.kill(os.getpid(), signum)
        return
      if self._deadline_at is not None:
        left = max(0, self._deadline_at - time.monotonic())
        if (signum == self.signum and
            self.grace_secs - left < SAME_SIGNAL_SECS):
          return  # The first one, passed on by a launcher.
        errors.say(f"{self.who}: got {name}: already stopping (at most "
                   f"{left:.0f} s more)")
        return
      self.signum = signum
      self._deadline_at = time.monotonic() + self.grace_secs
      if self._then is None:
        errors.say(f"{self.who}: got {name}: {self._how} (at most "
                   f"{self.grace_secs:.0f} s)")
        reason = (f"still not stopped {self.grace_secs:.0f} s after {name} "
                  "(blocked waiting for another task)")
      else:
        errors.say(f"{self.who}: got {name} while {self._then}: exiting in "
                   f"at most {self.grace_secs:.0f} s")
        reason = (f"still {self._then} {self.grace_secs:.0f} s after {name}")
      self._disarm = threading.Event()
      self._event.set()
      threading.Thread(target=self._deadline, args=(self._disarm, reason),
                       name="ps_trainer_stop_deadline", daemon=True).start()

  def _watch(self) -> None:
    while not self._handing_over:  # Then a signal is left for execv's program.
      self.request(signal.sigwait(STOP_SIGNALS))

  def finishing(self, then: str) -> None:
    """From now on the task only does `then` (its run is finished), which a
    signal's message names; unlike ended(), what a stop already requested
    owes and its deadline stay: the task has not yet told the PS tasks it is
    done."""
    with self._lock:
      self._then = then

  def ended(self, then: str = "ending") -> None:
    """The stop, if one was requested, has been carried out: the task is no
    longer blocked on another one and only does `then` (e.g. "exporting the
    finished run") before it exits. A stop requested earlier forces no exit
    any more; a signal from now on gives `then` the grace period. The last
    resorts are dropped: what they would save or say has been."""
    with self._lock:
      self._then = then
      self._last_resorts.clear()
      self._deadline_at = None
      if self._disarm is not None:
        self._disarm.set()

  def _deadline(self, disarm: threading.Event, reason: str) -> None:
    if disarm.wait(self.grace_secs):
      return
    self.force_exit(reason, self.exit_status())

  def force_exit(self, reason: str, status: int,
                 resorts: Callable[[bool], bool] = lambda _: True) -> None:
    """Runs the last resorts (those `resorts(before_restart)` picks), then
    ends the process at once with `status`."""
    with self._exiting:  # One forced exit, even if two threads get here.
      errors.say(f"{self.who}: {reason}; exiting now with status {status}")
      self._run_last_resorts(resorts)
      os._exit(status)  # pylint: disable=protected-access

  def restarts_left(self) -> int:
    try:
      done = int(os.environ.get(RESTARTS_ENV, "0") or 0)
    except ValueError:  # Not ours to read: no restart counted.
      done = 0
    return max(0, MAX_RESTARTS - done)

  def forget_restarts(self) -> None:
    """The restarts so far led back to training: none counts against the
    next one."""
    os.environ.pop(RESTARTS_ENV, None)

  def restart(self, reason: str, execv=os.execv) -> None:
    """Runs the last resorts that keep progress, then starts this program
    again in this process, with the same command line (os.execv).

    For a step stuck inside TensorFlow, which no Python code can end: the
    process stays the same (its launcher, output and id), the new program
    joins the job as a restarted task does. The caller checks
    `restarts_left()` first.
    """
    with self._exiting:
      if self.requested:  # Asked to stop while deciding: a stop, not a start.
        self.force_exit(f"{reason}, but {self.signal_name} asked this task "
                        "to stop", self.exit_status())
        return  # Only where force_exit is replaced (tests).
      count = MAX_RESTARTS - self.restarts_left() + 1
      errors.say(f"{self.who}: {reason}; starting this task again with the "
                 f"same command (restart {count} of at most {MAX_RESTARTS})")
      self._run_last_resorts(lambda before_restart: before_restart)
      with self._lock:  # A signal from now on is the new program's.
        stopping = self.requested
        self._handing_over = not stopping
      if stopping:  # Asked during those: the rest, not them again.
        self.force_exit(f"{self.signal_name} asked this task to stop while "
                        "it was starting again", self.exit_status(),
                        resorts=lambda before_restart: not before_restart)
        return
      os.environ[RESTARTS_ENV] = str(count)
      try:
        execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
      finally:  # Only a failed execv, or a test's stand-in, comes back.
        self._take_signals_back()

  def _take_signals_back(self) -> None:
    """This program goes on after all: signals are its own again, and one
    left pending for the new program is received now."""
    with self._lock:
      self._handing_over = False
    if self._watcher is not None:
      self._watcher.join(0.1)  # One that left a signal pending has left.
      if not self._watcher.is_alive():
        self._watch_signals()

  def _run_last_resorts(self, chosen: Callable[[bool], bool] = lambda _: True
                        ) -> None:
    """Runs those `chosen(before_restart)` picks, in order, within
    _LAST_RESORT_SECS in all, saying which one did not finish or had no
    time left (a peer that does not answer)."""
    deadline = time.monotonic() + _LAST_RESORT_SECS
    for action, what, before_restart in self._last_resorts:
      if not chosen(before_restart):
        continue
      left = deadline - time.monotonic()
      if left <= 0:
        errors.say(f"{self.who}: no time left for {what}")
        continue
      worker = threading.Thread(target=_quietly,
                                args=(action, what, self.who), daemon=True)
      worker.start()
      worker.join(left)
      if worker.is_alive():
        errors.say(f"{self.who}: {what} did not finish within {left:.1f} s")
    sys.stdout.flush()
    sys.stderr.flush()


def _quietly(action, what, who):
  try:
    # The main thread may reach the program's end meanwhile (a stop carried
    # out right at its deadline): process_end then waits for this call.
    with process_end.tf_work():
      action()
  except Exception as e:  # pylint: disable=broad-except
    detail = errors.first_line(str(e), type(e).__name__)
    errors.say(f"{who}: {what} failed: {detail}")
