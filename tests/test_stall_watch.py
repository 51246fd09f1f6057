"""The stall watch: bounds on a step and on a session start, whom a task waits for, and when
it ends itself or starts again (hung steps too: the rules themselves are in test_hung_step.py).
No servers: a fake clock, fake peers and a recording stop.
"""

import contextlib
import dataclasses
import io
import math
import os
import signal
import socket
import threading
import time
from unittest import mock

from absl.testing import absltest

from ps_trainer import hung_step
from ps_trainer import peers
from ps_trainer import stall_watch
from ps_trainer import stops
import stop_fakes


class _FakeVote:
  """A hang vote (hang_vote.HangVote) whose verdicts and leave() results are given, one per
  call (then None and True), and reads of the global step beside it that return
  `global_steps` (then None); it records its calls but the reads, and counts the reads (one
  at each look past the bound, and at a long step's first note)."""

  def __init__(self, verdicts, leaves=(), global_steps=()):
    self._verdicts = list(verdicts)
    self._leaves = list(leaves)
    self._global_steps = list(global_steps)
    self.calls = []
    self.reads = 0
    self.on_verdict = lambda: None

  def verdict(self, may_decide, may_begin=True):
    self.on_verdict()
    self.calls.append(("verdict may decide" if may_decide else "verdict")
                      + ("" if may_begin else ", joining only"))
    return self._verdicts.pop(0) if self._verdicts else None

  def leave(self):
    self.calls.append("leave")
    return self._leaves.pop(0) if self._leaves else True

  def global_step(self):
    self.reads += 1
    return self._global_steps.pop(0) if self._global_steps else None

  def sync_replica(self, last_step=None, is_chief=False):
    return hung_step.SyncReplica(self, self.global_step, last_step, is_chief)


def _stuck_after(steps, stop, clock, silent_from, **watch_args):
  """A watch (600 s bound, a note every 10 s) over steps that take `steps` s each, then one that
  never returns (TF's repeat hang), begun: (the hook, when that step began). A peer does not
  answer from `silent_from` s into that step on."""
  began = [math.inf]
  hook = stall_watch.StallWatchHook(stop, lambda: "the PS tasks", timeout_secs=600,
                                    note_every_secs=10, restart_if=lambda: True,
                                    silent_when_named=lambda: clock.now - began[0] >= silent_from,
                                    clock=clock, **watch_args)
  hook.after_create_session(None, None)
  for took in steps:
    clock.now += 1.0
    hook.before_run(None)
    clock.now += took
    hook.after_run(None, None)
  clock.now += 1.0
  hook.before_run(None)
  began[0] = clock.now
  return hook, began[0]


def _wait_for(condition, secs: float = 10.0) -> None:
  """Polls `condition` until it holds or `secs` pass (the watch runs on its own thread)."""
  deadline = time.monotonic() + secs
  while not condition() and time.monotonic() < deadline:
    time.sleep(0.01)


class _Clock:
  """A monotonic clock that moves only when a test sets it."""

  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


def _whole_step(hook) -> None:
  """One step that returns, as MonitoredSession runs the watch: first before it and after it,
  then its tail after the other hooks."""
  hook.before_run(None)
  hook.after_run(None, None)
  hook.tail().after_run(None, None)


def _stuck_step(stop: stop_fakes.RestartingStop, what, restart_if,
                timeout_secs: float = 15) -> None:
  """Runs a step that never returns until a StallWatchHook (0.3 s bound) gives up on it."""
  hook = stall_watch.StallWatchHook(stop, what, timeout_secs=0.3, note_every_secs=60,
                              poll_secs=0.05, restart_if=restart_if)
  with contextlib.redirect_stdout(io.StringIO()):
    hook.after_create_session(None, None)
    hook.before_run(None)
    deadline = time.monotonic() + timeout_secs
    while not (stop.forced or stop.restarts) and time.monotonic() < deadline:
      time.sleep(0.05)
    hook.finished()


class PeersForARestartTest(absltest.TestCase):
  """Whether a stuck step's task may start again: its peers answer, now or soon."""

  def setUp(self):
    super().setUp()
    import testutil  # pylint: disable=g-import-not-at-top
    self.enterContext(mock.patch.dict(os.environ))
    os.environ.pop(stops.RESTARTS_ENV, None)
    self.ps = self.listen(0)
    self.chief_port, own_port = testutil.pick_free_ports(2)
    self.cfg = testutil.make_config(
        f"--ps_hosts=127.0.0.1:{self.ps.getsockname()[1]}",
        f"--worker_hosts=127.0.0.1:{self.chief_port},127.0.0.1:{own_port}",
        "--job_name=worker", "--task_index=1", "--sync_replicas")

  def listen(self, port: int) -> socket.socket:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    self.addCleanup(listener.close)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    return listener

  def peers(self) -> peers.Peers:
    return peers.Peers(self.cfg, None, "", None, None)

  def test_every_peer_answering_allows_it(self):
    self.listen(self.chief_port)
    self.assertTrue(self.peers().answer_for_a_restart(within_secs=0))

  def test_a_peer_that_comes_back_within_the_grace_allows_it(self):
    # As the chief would, starting itself again a moment before this task.
    back = threading.Timer(0.5, self.listen, args=(self.chief_port,))
    back.start()
    self.addCleanup(back.cancel)
    self.assertTrue(self.peers().answer_for_a_restart(within_secs=10))

  def test_a_stuck_step_restarts_when_a_peer_restarting_with_it_comes_back(self):
    # The chief and this worker give up on the same stuck step together; the chief is gone
    # for the few seconds of its own restart when this one looks.
    others = self.peers()
    stop = stop_fakes.RestartingStop("worker 1")
    back = threading.Timer(1.0, self.listen, args=(self.chief_port,))
    back.start()
    self.addCleanup(back.cancel)
    _stuck_step(stop, others.stall_reason,
                restart_if=lambda: others.answer_for_a_restart(within_secs=10))
    self.assertLen(stop.restarts, 1, stop.forced)

  def test_a_peer_already_gone_when_the_stall_was_named_is_not_waited_for(self):
    others = self.peers()
    self.assertIn("not answering: worker 0", others.stall_reason())
    started = time.monotonic()
    self.assertFalse(others.answer_for_a_restart(within_secs=10))
    self.assertLess(time.monotonic() - started, 5)

  def test_a_session_start_names_the_ps_tasks_and_for_a_worker_the_chief(self):
    ps = f"ps 0 at 127.0.0.1:{self.ps.getsockname()[1]}"
    self.assertEqual(self.peers().session_peers(),
                     f"{ps}, worker 0 at 127.0.0.1:{self.chief_port}")
    self.cfg = dataclasses.replace(
        self.cfg, cluster=dataclasses.replace(self.cfg.cluster, task_index=0))
    self.assertEqual(self.peers().session_peers(), ps)


class SessionStartBoundTest(absltest.TestCase):
  """Outside steps: a session start that reaches no step, and the hooks' work after a step
  that never ends, stop the task after 4 x --wait_timeout_secs (1 s here); neither is a step."""

  def watch(self, stop, restart_if=None, timeout_secs=1.0):
    return stall_watch.StallWatchHook(stop, lambda: "the PS tasks", timeout_secs=timeout_secs,
                                      note_every_secs=60, poll_secs=0.05,
                                      restart_if=restart_if, start_peers=lambda: "ps 0 at h:1")

  def wait_for(self, stop, secs):
    deadline = time.monotonic() + secs
    while not (stop.forced or getattr(stop, "restarts", None)) and time.monotonic() < deadline:
      time.sleep(0.05)

  def forced_reason(self, stop, hook) -> str:
    """Waits for the hook to force the task's exit, which must be status 1; its reason."""
    self.wait_for(stop, 20)
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
    self.wait_for(stop, 20)
    hook.finished()
    self.assertLen(stop.forced, 1)
    self.assertLess(time.monotonic() - first, 6.0)  # Not 2.5 + 4 s.

  def test_a_session_that_reaches_a_step_in_time_is_left_alone(self):
    stop = stop_fakes.RecordingStop("worker 1")
    hook = self.watch(stop)
    hook.session_starting()
    time.sleep(2.0)  # Past one --wait_timeout_secs, within four.
    _whole_step(hook)
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
      _whole_step(hook)
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
          _whole_step(hook)
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
        _whole_step(hook)
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


class StallWatchHookTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.enterContext(mock.patch.dict(os.environ))
    os.environ.pop(stops.RESTARTS_ENV, None)

  def test_restarts_are_forgotten_once_the_task_trained_for_the_step_bound(self):
    # A long run meets TF's repeat hangs again and again (repeats.py): each restart that led
    # back to training must not count toward the few allowed in a row.
    os.environ[stops.RESTARTS_ENV] = str(stops.MAX_RESTARTS - 1)
    stop, clock = stop_fakes.RecordingStop("worker 1"), _Clock()
    hook = stall_watch.StallWatchHook(stop, lambda: "the PS", timeout_secs=60,
                                      note_every_secs=600, poll_secs=0.05, clock=clock)
    self.addCleanup(hook.finished)
    hook.session_starting()
    _whole_step(hook)
    clock.now = 40
    hook.session_starting()  # A lost session: its training starts over.
    _whole_step(hook)
    clock.now = 99
    _whole_step(hook)
    self.assertEqual(stop.restarts_left(), 1)  # 99 s since the first step, 59 in this session.
    clock.now = 100
    _whole_step(hook)
    self.assertNotIn(stops.RESTARTS_ENV, os.environ)
    self.assertEqual(stop.restarts_left(), stops.MAX_RESTARTS)
    self.assertEqual(stop.forced, [])

  def test_a_stuck_step_whose_peers_all_answer_starts_the_task_again(self):
    stop = stop_fakes.RestartingStop("chief")
    _stuck_step(stop, lambda: "the PS tasks", restart_if=lambda: True)
    (reason,) = stop.restarts
    self.assertRegex(reason, r"^a step waited \d s \(--wait_timeout_secs=0\) while every peer "
                     r"answers$")
    self.assertEqual(stop.forced, [])

  def test_it_exits_when_a_peer_is_gone_a_stop_was_asked_or_no_restart_is_left(self):
    cases = {"a peer gone": ({}, False, False), "a stop": ({}, True, True),
             "none left": ({stops.RESTARTS_ENV: str(stops.MAX_RESTARTS)}, True, False)}
    for name, (env, peers_answer, stop_requested) in cases.items():
      with mock.patch.dict(os.environ, env):
        stop = stop_fakes.RestartingStop("chief", grace_secs=600)
        if stop_requested:
          with contextlib.redirect_stdout(io.StringIO()):
            stop.request(signal.SIGTERM)
          self.addCleanup(stop.ended)
        _stuck_step(stop, lambda: "the PS tasks",
                    restart_if=lambda answer=peers_answer: answer)
        self.assertEqual(stop.restarts, [], name)
        self.assertLen(stop.forced, 1, name)
        self.assertEqual(stop.forced[0][1], 1, name)

  def test_a_long_step_is_named_and_then_given_up(self):
    stop = stop_fakes.RecordingStop("chief")
    hook = stall_watch.StallWatchHook(stop, lambda: "the gradients of worker 1 (not answering)",
                                timeout_secs=0.6, note_every_secs=0.2, poll_secs=0.05)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      hook.after_create_session(None, None)
      hook.before_run(None)  # A step that never returns.
      deadline = time.monotonic() + 10
      while not stop.forced and time.monotonic() < deadline:
        time.sleep(0.05)
      hook.finished()
    notes = output.getvalue().splitlines()
    self.assertNotEmpty(notes)
    self.assertRegex(notes[0], r"^chief: this step has waited 0 s for the gradients of worker 1 "
                     r"\(not answering\); giving up after 1 s$")
    (reason, status), = stop.forced
    self.assertEqual(status, 1)
    self.assertRegex(reason, r"^gave up after a step waited \d s for the gradients of worker 1 "
                     r"\(not answering\) \(--wait_timeout_secs=1\); the newest checkpoint is kept")

  def async_hang(self, steps_before: int, silent_from: float = math.inf,
                hang_restarts: bool = True, longest_step_secs: float = 0.001,
                wait_secs: float = 0.5) -> stop_fakes.RestartingStop:
    """`steps_before` steps that return (the last taking `longest_step_secs`), then one that
    never does, watched (600 s bound) until its clock reads 130 s, and `wait_secs` more; a
    peer does not answer from `silent_from` s into it on."""
    stop, clock = stop_fakes.RestartingStop("worker 1"), _Clock()
    steps = [0.001] * steps_before
    if steps:
      steps[-1] = longest_step_secs
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      hook, started = _stuck_after(steps, stop, clock, silent_from, poll_secs=0.02,
                                   hang_restarts=hang_restarts)
      for waited in range(10, 140, 10):  # The watch names it every 10 s on the way.
        clock.now = started + waited
        time.sleep(0.1)
      deadline = time.monotonic() + wait_secs
      while not (stop.restarts or stop.forced) and time.monotonic() < deadline:
        time.sleep(0.02)
      hook.finished()
    self.assertEqual(stop.forced, [])
    stop.notes = output.getvalue().splitlines()
    return stop

  def test_an_async_step_hung_while_every_peer_answers_restarts_before_the_bound(self):
    stop = self.async_hang(steps_before=hung_step.STEPS_BEFORE_HANG_BOUND, wait_secs=10)
    (reason,) = stop.restarts
    # Its notes say when it may start again, not only when it would give up.
    self.assertRegex(stop.notes[0], r"^worker 1: this step has waited \d+ s for the PS tasks; "
                     r"giving up after 600 s \(starting again sooner, from 120 s, if it stays "
                     r"stuck while every peer answers\)$")
    self.assertRegex(reason, r"^a step waited 1[23]\d s \(past 120 s: 100 x the longest of "
                     r"this session's steps, at least 120 s\) while every peer answers$")

  def test_a_hang_is_waited_out_first_steps_a_silent_peer_slow_steps_or_no_early_bound(self):
    enough = hung_step.STEPS_BEFORE_HANG_BOUND + 1
    for name, kwargs in {"first steps": dict(steps_before=enough - 2),
                         "a peer silent": dict(steps_before=enough, silent_from=10),
                         "a peer silent at the look": dict(steps_before=enough, silent_from=120),
                         "slow steps": dict(steps_before=enough, longest_step_secs=1.5),
                         "no early bound": dict(steps_before=enough, hang_restarts=False)
                         }.items():
      stop = self.async_hang(**kwargs)
      self.assertEqual(stop.restarts, [], name)
      # Their notes promise no restart before 600 s; a longest step of 1.5 s puts the bound
      # at 150 s, past the clock here.
      if name in ("first steps", "a peer silent", "no early bound"):
        self.assertTrue(all(note.endswith("giving up after 600 s") for note in stop.notes),
                        (name, stop.notes))
      elif name == "slow steps":
        self.assertIn("(starting again sooner, from 150 s, if it stays stuck while every peer "
                      "answers)", stop.notes[-1])

  def sync_hang(self, verdicts, silent_from=math.inf, leaves=(), global_steps=(),
                steps=(0.001,) * hung_step.STEPS_BEFORE_HANG_BOUND, looks=(130, 140),
                step_ends_in_verdict=False, last_step=None, who="worker 1", exits=None,
                restarts_made=0):
    """A sync replica's steps taking `steps` s, then one that never returns, with a hang vote
    whose verdicts are `verdicts`, whose leave() returns `leaves` (then True) and whose reads
    of the global step return `global_steps` (then None), of a run whose last step is
    `last_step`; the clock reads each of `looks` s into the stuck step in turn, moving on once
    the watch has read the global step there (a look past the bound, or the step's first note)
    or ended the task, and a peer does not answer from `silent_from` s on: (its restarts, the calls
    to its vote). It exits 0 with a reason `exits` matches, or not at all; it has made
    `restarts_made` restarts in a row before."""
    self.enterContext(mock.patch.dict(os.environ, {stops.RESTARTS_ENV: str(restarts_made)}))
    stop, clock = stop_fakes.RestartingStop(who), _Clock()
    vote = _FakeVote(verdicts, leaves, global_steps)
    with contextlib.redirect_stdout(io.StringIO()):
      hook, started = _stuck_after(steps, stop, clock, silent_from, poll_secs=0.01,
                                   sync_replica=vote.sync_replica(last_step, who == "chief"))
      if step_ends_in_verdict:
        vote.on_verdict = lambda: hook.after_run(None, None)
      for waited in looks:
        reads_before = vote.reads
        clock.now = started + waited
        _wait_for(lambda: vote.reads > reads_before or stop.restarts or stop.forced, secs=2)
      _wait_for(lambda: stop.restarts or stop.forced, secs=0.3)
      hook.finished()
    if exits is None:
      self.assertEqual(stop.forced, [])
    else:
      ((reason, status),) = stop.forced
      self.assertRegex(reason, exits)
      self.assertEqual(status, 0)
    return stop.restarts, vote.calls

  def test_a_sync_step_hung_restarts_before_the_bound_once_every_replica_agrees(self):
    restarts, calls = self.sync_hang([None, "so were the steps of all 2 replicas"])
    (reason,) = restarts
    self.assertRegex(reason, r"^a step waited 140 s \(past 120 s: 100 x 99% of this session's "
                     r"recent steps, at least 120 s; so were the steps of all 2 replicas\) while "
                     r"every peer answers$")
    # Its flag cleared as its session starts, then a verdict at each look.
    self.assertEqual(calls, ["leave", "verdict may decide", "verdict may decide"])

  def test_a_sync_step_waits_on_while_the_replicas_do_not_agree_or_a_peer_is_silent(self):
    restarts, calls = self.sync_hang([None, None], global_steps=[500, 500])
    self.assertEqual(restarts, [])
    self.assertEqual(calls, ["leave", "verdict may decide", "verdict may decide"])
    restarts, calls = self.sync_hang(["would restart"], silent_from=10, looks=(130,))
    self.assertEqual((restarts, calls), ([], ["leave"]))  # Never even voted.

  def test_a_sync_step_stuck_while_the_global_step_moves_on_restarts_alone(self):
    # Backup workers: the others train on without it, so no vote can agree. The look that sees
    # the move only marks it (a healthy step may be ending); the next one decides.
    restarts, calls = self.sync_hang([None, None], global_steps=[500, 531, 560],
                                     looks=(130, 140, 150))
    (reason,) = restarts
    self.assertRegex(reason, r"^a step waited 150 s \(past 120 s: 100 x 99% of this session's "
                     r"recent steps, at least 120 s; the global step moved on from 500 to 560 "
                     r"meanwhile: the other replicas train without it\) while every peer "
                     r"answers$")
    self.assertEqual(calls, ["leave", "verdict may decide", "verdict may decide"])
    # A backup worker gone for good is silent, and the others train on without it too.
    restarts, calls = self.sync_hang([], silent_from=10, global_steps=[500, 531, 560],
                                     looks=(130, 140, 150))
    (reason,) = restarts
    self.assertRegex(reason, r"; the global step moved on from 500 to 560 meanwhile: the other "
                     r"replicas train without it\)$")
    self.assertEqual(calls, ["leave"])

  def test_a_sync_step_notes_the_global_step_ten_seconds_in(self):
    # It hung before the others did: by its first look past the bound the global step had
    # stopped (at 560), but it had moved on since the step's first note (500).
    restarts, calls = self.sync_hang([None, None], global_steps=[500, 560, 560],
                                     looks=(11, 130, 140))
    (reason,) = restarts
    self.assertRegex(reason, r"^a step waited 140 s \(.*; the global step moved on from 500 to "
                     r"560 meanwhile: the other replicas train without it\) while every peer "
                     r"answers$")
    self.assertEqual(calls, ["leave", "verdict may decide"])

  def test_a_sync_step_stuck_as_the_run_reached_its_last_step_ends_the_task(self):
    # The others finished the run: a worker leaves (saying it is done), the chief starts again,
    # which ends the run as every finished run ends.
    ended = (r"^a step waited 130 s \(past 120 s: .*; the run reached its last step meanwhile "
             r"\(global step 4000 of 4000\)\)")
    restarts, calls = self.sync_hang([], global_steps=[4000], last_step=4000, looks=(130,),
                                     silent_from=10, exits=ended + ": nothing is left to train$")
    self.assertEqual((restarts, calls), ([], ["leave"]))
    # So does a worker that has no restart left.
    self.sync_hang([], global_steps=[4000], last_step=4000, looks=(130,),
                   exits=ended + ": nothing is left to train$", restarts_made=stops.MAX_RESTARTS)
    restarts, calls = self.sync_hang([], global_steps=[4000], last_step=4000, looks=(130,),
                                     silent_from=10, who="chief")
    (reason,) = restarts
    self.assertRegex(reason, ended + "$")
    # One step short of the end is not the end.
    restarts, calls = self.sync_hang([None, None], global_steps=[3999, 3999], last_step=4000)
    self.assertEqual(restarts, [])

  def test_a_rightful_wait_as_its_longest_step_leaves_a_sync_replica_its_bound(self):
    # A chief's save, a peer starting again or a hang another replica restarted for.
    steps = (0.001,) * 30 + (150.0,) + (0.001,) * 30
    restarts, calls = self.sync_hang([None, "so were the steps of all 2 replicas"], steps=steps)
    self.assertLen(restarts, 1)

  def test_a_sync_replica_follows_an_agreement_though_a_peer_went_silent(self):
    # The peers that restart for the agreement do not answer a moment.
    restarts, calls = self.sync_hang([None, "another replica found every replica's step stuck "
                                      "as long"], silent_from=135)
    (reason,) = restarts
    self.assertRegex(reason, r"^a step waited 140 s \(past 120 s: .*; another replica found "
                     r"every replica's step stuck as long\)$")
    self.assertEqual(calls, ["leave", "verdict may decide", "verdict"])

  def test_a_sync_replica_in_its_first_steps_only_joins_a_vote_begun(self):
    # Started again in the middle of a hang of another replica, say: its first step is stuck too.
    restarts, calls = self.sync_hang(["so were the steps of all 2 replicas"], steps=(0.001,),
                                     looks=(130,))
    (reason,) = restarts
    self.assertRegex(reason, r"^a step waited 130 s \(past 120 s, in one of this session's first "
                     r"steps; so were the steps of all 2 replicas\) while every peer answers$")
    self.assertEqual(calls, ["leave", "verdict may decide, joining only"])

  def test_a_sync_replica_whose_step_ends_while_it_votes_stays(self):
    restarts, calls = self.sync_hang(["so were the steps of all 2 replicas"], looks=(130,),
                                     step_ends_in_verdict=True)
    self.assertEqual(restarts, [])
    self.assertEqual(calls[:2], ["leave", "verdict may decide"])

  def test_a_sync_replica_clears_its_flag_until_that_works(self):
    # At its session's start the PS was not there yet; then its step ends after it voted.
    vote, clock = _FakeVote([], leaves=[False]), _Clock()
    hook = stall_watch.StallWatchHook(stop_fakes.RestartingStop("worker 1"), lambda: "the PS tasks",
                                      timeout_secs=600, poll_secs=0.01, restart_if=lambda: True,
                                      sync_replica=vote.sync_replica(), clock=clock)
    with contextlib.redirect_stdout(io.StringIO()):
      hook.after_create_session(None, None)
      _wait_for(lambda: vote.calls == ["leave"])
      clock.now += hung_step.LEAVE_RETRY_SECS
      _wait_for(lambda: vote.calls == ["leave", "leave"])
      for _ in range(hung_step.STEPS_BEFORE_HANG_BOUND):
        _whole_step(hook)
      hook.before_run(None)
      clock.now += 130
      _wait_for(lambda: len(vote.calls) == 3)
      hook.after_run(None, None)  # The step ends after all: a slow peer.
      _wait_for(lambda: len(vote.calls) == 4)
      hook.finished()
    self.assertEqual(vote.calls, ["leave", "leave", "verdict may decide", "leave"])

  def test_steps_that_finish_are_not_reported(self):
    stop = stop_fakes.RecordingStop("worker 1")
    hook = stall_watch.StallWatchHook(stop, lambda: "x", timeout_secs=0.5, note_every_secs=0.2,
                                poll_secs=0.05)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      hook.after_create_session(None, None)
      for _ in range(10):
        hook.before_run(None)
        time.sleep(0.1)
        hook.after_run(None, None)
      hook.finished()
    self.assertEqual(output.getvalue(), "")
    self.assertEqual(stop.forced, [])


if __name__ == "__main__":
  absltest.main()
