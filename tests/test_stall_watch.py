"""The stall watch over steps: a step that never returns is named, then given up on, and the
task ends itself or starts again, as its peers answer and its restarts allow. No servers but
listening sockets: fake peers and a recording stop. A session start and the work outside steps
are in test_stall_watch_outside_steps.py, TF's repeat hang in test_hang_watch.py.
"""

import contextlib
import dataclasses
import io
import os
import signal
import socket
import threading
import time
from unittest import mock

from absl.testing import absltest

from ps_trainer.faults import peers
from ps_trainer.faults import stall_watch
from ps_trainer.faults import stops
import stall_testlib
import stop_fakes
import testutil


class PeersForARestartTest(absltest.TestCase):
  """Whether a stuck step's task may start again: its peers answer, now or soon."""

  def setUp(self):
    super().setUp()
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
    stall_testlib.stuck_step(stop, others.stall_reason,
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




class StallWatchHookTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.enterContext(mock.patch.dict(os.environ))
    os.environ.pop(stops.RESTARTS_ENV, None)

  def test_restarts_are_forgotten_once_the_task_trained_for_the_step_bound(self):
    # A long run meets TF's repeat hangs again and again (repeats.py): each restart that led
    # back to training must not count toward the few allowed in a row.
    os.environ[stops.RESTARTS_ENV] = str(stops.MAX_RESTARTS - 1)
    stop, clock = stop_fakes.RecordingStop("worker 1"), testutil.ManualClock()
    hook = stall_watch.StallWatchHook(stop, lambda: "the PS", timeout_secs=60,
                                      note_every_secs=600, poll_secs=0.05, clock=clock)
    self.addCleanup(hook.finished)
    hook.session_starting()
    stall_testlib.whole_step(hook)
    clock.now = 40
    hook.session_starting()  # A lost session: its training starts over.
    stall_testlib.whole_step(hook)
    clock.now = 99
    stall_testlib.whole_step(hook)
    self.assertEqual(stop.restarts_left(), 1)  # 99 s since the first step, 59 in this session.
    clock.now = 100
    stall_testlib.whole_step(hook)
    self.assertNotIn(stops.RESTARTS_ENV, os.environ)
    self.assertEqual(stop.restarts_left(), stops.MAX_RESTARTS)
    self.assertEqual(stop.forced, [])

  def test_a_stuck_step_whose_peers_all_answer_starts_the_task_again(self):
    stop = stop_fakes.RestartingStop("chief")
    stall_testlib.stuck_step(stop, lambda: "the PS tasks", restart_if=lambda: True)
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
        stall_testlib.stuck_step(stop, lambda: "the PS tasks",
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
      stall_testlib.wait_for(lambda: stop.forced, secs=10)
      hook.finished()
    notes = output.getvalue().splitlines()
    self.assertNotEmpty(notes)
    self.assertRegex(notes[0], r"^chief: this step has waited 0 s for the gradients of worker 1 "
                     r"\(not answering\); giving up after 1 s$")
    (reason, status), = stop.forced
    self.assertEqual(status, 1)
    self.assertRegex(reason, r"^gave up after a step waited \d s for the gradients of worker 1 "
                     r"\(not answering\) \(--wait_timeout_secs=1\); the newest checkpoint is kept")

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
