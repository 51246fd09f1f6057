"""A task ends without aborting on a helper thread's TensorFlow call (process_end.py).

A finished sync worker once exited -6 ("FATAL: exception not rethrown"): its stall watch was
making a session on PS 0 as the interpreter shut down. The unit tests check the waiting with a
fake exit; one child process checks the real thing: real PsRuns against real servers, run back
to back on a helper thread while the program exits.
"""

import contextlib
import io
import subprocess
import sys
import textwrap
import threading
import time
from unittest import mock

from absl.testing import absltest

from ps_trainer.console import process_end
import testutil


class HelperCallsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.exits = []
    self.calls = process_end.HelperCalls(exit_now=self.exits.append)

  def helper(self, body, calls=None, name="ps_trainer_ps_run"):
    """Starts a daemon thread that runs body() inside tf_work(); returns it."""
    def target():
      with (calls or self.calls).tf_work():
        body()
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread

  def test_the_end_waits_for_a_call_in_flight_then_lets_the_interpreter_finish(self):
    inside, ended = threading.Event(), threading.Event()

    def call():
      inside.set()
      time.sleep(0.3)
      ended.set()
    self.helper(call)
    inside.wait(5)
    started = time.monotonic()
    self.calls.finish(0, bound_secs=5)
    self.assertTrue(ended.is_set())
    self.assertLess(time.monotonic() - started, 2)
    self.assertEqual(self.exits, [])

  def test_a_call_still_running_at_the_bound_ends_the_process_with_the_programs_status(self):
    inside, release = threading.Event(), threading.Event()
    self.addCleanup(release.set)
    self.helper(lambda: (inside.set(), release.wait(10)))
    inside.wait(5)
    stderr = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stderr(stderr):
      self.calls.finish(3, bound_secs=0.3)
    self.assertGreaterEqual(time.monotonic() - started, 0.3)
    self.assertEqual(self.exits, [3])
    self.assertEqual(stderr.getvalue(),
                     "ps_trainer: a TensorFlow call on this task's helper thread "
                     "(ps_trainer_ps_run) did not end within 0.3 s of the task's end; exiting "
                     "with status 3 without waiting for it\n")

  def test_sys_exit_statuses_carry_over(self):
    release = threading.Event()
    self.addCleanup(release.set)
    for code, status in ((None, 0), (2, 2), ("ps_trainer: error: bad", 1)):
      calls = process_end.HelperCalls(exit_now=self.exits.append)
      inside = threading.Event()
      self.helper(lambda inside=inside: (inside.set(), release.wait(10)), calls)
      inside.wait(5)
      with contextlib.redirect_stderr(io.StringIO()):
        calls.finish(code, bound_secs=0.05)
      self.assertEqual(self.exits[-1], status)

  def test_no_call_starts_once_the_end_began(self):
    self.calls.finish(0, bound_secs=1)
    ran = threading.Event()
    thread = self.helper(ran.set)
    thread.join(0.5)
    self.assertTrue(thread.is_alive())  # Parked until the process is gone.
    self.assertFalse(ran.is_set())

  def test_a_thread_inside_a_call_may_nest_another_after_the_end_began(self):
    inside, done = threading.Event(), threading.Event()

    def body():
      inside.set()
      while not self.calls._ending:  # pylint: disable=protected-access
        time.sleep(0.01)  # Until finish() has begun.
      with self.calls.tf_work():
        pass
      done.set()
    self.helper(body)
    inside.wait(5)
    self.calls.finish(0, bound_secs=3)
    self.assertTrue(done.is_set())
    self.assertEqual(self.exits, [])


class RunThenFinishTest(absltest.TestCase):
  """The program's end goes through finish() with the status Python would give."""

  def end_of(self, program):
    stderr = io.StringIO()
    with mock.patch.object(process_end, "finish") as finish, \
        contextlib.redirect_stderr(stderr), self.assertRaises(SystemExit) as exited:
      process_end.run_then_finish(program)
    finish.assert_called_once_with(exited.exception.code)
    return exited.exception.code, stderr.getvalue()

  def test_sys_exit(self):
    self.assertEqual(self.end_of(lambda: sys.exit(2)), (2, ""))
    self.assertEqual(self.end_of(lambda: None), (None, ""))

  def test_an_exception_prints_its_traceback_and_exits_1(self):
    def bug():
      raise ValueError("a bug")
    code, stderr = self.end_of(bug)
    self.assertEqual(code, 1)
    self.assertTrue(stderr.startswith("Traceback (most recent call last):"), stderr)
    self.assertTrue(stderr.endswith("ValueError: a bug\n"), stderr)

  def test_ctrl_c_before_the_stop_watcher_is_a_stop(self):
    def interrupted():
      raise KeyboardInterrupt
    self.assertEqual(self.end_of(interrupted), (130, ""))

  def test_the_trainer_program_ends_through_it(self):
    from ps_trainer import main  # pylint: disable=g-import-not-at-top
    with mock.patch.object(process_end, "run_then_finish") as run_then_finish:
      main.run()
    run_then_finish.assert_called_once()


# A sync replica's stall watch clears its hang-vote flag on PS 0 after each session start; this
# runs such clears back to back, so the program's exit always comes during one.
_CHILD = textwrap.dedent("""
    import sys, threading, time
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    from ps_trainer.faults import hang_vote
    from ps_trainer.console import process_end
    from ps_trainer.faults import ps_runs
    import inprocess_cluster

    cluster = inprocess_cluster.InProcessCluster(num_ps=1, num_workers=1)
    info = cluster.info("worker", 0)
    vote = hang_vote.HangVote(ps_runs.PsRuns(cluster.targets[0], info), info)
    cleared = []

    def watch():
        while True:
            cleared.append(vote.leave())

    threading.Thread(target=watch, daemon=True).start()

    def program():
        while len(cleared) < 20:
            time.sleep(0.01)
        print("cleared", all(cleared), flush=True)
        sys.exit(0)

    process_end.run_then_finish(program)
    """)


class ProcessExitTest(absltest.TestCase):

  def test_a_program_ending_while_a_helper_thread_opens_ps_sessions_exits_0(self):
    env = testutil.trainer_env({"PYTHONPATH": f"{testutil.REPO_ROOT}:{testutil.REPO_ROOT}/tests",
                                "TF_CPP_MIN_LOG_LEVEL": "2"})
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    self.assertEqual((done.returncode, done.stdout), (0, "cleared True\n"), done.stderr[-2000:])
    self.assertNotIn("exception not rethrown", done.stderr)
    self.assertNotIn("did not end within", done.stderr)  # Waited for, not cut short.


if __name__ == "__main__":
  absltest.main()
