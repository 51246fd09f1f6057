"""The stall watch outside steps: a session start that reaches no step, the hooks' work after a
step and the calls at the end of a run are bounded (4 x --wait_timeout_secs, or one where a PS
is not answering) and named while they wait. No servers: a recording stop and fake peers.
"""

import contextlib
import io
import signal
import time

from absl.testing import absltest

from ps_trainer.faults import stall_watch
import stall_testlib
import stop_fakes


class SessionStartBoundTest(absltest.TestCase):
  """Outside steps: a session start that reaches no step, and the hooks' work after a step
  that never ends, stop the task after 4 x --wait_timeout_secs (1 s here); neither is a step."""

  def watch(self, stop, restart_if=None, timeout_secs=1.0):
    return stall_watch.StallWatchHook(stop, lambda: "the PS tasks", timeout_secs=timeout_secs,
                                      note_every_secs=60, poll_secs=0.05,
                                      restart_if=restart_if, start_peers=lambda: "ps 0 at h:1")

  def forced_reason(self, stop, hook) -> str:
    """Waits for the hook to force the task's exit, which must be status 1; its reason."""
    stall_testlib.wait_for(lambda: stop.forced, secs=20)
    hook.finished()
    (reason, status), = stop.forced
    self.assertEqual(status, 1)
    return reason

  def test_no_step_within_four_wait_timeouts_of_a_session_start_ends_it(self):
    stop = stop_fakes.RecordingStop("worker 1")
    hook = self.watch(stop)
    hook.session_starting()  # TF never comes back from creating the session.
    self.assertRegex(self.forced_reason(stop, hook),
                     r"^gave up after \d+ s starting a session without reaching a "
                     r"step \(at most 4 s, 4 x --wait_timeout_secs\), though the tasks it needs "
                     r"accepted connections \(ps 0 at h:1\): one of them may not be serving "
                     r"\(stopped, paused or wedged\), or a restore is that slow; the newest "
                     r"checkpoint is kept$")

  def test_attempts_made_again_count_as_one_start(self):
    # TF makes a session again after each Unavailable error in creating it.
    stop = stop_fakes.RecordingStop("worker 1")
    hook = self.watch(stop)
    first = time.monotonic()
    hook.session_starting()
    time.sleep(2.5)
    hook.session_starting()  # The first attempt failed.
    stall_testlib.wait_for(lambda: stop.forced, secs=20)
    hook.finished()
    self.assertLen(stop.forced, 1)
    self.assertLess(time.monotonic() - first, 6.0)  # Not 2.5 + 4 s.

  def test_a_session_that_reaches_a_step_in_time_is_left_alone(self):
    stop = stop_fakes.RecordingStop("worker 1")
    hook = self.watch(stop)
    hook.session_starting()
    time.sleep(2.0)  # Past one --wait_timeout_secs, within four.
    stall_testlib.whole_step(hook)
    time.sleep(3.0)  # Past four, counted from the start: the step ended it.
    hook.finished()
    self.assertEqual(stop.forced, [])

  def test_a_lost_step_stops_its_clock_when_the_next_session_starts(self):
    # A step that failed (the PS went away) never gets its after_run; the waits for the PS and
    # the chief that follow are not that step, and no restart may be spent on them.
    stop = stop_fakes.RestartingStop("worker 1")
    hook = self.watch(stop, restart_if=lambda: True)
    with contextlib.redirect_stdout(io.StringIO()):
      hook.session_starting()
      hook.before_run(None)  # This step fails inside TF: no after_run.
      hook.session_starting()  # MonitoredSession makes the session again.
      time.sleep(2.5)  # Two step bounds, within the start's four.
      stall_testlib.whole_step(hook)
      hook.finished()
    self.assertEqual((stop.forced, stop.restarts), ([], []))

  def test_the_hooks_work_after_a_step_is_bounded_too(self):
    # A checkpoint save from a PS that stopped serving never returns.
    stop = stop_fakes.RecordingStop("chief")
    hook = self.watch(stop)
    hook.after_create_session(None, None)
    hook.before_run(None)
    hook.after_run(None, None)  # The step is over; the saver's after_run never is.
    self.assertRegex(self.forced_reason(stop, hook),
                     r"^gave up after \d+ s in the work after a step \(a checkpoint "
                     r"save\?\) \(at most 4 s, 4 x --wait_timeout_secs\): ps 0 at h:1 may not "
                     r"be serving")

  def test_work_after_a_step_blocked_on_a_ps_that_is_gone_is_named_and_bounded_as_a_step(self):
    # The PS died during a checkpoint save: as for a step, every 10 s (0.3 here) its notes name
    # it, and it gets --wait_timeout_secs, not four, so the chief ends sooner (was 120 s silent).
    for silent_ps, bound_secs in (("ps 0 at h:1", 1.0), ("", 4.0)):
      with self.subTest(silent_ps or "every PS answers: a slow save"):
        stop = stop_fakes.RecordingStop("chief")
        hook = stall_watch.StallWatchHook(
            stop, lambda: "the PS tasks", timeout_secs=1.0, note_every_secs=0.3,
            poll_secs=0.05, start_peers=lambda: "ps 0 at h:1", silent_ps=lambda: silent_ps)
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
          hook.after_create_session(None, None)
          stall_testlib.whole_step(hook)
          hook.before_run(None)
          started = time.monotonic()
          hook.after_run(None, None)  # The step is over; the saver's after_run never is.
          reason = self.forced_reason(stop, hook)
        took = time.monotonic() - started
        self.assertGreaterEqual(took, bound_secs)
        self.assertLess(took, bound_secs + 2.0)
        notes = output.getvalue().splitlines()
        if silent_ps:
          self.assertRegex(reason, r"^gave up after 1 s in the work after a step \(a checkpoint "
                           r"save\?\) \(--wait_timeout_secs=1\): not answering: ps 0 at h:1$")
          self.assertRegex(notes[0], r"^chief: the work after a step \(a checkpoint save\?\) "
                           r"has waited \d+ s; not answering: ps 0 at h:1; giving up after 1 s$")
        else:
          self.assertRegex(reason, r"\(at most 4 s, 4 x --wait_timeout_secs\): ps 0 at h:1 may "
                           r"not be serving")
          self.assertRegex(notes[0], r"^chief: the work after a step \(a checkpoint save\?\) "
                           r"has waited \d+ s for TensorFlow; giving up after 4 s$")

  def test_a_call_at_the_end_of_the_run_that_never_returns_ends_it(self):
    # The final checkpoint, the evaluation or the done flags, from a PS that stopped serving.
    for end_of_run in ("a clean close", "leaving after an error"):
      with self.subTest(end_of_run):
        stop = stop_fakes.RecordingStop("chief")
        hook = self.watch(stop)
        hook.after_create_session(None, None)
        stall_testlib.whole_step(hook)
        if end_of_run == "a clean close":
          hook.end(None)  # TF's close; then its saver's end() never returns.
        else:
          hook.ending()  # trainer.py, before it tells the PS tasks it is done.
        self.assertRegex(self.forced_reason(stop, hook),
                         r"^gave up after \d+ s waiting for TensorFlow at the end of the run "
                         r"\(the final checkpoint, the test split's evaluation, closing the "
                         r"session or telling the PS tasks this worker is done\) \(at most 4 s, 4 x "
                         r"--wait_timeout_secs\): "
                         r"ps 0 at h:1 may not be serving \(stopped, paused or wedged\); the "
                         r"newest checkpoint is kept$")

  def test_a_long_call_at_the_end_of_the_run_is_noted_not_waited_in_silence(self):
    # TF took 9-37 s to close the session at the end of sync runs whose PS had been paused.
    now = [0.0]
    stop = stop_fakes.RecordingStop("chief")
    hook = stall_watch.StallWatchHook(stop, lambda: "the PS tasks", timeout_secs=20.0,
                                      start_peers=lambda: "ps 0 at h:1", clock=lambda: now[0])
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      hook.end(None)  # At 0 s; the watch's own thread is not started: its looks are these.
      for now[0] in (9.9, 10.0, 15.0, 20.5, 21.0):
        hook._note_outside()  # pylint: disable=protected-access
      hook.run_done()  # A call came back: the next one is timed from here.
      now[0] = 29.0
      hook._note_outside()  # pylint: disable=protected-access
    self.assertEqual(stop.forced, [])
    calls = ("the final checkpoint, the test split's evaluation, closing the session or telling "
             "the PS tasks this worker is done")
    self.assertEqual(output.getvalue().splitlines(), [
        f"chief: the end of the run has waited 10 s for TensorFlow ({calls}); giving up after "
        "80 s",
        f"chief: the end of the run has waited 20 s for TensorFlow ({calls}); giving up after "
        "80 s"])

  def test_another_workers_note_names_only_the_calls_it_makes(self):
    # Only the chief writes the final checkpoint and evaluates the test split.
    now = [0.0]
    stop = stop_fakes.RecordingStop("worker 1")
    hook = stall_watch.StallWatchHook(stop, lambda: "the PS tasks", timeout_secs=20.0,
                                      start_peers=lambda: "ps 0 at h:1", is_chief=False,
                                      clock=lambda: now[0])
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      hook.end(None)
      now[0] = 10.0
      hook._note_outside()  # pylint: disable=protected-access
      now[0] = 80.0
      self.assertTrue(hook._gave_up_outside_steps())  # pylint: disable=protected-access
    self.assertEqual(output.getvalue().splitlines(), [
        "worker 1: the end of the run has waited 10 s for TensorFlow (closing the session or "
        "telling the PS tasks this worker is done); giving up after 80 s"])
    self.assertEqual(len(stop.forced), 1, stop.forced)
    self.assertIn("at the end of the run (closing the session or telling the PS tasks this "
                  "worker is done) (at most 80 s", str(stop.forced[0]))

  def test_an_end_of_run_whose_calls_return_may_take_longer(self):
    # A big test split takes many batches: each may take the bound, not all of them together.
    stop = stop_fakes.RecordingStop("chief")
    hook = self.watch(stop)
    hook.after_create_session(None, None)
    hook.end(None)
    for _ in range(12):  # 6 s in all, past the 4 s bound; 0.5 s each.
      time.sleep(0.5)
      hook.run_done()
    hook.finished()
    time.sleep(0.3)  # The watch has ended: nothing fires after.
    self.assertEqual(stop.forced, [])

  def test_a_requested_stop_leaves_them_to_its_own_deadline(self):
    stop = stop_fakes.RecordingStop("worker 1", grace_secs=600)
    self.addCleanup(stop.ended)
    with contextlib.redirect_stdout(io.StringIO()):
      stop.request(signal.SIGTERM)
    hook = self.watch(stop, timeout_secs=0.3)
    hook.session_starting()
    time.sleep(2.0)  # Past four of its --wait_timeout_secs.
    hook.finished()
    self.assertEqual(stop.forced, [])

  def test_without_start_peers_a_session_start_is_not_bounded(self):
    stop = stop_fakes.RecordingStop("chief")
    hook = stall_watch.StallWatchHook(stop, lambda: "x", timeout_secs=0.1, poll_secs=0.05)
    hook.session_starting()
    time.sleep(0.8)
    hook.finished()
    self.assertEqual(stop.forced, [])




if __name__ == "__main__":
  absltest.main()
