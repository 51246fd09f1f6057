"""The replica's MonitoredSession: a cancelled step is recovered like a lost PS.

A step that spans several PS tasks can fail with Cancelled when one of them
dies; MonitoredSession itself recovers only from Unavailable and Aborted.
These tests cancel a step from outside, in one process, no servers.
"""

import contextlib
import io
import threading

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from ps_trainer.training import session as session_lib
import testutil


class CancelBudgetTest(absltest.TestCase):

  def test_allows_the_limit_within_the_window_then_refuses(self):
    now = [0.0]
    budget = session_lib.CancelBudget(limit=2, window_secs=60,
                                      clock=lambda: now[0])
    self.assertTrue(budget.take())
    self.assertTrue(budget.take())
    self.assertFalse(budget.take())
    now[0] = 61.0  # Both have left the window.
    self.assertTrue(budget.take())


class _BlockThenCancel(tf.compat.v1.train.SessionRunHook):
  """In its first `sessions` sessions, fills the step's queue so the step's
  enqueue blocks, then closes the queue, cancelling it - as TF cancels the
  rest of a step when one of its PS tasks dies."""

  def __init__(self, queue, sessions: int):
    self._fill = queue.enqueue(np.float32(0))
    self._cancel = queue.close(cancel_pending_enqueues=True)
    self._sessions = sessions
    self._timers = []

  def after_create_session(self, session, coord):
    if self._sessions <= 0:
      return
    self._sessions -= 1
    session.run(self._fill)
    timer = threading.Timer(0.3, self._close, args=(session,))
    timer.start()
    self._timers.append(timer)

  def _close(self, session):
    try:
      session.run(self._cancel)
    except (tf.errors.CancelledError, tf.errors.UnavailableError):
      # The step this close cancelled ended that session while the close's
      # own run was returning (seen once in CI, as a thread warning): the
      # queue is closed either way, or the step would still be blocked.
      pass

  def join(self):
    for timer in self._timers:
      timer.join()


class CancelledStepTest(absltest.TestCase):
  """Steps cancelled in their first `cancelled_sessions` sessions."""

  def run_steps(self, cancelled_sessions: int, steps: int,
                stopping=lambda: False):
    graph = tf.Graph()
    with graph.as_default():
      global_step = tf.compat.v1.train.get_or_create_global_step()
      queue = tf.queue.FIFOQueue(1, tf.float32)
      with tf.control_dependencies([queue.enqueue(np.float32(1))]):
        with tf.control_dependencies([queue.dequeue()]):
          train_op = tf.compat.v1.assign_add(global_step, 1)
      cancel = _BlockThenCancel(queue, cancelled_sessions)
      waited = []
      session = session_lib.monitored_session(
          who="chief", is_chief=True, target="", config=None,
          scaffold=tf.compat.v1.train.Scaffold(), hooks=[cancel],
          chief_hooks=[], log_dir=None, save_checkpoint_secs=None,
          save_checkpoint_steps=None, save_summaries_steps=100,
          before_session=lambda: waited.append(True), stopping=stopping)
      said = io.StringIO()
      try:
        with contextlib.redirect_stdout(said), session:
          reached = [int(session.run(train_op)) for _ in range(steps)]
      finally:
        cancel.join()
    return reached, len(waited), said.getvalue()

  def test_a_cancelled_step_recreates_the_session_and_training_goes_on(self):
    reached, sessions, said = self.run_steps(cancelled_sessions=1, steps=3)
    self.assertEqual(reached, [1, 2, 3])
    # A new session, waited for like the first (a fresh one re-initializes
    # here: there is no PS to keep the model).
    self.assertEqual(sessions, 2)
    self.assertIn("chief: lost the session (a PS or the chief stopped answering: "
                  "UnavailableError: a step was cancelled, as happens when a PS goes away: ",
                  said)

  def test_cancels_beyond_the_budget_end_the_run(self):
    with self.assertRaises(tf.errors.CancelledError):
      self.run_steps(cancelled_sessions=session_lib.MAX_CANCELS_TAKEN + 1,
                     steps=1)

  def test_a_cancel_after_a_stop_request_is_not_a_lost_peer(self):
    with self.assertRaises(tf.errors.CancelledError):
      self.run_steps(cancelled_sessions=1, steps=1, stopping=lambda: True)

  def test_tfs_error_on_closing_a_lost_session_is_dropped_and_others_kept(self):
    # After a PS restart it printed a multi-line "Graph execution error" block right
    # before the replica's own "lost the session (...); reconnecting".
    self.run_steps(cancelled_sessions=0, steps=1)  # A monitored session installs the filter.
    with self.assertNoLogs("tensorflow", level="ERROR"):
      tf.get_logger().error("An error occurred when attempting to close the session. This may "
                            "be due to a preemption in a connected worker or parameter server. "
                            "Error: %s", "Graph execution error:\n\nDetected at node ...")
    with self.assertLogs("tensorflow", level="ERROR"):
      tf.get_logger().error("something else went wrong")

  def test_the_session_passes_saver_and_queue_runner_type_checks(self):
    log_dir = testutil.make_tempdir(self)
    graph = tf.Graph()
    with graph.as_default():
      tf.compat.v1.train.get_or_create_global_step()
      variable = tf.compat.v1.get_variable("v", initializer=np.float32(2.0))
      session = session_lib.monitored_session(
          who="chief", is_chief=True, target="", config=None,
          scaffold=tf.compat.v1.train.Scaffold(), hooks=[], chief_hooks=[],
          log_dir=log_dir, save_checkpoint_secs=None,
          save_checkpoint_steps=1000, save_summaries_steps=100,
          before_session=lambda: None)
      with session:
        self.assertEqual(session.run(variable), 2.0)
    # The CheckpointSaverHook saved through the wrapped session.
    self.assertEqual(tf.train.latest_checkpoint(log_dir),
                     f"{log_dir}/model.ckpt-0")
  def test_first_hooks_see_the_step_end_before_the_checkpoint_saver_runs(self):
    # The stall watch times a step: a save after it (slow for a big model) is not the step's.
    log_dir = testutil.make_tempdir(self)
    seen = {}

    class _NewestCheckpoint(tf.compat.v1.train.SessionRunHook):

      def __init__(self, name):
        self.name = name

      def after_run(self, run_context, run_values):
        seen[self.name] = tf.train.latest_checkpoint(log_dir)

    graph = tf.Graph()
    with graph.as_default():
      global_step = tf.compat.v1.train.get_or_create_global_step()
      train_op = tf.compat.v1.assign_add(global_step, 1)
      session = session_lib.monitored_session(
          who="chief", is_chief=True, target="", config=None,
          scaffold=tf.compat.v1.train.Scaffold(), hooks=[_NewestCheckpoint("last")],
          chief_hooks=[], first_hooks=[_NewestCheckpoint("first")], log_dir=log_dir,
          save_checkpoint_secs=None, save_checkpoint_steps=1, save_summaries_steps=100,
          before_session=lambda: None)
      with session:
        session.run(train_op)
    self.assertEqual(seen, {"first": f"{log_dir}/model.ckpt-0",
                            "last": f"{log_dir}/model.ckpt-1"})

  def test_on_run_done_follows_each_run_that_returns_the_hooks_end_too(self):
    # The stall watch bounds each call at the end of a run from the last one that returned.
    runs_done = []
    seen = {}

    class _RunsAtTheEnd(tf.compat.v1.train.SessionRunHook):

      def end(self, session):
        before = len(runs_done)
        session.run(global_step)
        seen["end"] = len(runs_done) - before

    graph = tf.Graph()
    with graph.as_default():
      global_step = tf.compat.v1.train.get_or_create_global_step()
      train_op = tf.compat.v1.assign_add(global_step, 1)
      fails = tf.debugging.check_numerics(tf.constant(np.nan), "a NaN")
      session = session_lib.monitored_session(
          who="chief", is_chief=True, target="", config=None,
          scaffold=tf.compat.v1.train.Scaffold(), hooks=[_RunsAtTheEnd()], chief_hooks=[],
          log_dir=None, save_checkpoint_secs=None, save_checkpoint_steps=None,
          save_summaries_steps=100, before_session=lambda: None,
          on_run_done=lambda: runs_done.append(True))
      with session:
        before = len(runs_done)
        session.run(train_op)
        session.run(train_op)
        seen["steps"] = len(runs_done) - before
        raw = session._tf_sess()  # pylint: disable=protected-access
        before = len(runs_done)
        with self.assertRaises(tf.errors.InvalidArgumentError):
          raw.run(fails)
        seen["failed"] = len(runs_done) - before
    self.assertEqual(seen, {"steps": 2, "failed": 0, "end": 1})


if __name__ == "__main__":
  absltest.main()
