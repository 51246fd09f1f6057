"""Driving a StallWatchHook by hand, as MonitoredSession would (tests of the stall watch)."""

import contextlib
import io
import time

from ps_trainer.faults import stall_watch
import stop_fakes


def wait_for(condition, secs: float = 10.0) -> None:
  """Polls `condition` until it holds or `secs` pass (the watch runs on its own thread)."""
  deadline = time.monotonic() + secs
  while not condition() and time.monotonic() < deadline:
    time.sleep(0.01)


def whole_step(hook) -> None:
  """One step that returns, as MonitoredSession runs the watch: first before it and after it,
  then its tail after the other hooks."""
  hook.before_run(None)
  hook.after_run(None, None)
  hook.tail().after_run(None, None)


def stuck_step(stop: stop_fakes.RestartingStop, what, restart_if,
               timeout_secs: float = 15) -> None:
  """Runs a step that never returns until a StallWatchHook (0.3 s bound) gives up on it."""
  hook = stall_watch.StallWatchHook(stop, what, timeout_secs=0.3, note_every_secs=60,
                                    poll_secs=0.05, restart_if=restart_if)
  with contextlib.redirect_stdout(io.StringIO()):
    hook.after_create_session(None, None)
    hook.before_run(None)
    wait_for(lambda: stop.forced or stop.restarts, secs=timeout_secs)
    hook.finished()
