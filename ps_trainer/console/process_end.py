"""A task's process ends without TensorFlow work on its helper threads.

Python 3.11 ends any thread that takes the GIL while the interpreter shuts
down (pthread_exit). A thread returning from a TensorFlow call then unwinds
through TensorFlow's C++ frames, and that aborts the whole process
("terminate called after throwing an instance of '' ... FATAL: exception not
rethrown", exit status -6): creating or deleting a session on a daemon thread
as the main thread exits does it every time. A finished sync worker died so
once, its run done and the PS told: its stall watch was just then clearing its
hang-vote flag on PS 0 (ps_runs.py), as every sync replica does once after
its session starts, and the rest of its run was shorter than the watch's poll.

So the helper threads that call TensorFlow do it inside `tf_work()`, and
`finish()`, at the end of the program, waits for the calls in flight (within
a bound) and keeps new ones from starting. A call still running after the
bound (a PS that stopped answering) would abort the process whenever it
returned; the process then ends at once instead, output flushed, skipping an
interpreter shutdown that has nothing left to save.
"""

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable, Iterator, Optional

FINISH_BOUND_SECS = 5.0


class HelperCalls:
  """The TensorFlow calls of a process's helper threads (one per process:
  the module's functions below; tests make their own)."""

  def __init__(self, exit_now: Optional[Callable[[int], None]] = None):
    self._exit_now = exit_now or _flushed_exit
    self._lock = threading.Condition()
    self._in_flight = {}  # {thread id: [its name, its calls in progress]}
    self._ending = False

  @contextlib.contextmanager
  def tf_work(self) -> Iterator[None]:
    """Wraps a daemon helper thread's TensorFlow calls, and the life of any
    session they make (deleting one is such a call). Once finish() has
    begun, a thread with no call in progress waits here until the process is
    gone (only a daemon thread can: the interpreter would wait for another);
    one already inside a call goes on, since finish() waits for that call."""
    thread = threading.current_thread()
    with self._lock:
      while self._ending and thread.ident not in self._in_flight:
        self._lock.wait()  # Not woken again: the process is ending.
      self._in_flight.setdefault(thread.ident, [thread.name, 0])[1] += 1
    try:
      yield
    finally:
      with self._lock:
        calls = self._in_flight[thread.ident]
        calls[1] -= 1
        if not calls[1]:
          del self._in_flight[thread.ident]
        self._lock.notify_all()

  def finish(self, code, bound_secs: float = FINISH_BOUND_SECS) -> None:
    """Call with sys.exit's `code` as the program ends: returns once no
    helper thread is in a TensorFlow call, and the interpreter may shut down;
    after `bound_secs` with one still in a call, ends the process at once with
    the status `code` gives."""
    deadline = time.monotonic() + bound_secs
    with self._lock:
      self._ending = True
      while self._in_flight and self._lock.wait(
          max(0.0, deadline - time.monotonic())):
        pass
      busy = ", ".join(sorted(name for name, _ in self._in_flight.values()))
    if not busy:
      # Sessions in reference cycles are deleted here, on this thread, not
      # by a collection some helper thread's Python code sets off later.
      gc.collect()
      return
    status = _status(code)
    sys.stderr.write(
        f"ps_trainer: a TensorFlow call on this task's helper thread ({busy}) "
        f"did not end within {bound_secs:g} s of the task's end; exiting "
        f"with status {status} without waiting for it\n")
    self._exit_now(status)


def _flushed_exit(status: int) -> None:
  """Ends the process now: what the interpreter would flush, flushed."""
  logging.shutdown()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


def _status(code) -> int:
  """The exit status sys.exit(code) gives."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  sys.stderr.write(f"{code}\n")  # As Python would print it.
  return 1


_CALLS = HelperCalls()
tf_work = _CALLS.tf_work
finish = _CALLS.finish


def run_then_finish(program: Callable[[], None]) -> None:
  """Runs `program`, which ends with sys.exit (as absl's app.run does), and
  finish()es before the interpreter shuts down, with the status Python would
  give: an exception's traceback is printed as Python prints it, status 1."""
  try:
    program()
    code = None
  except SystemExit as e:
    code = e.code
  except KeyboardInterrupt:  # Ctrl-C before stops.py receives it: a stop.
    code = 128 + signal.SIGINT
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    code = 1
  # Outside the except clauses: the exception's frames, and the sessions
  # they hold, are garbage by now, for finish()'s collection.
  finish(code)
  sys.exit(code)
