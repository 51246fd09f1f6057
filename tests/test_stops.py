"""Stop requests and restarts (no servers; waits that end on a stop: test_waits.py).

The stall watch that decides on restarts is tested in test_stall_watch.py, test_hang_watch.py
and test_stall_watch_outside_steps.py.
"""

import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from unittest import mock

from absl.testing import absltest

from ps_trainer.faults import stops
import stop_fakes


class _Exited(Exception):
  """Raised by a patched os._exit: the forced exit got that far."""


class StopRequestTest(absltest.TestCase):

  def request(self, stop, signum):
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      stop.request(signum)
    self.addCleanup(stop.ended)
    return output.getvalue()

  def test_a_signal_requests_a_stop_and_says_so(self):
    stop = stops.StopRequest("chief", "stopping after the current step")
    self.assertFalse(stop.requested)
    said = self.request(stop, signal.SIGTERM)
    self.assertTrue(stop.requested)
    self.assertEqual(stop.signal_name, "SIGTERM")
    self.assertEqual(stop.exit_status(), 143)
    self.assertEqual(said, "chief: got SIGTERM: stopping after the current step "
                     "(at most 20 s)\n")

  def test_a_second_signal_is_the_same_request(self):
    # Ctrl-C reaches every task, then launch.sh sends SIGTERM: the first stands.
    stop = stops.StopRequest("ps 0", "stopping once the workers are done")
    self.request(stop, signal.SIGINT)
    said = self.request(stop, signal.SIGTERM)
    self.assertRegex(said, r"^ps 0: got SIGTERM: already stopping \(at most 20 s more\)\n$")
    self.assertEqual(stop.signal_name, "SIGINT")
    self.assertEqual(stop.exit_status(), 130)

  def test_the_same_signal_again_at_once_goes_unsaid(self):
    # One Ctrl-C: from the terminal, then passed on by launch.sh.
    stop = stops.StopRequest("chief")
    self.request(stop, signal.SIGINT)
    self.assertEqual(self.request(stop, signal.SIGINT), "")
    with mock.patch.object(stops, "SAME_SIGNAL_SECS", 0.0):  # Pressed again, later.
      said = self.request(stop, signal.SIGINT)
    self.assertRegex(said, r"^chief: got SIGINT: already stopping \(at most 20 s more\)\n$")
    self.assertEqual(stop.exit_status(), 130)

  def test_a_stop_that_takes_too_long_is_forced_after_the_grace_period(self):
    stop = stop_fakes.RecordingStop("worker 1", grace_secs=0.2)
    with contextlib.redirect_stdout(io.StringIO()):
      stop.request(signal.SIGINT)
      deadline = time.monotonic() + 10
      while not stop.forced and time.monotonic() < deadline:
        time.sleep(0.05)
    self.assertEqual(stop.forced, [(
        "still not stopped 0 s after SIGINT (blocked waiting for another task)", 130)])

  def test_a_task_that_ended_is_not_forced(self):
    stop = stop_fakes.RecordingStop("worker 1", grace_secs=0.2)
    with contextlib.redirect_stdout(io.StringIO()):
      stop.request(signal.SIGINT)
    stop.ended()
    time.sleep(0.5)
    self.assertEqual(stop.forced, [])

  def test_after_its_stop_a_task_exports_unhurried_and_a_new_signal_bounds_the_export(self):
    # Ctrl-C in a run's last step: the run finishes, and its export may take
    # longer than the grace period the signal started.
    stop = stop_fakes.RecordingStop("chief", grace_secs=0.3)
    stop.add_last_resort(lambda: None, "a last checkpoint")
    with contextlib.redirect_stdout(io.StringIO()):
      stop.request(signal.SIGINT)
    stop.ended("exporting the finished run")
    time.sleep(0.6)
    self.assertEqual(stop.forced, [])
    self.assertEqual(stop._last_resorts, [])  # Its checkpoint is written by now.
    said = self.request(stop, signal.SIGTERM)
    self.assertEqual(said, "chief: got SIGTERM while exporting the finished run: "
                     "exiting in at most 0 s\n")
    deadline = time.monotonic() + 10
    while not stop.forced and time.monotonic() < deadline:
      time.sleep(0.05)
    self.assertEqual(stop.forced, [
        ("still exporting the finished run 0 s after SIGTERM", 143)])


  def test_a_finished_run_still_owes_its_last_resorts_and_a_pending_stops_bound(self):
    # result.json is written; the session's close and the done flags are still to come.
    stop = stop_fakes.RecordingStop("chief", grace_secs=0.3)
    stop.add_last_resort(lambda: None, "telling the PS tasks this worker is done")
    with contextlib.redirect_stdout(io.StringIO()):
      stop.request(signal.SIGINT)  # In the run's last step.
    stop.finishing("closing the finished run's session, then exporting it")
    self.assertLen(stop._last_resorts, 1)  # pylint: disable=protected-access
    deadline = time.monotonic() + 10
    while not stop.forced and time.monotonic() < deadline:
      time.sleep(0.05)  # The close hangs: the SIGINT's grace still ends it.
    self.assertEqual(stop.forced, [
        ("still not stopped 0 s after SIGINT (blocked waiting for another task)", 130)])

  def test_a_signal_once_the_run_is_finished_names_what_it_interrupts(self):
    stop = stop_fakes.RecordingStop("chief", grace_secs=20)
    stop.finishing("closing the finished run's session, then exporting it")
    said = self.request(stop, signal.SIGINT)
    self.assertEqual(said, "chief: got SIGINT while closing the finished run's session, then "
                     "exporting it: exiting in at most 20 s\n")


class _Writes(io.StringIO):
  """A stream that keeps each write() apart."""

  def __init__(self):
    super().__init__()
    self.writes = []

  def write(self, text):
    self.writes.append(text)
    return super().write(text)


class OneWriteLinesTest(absltest.TestCase):

  def test_a_signal_notice_is_one_write_so_no_other_line_can_split_it(self):
    # print() writes a line, then its newline: a progress line printed by the main thread
    # in between read "... examples/schief: got SIGINT: ..." in a task's log.
    stop = stops.StopRequest("chief", grace_secs=600)
    self.addCleanup(stop.ended)
    stream = _Writes()
    with contextlib.redirect_stdout(stream):
      stop.request(signal.SIGINT)
    self.assertEqual(stream.writes, ["chief: got SIGINT: stopping after the current step (at "
                                     "most 600 s)\n"])


class RestartTest(absltest.TestCase):
  """A task starting itself again: what it keeps, what it says, how often."""

  def setUp(self):
    super().setUp()
    self.enterContext(mock.patch.dict(os.environ))
    os.environ.pop(stops.RESTARTS_ENV, None)

  def test_it_saves_but_does_not_say_done_and_runs_the_same_command(self):
    stop = stops.StopRequest("worker 1")
    ran, started = [], []
    stop.add_last_resort(lambda: ran.append("checkpoint"), "a last checkpoint")
    stop.add_last_resort(lambda: ran.append("done"), "telling the PS tasks",
                         before_restart=False)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      stop.restart("the step is stuck", execv=lambda *args: started.append(args))
    self.assertEqual(ran, ["checkpoint"])
    self.assertEqual(started, [(sys.executable, [sys.executable, *sys.orig_argv[1:]])])
    self.assertEqual(os.environ[stops.RESTARTS_ENV], "1")
    self.assertEqual(output.getvalue(), "worker 1: the step is stuck; starting this task again "
                     f"with the same command (restart 1 of at most {stops.MAX_RESTARTS})\n")

  def test_restarts_are_counted_across_the_restarted_programs(self):
    stop = stops.StopRequest("chief")
    self.assertEqual(stop.restarts_left(), stops.MAX_RESTARTS)
    for _ in range(stops.MAX_RESTARTS):
      with contextlib.redirect_stdout(io.StringIO()):
        stop.restart("stuck", execv=lambda *args: None)
    self.assertEqual(stop.restarts_left(), 0)

  def test_a_stop_asked_before_or_during_a_restart_ends_the_task_instead(self):
    # A signal in the seconds the stall watch spends deciding, or during the restart's last
    # checkpoint, must not be wiped out by the exec; each last resort runs once.
    for when in ("before", "during"):
      stop = stops.StopRequest("chief", grace_secs=600)
      self.addCleanup(stop.ended)
      ran, started = [], []

      def checkpoint(stop=stop, when=when, ran=ran):
        ran.append("checkpoint")
        if when == "during":
          stop.request(signal.SIGTERM)

      stop.add_last_resort(checkpoint, "a last checkpoint")
      stop.add_last_resort(lambda ran=ran: ran.append("done"), "telling the PS tasks",
                           before_restart=False)
      output = io.StringIO()
      with contextlib.redirect_stdout(output), mock.patch.object(
          stops.os, "_exit", side_effect=_Exited) as exited:
        if when == "before":
          stop.request(signal.SIGTERM)
        with self.assertRaises(_Exited):  # The real force_exit, through the reentrant lock.
          stop.restart("a step waited 9 s", execv=lambda *args: started.append(args))
      exited.assert_called_once_with(143)
      self.assertEqual(started, [], when)
      self.assertEqual(ran, ["checkpoint", "done"], when)
      self.assertIn("a step waited 9 s, but SIGTERM asked this task to stop; exiting now with "
                    "status 143" if when == "before" else "SIGTERM asked this task to stop while "
                    "it was starting again; exiting now with status 143", output.getvalue())
      self.assertNotIn(stops.RESTARTS_ENV, os.environ)

  def test_a_signal_in_the_instant_before_execv_is_left_for_the_new_program(self):
    stop = stops.StopRequest("chief")
    self.addCleanup(stop.ended)
    received = []
    output = io.StringIO()
    with contextlib.redirect_stdout(output), mock.patch.object(stops.os, "kill") as kill:
      # The watcher receives it after restart's last look at `requested`.
      stop.restart("stuck", execv=lambda *args: received.append(stop.request(signal.SIGTERM)))
    kill.assert_called_once_with(os.getpid(), signal.SIGTERM)  # Pending again, for execv's.
    self.assertLen(received, 1)
    self.assertFalse(stop.requested)
    self.assertNotIn("got SIGTERM", output.getvalue())
    # A stand-in execv came back: this program takes its signals again.
    with contextlib.redirect_stdout(io.StringIO()):
      stop.request(signal.SIGTERM)
    self.assertTrue(stop.requested)
    kill.assert_called_once()

  def test_the_new_program_receives_that_signal(self):
    # Real signals and a real execv, in a process of its own: the first program's watcher
    # receives SIGTERM between the hand-over and execv; the program execv starts gets it.
    import testutil  # pylint: disable=g-import-not-at-top
    program = os.path.join(testutil.make_tempdir(self), "program.py")
    with open(program, "w") as f:
      f.write(textwrap.dedent("""
        import os, signal, sys, time
        from ps_trainer.faults import stops
        stop = stops.StopRequest("task")
        stop.install()
        if os.environ.get(stops.RESTARTS_ENV):  # The new program.
          deadline = time.monotonic() + 10
          while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.01)
          print("new program:", stop.signal_name if stop.requested else "no stop", flush=True)
          sys.exit(0)
        def execv(path, args):
          os.kill(os.getpid(), signal.SIGTERM)
          time.sleep(0.5)  # The watcher takes it meanwhile.
          os.execv(path, args)
        stop.restart("stuck", execv=execv)
        print("execv came back", flush=True)
        """))
    env = testutil.trainer_env()
    env.pop(stops.RESTARTS_ENV, None)
    proc = subprocess.run([sys.executable, program], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertEqual(proc.stdout.splitlines(), [
        "task: stuck; starting this task again with the same command (restart 1 of at most "
        f"{stops.MAX_RESTARTS})",
        "task: got SIGTERM: stopping after the current step (at most 20 s)",
        "new program: SIGTERM"], proc.stderr)

  @absltest.skipIf(not os.path.isdir("/proc/self/task"), "needs Linux /proc")
  def test_what_a_task_imports_before_it_blocks_the_signals_starts_no_thread(self):
    # install() blocks SIGTERM in the threads started after it; one started
    # before (numpy's BLAS pool, once imported by config through readers) can
    # take the signal, whose default action ends the task at once (exit -15)
    # instead of stopping it.
    import testutil  # pylint: disable=g-import-not-at-top
    program = ("import os; from ps_trainer import main; from ps_trainer.settings import cluster, config; "
               "from ps_trainer.console import output_dir; from ps_trainer.faults import stops; "
               "print(len(os.listdir('/proc/self/task')))")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, env=testutil.trainer_env(), check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertEqual(proc.stdout.strip(), "1", "threads before install()")

  def test_last_resorts_share_one_budget_and_name_the_one_cut_short(self):
    stop = stops.StopRequest("chief")
    ran = []
    stop.add_last_resort(lambda: time.sleep(2), "a last checkpoint")
    stop.add_last_resort(lambda: ran.append("done"), "telling the PS tasks")
    output = io.StringIO()
    with mock.patch.object(stops, "_LAST_RESORT_SECS", 0.3), contextlib.redirect_stdout(output):
      started = time.monotonic()
      stop._run_last_resorts()  # pylint: disable=protected-access
      took = time.monotonic() - started
    self.assertLess(took, 1.5)
    self.assertEqual(ran, [])
    self.assertEqual(output.getvalue(), "chief: a last checkpoint did not finish within 0.3 s\n"
                     "chief: no time left for telling the PS tasks\n")


if __name__ == "__main__":
  absltest.main()
