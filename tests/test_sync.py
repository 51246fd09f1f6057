"""Synchronous and asynchronous updates on an in-process cluster.

The replicas, their known gradients and the expected variables are in
sync_testlib.py; the end of a sync run is tested in test_sync_end.py, the PS
task's own life in test_ps_task.py.
"""

import contextlib
import io
import os
import time

import tensorflow as tf

from ps_trainer.cluster import waits
from ps_trainer.graph import resume
from ps_trainer.graph import sync_replicas
from inprocess_cluster import InProcessCluster
import sync_testlib
from sync_testlib import INIT, STEP_TIMEOUT_SECS, Replica, expected_after, run_options

tf.compat.v1.disable_eager_execution()


class ChiefRestoreTest(tf.test.TestCase):
  """A sync chief whose session lost a PS restores the model: past the tokens
  a PS that kept running still holds, else at the checkpoint's step, so the
  steps since it are trained again. A plain session stands for the PS tasks:
  a new one holds nothing, as a restarted PS."""

  CHECKPOINT_STEP, SEEN_STEP, MARGIN = 40, 70, 3

  def setUp(self):
    super().setUp()
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.global_step = tf.compat.v1.train.get_or_create_global_step()
      self.weights = tf.compat.v1.get_variable("w", initializer=[1.0, 2.0])
      self.model = [self.global_step, self.weights]
      self.not_ready = waits.report_uninitialized(self.model)
      self.set_step = self.global_step.assign(self.SEEN_STEP)
    self.path = self._checkpoint()

  def _chief_start(self, last_step: int) -> tuple:
    """(the ChiefStart, its saver)."""
    with self.graph.as_default():
      start = resume.ChiefStart(self.model, self.not_ready, self.global_step,
                                sync=True, last_step=last_step)
      start.remember_steps(lambda: self.SEEN_STEP, margin=self.MARGIN)
      return start, start.saver()

  def _checkpoint(self) -> str:
    with self.graph.as_default():
      saver = tf.compat.v1.train.Saver(self.model)
      with tf.compat.v1.Session(graph=self.graph) as session:
        session.run(tf.compat.v1.variables_initializer(self.model))
        session.run(self.global_step.assign(self.CHECKPOINT_STEP))
        return saver.save(session, os.path.join(self.get_temp_dir(), "ckpt"))

  def _restore(self, saver, tokens_kept: bool) -> tuple:
    """(global step after the restore, what the chief said)."""
    output = io.StringIO()
    with tf.compat.v1.Session(graph=self.graph) as session:
      if tokens_kept:  # The global step's PS (the token queues') kept running.
        session.run([self.global_step.initializer, self.set_step])
      with contextlib.redirect_stdout(output):
        saver.restore(session, self.path)
      self.assertAllEqual(session.run(self.weights), [1.0, 2.0])
      return int(session.run(self.global_step)), output.getvalue()

  def test_with_every_ps_restarted_it_goes_back_to_the_checkpoint(self):
    start, saver = self._chief_start(last_step=1000)
    step, said = self._restore(saver, tokens_kept=False)
    self.assertEqual(step, self.CHECKPOINT_STEP)
    self.assertEqual(said, f"chief: restored {self.path}\n")  # No global step moved.
    self.assertFalse(start.resumed_mid_run)  # Fresh queues: nobody to release.

  def test_past_the_tokens_of_a_ps_that_kept_running(self):
    start, saver = self._chief_start(last_step=1000)
    step, said = self._restore(saver, tokens_kept=True)
    self.assertEqual(step, self.SEEN_STEP + self.MARGIN)
    self.assertIn(f"restored the newest checkpoint (global step "
                  f"{self.CHECKPOINT_STEP}) and moved the global step on to "
                  f"{self.SEEN_STEP + self.MARGIN}", said)
    self.assertTrue(start.resumed_mid_run)

  def test_never_past_the_last_step(self):
    _, saver = self._chief_start(last_step=self.SEEN_STEP + 1)
    step, _ = self._restore(saver, tokens_kept=True)
    self.assertEqual(step, self.SEEN_STEP + 1)


class AsyncTest(sync_testlib.SyncTestCase):

  def test_each_gradient_is_applied_on_its_own(self):
    test_cluster = InProcessCluster(num_ps=2, num_workers=2)
    chief, worker = (Replica(test_cluster, i) for i in range(2))
    # Both PS tasks hold something: the placement is part of the setting.
    devices = {v.device for v in chief.variables.values()}
    devices.add(chief.global_step.device)
    self.assertEqual(devices, {"/job:ps/task:0", "/job:ps/task:1"})
    with chief.new_session() as session:
      session.run(chief.init_op, options=run_options())
      session.run(chief.train_op, options=run_options())
    self.assertModel(worker, 1, expected_after([0], average=False))
    with worker.new_session() as session:
      session.run(worker.train_op, options=run_options())
    self.assertModel(chief, 2, expected_after([0], [1], average=False))


class SyncTest(sync_testlib.SyncTestCase):

  def _sessions(self, replicas, hooks_for=lambda r: []):
    """Chief first: a non-chief MonitoredSession polls every 30 s for it."""
    sessions = []
    for r in replicas:
      sessions.append(r.monitored_session([r.sync_hook()] + hooks_for(r)))
    return sessions

  def _close(self, sessions):
    """Non-chiefs first, then the chief; bounded."""
    start = time.monotonic()
    self.run_in_threads(
        {"close": lambda: [s.close() for s in reversed(sessions)]}, timeout=30)
    return time.monotonic() - start

  def test_two_workers_average_into_one_step(self):
    test_cluster = InProcessCluster(num_ps=2, num_workers=2)
    replicas = [Replica(test_cluster, i, sync_to_aggregate=2)
                for i in range(2)]
    sessions = self._sessions(replicas)
    self.assertModel(replicas[1], 0, INIT)

    self.step_all(replicas)
    self.assertModel(replicas[0], 1, expected_after([0, 1]))

    self.step_all(replicas)
    self.assertModel(replicas[1], 2, expected_after([0, 1], [0, 1]))

    # The chief's sync thread sits in take_grad for step 3; closing must not
    # wait out a grace period for it, as plain TF1's does.
    self.assertLess(self._close(sessions), 15)

  def test_a_lone_gradient_does_not_make_a_step(self):
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    replicas = [Replica(test_cluster, i, sync_to_aggregate=2)
                for i in range(2)]
    sessions = self._sessions(replicas)
    with self.assertRaises(tf.errors.DeadlineExceededError):
      replicas[0].session.run(replicas[0].train_op, options=run_options(1.0))
    self.assertModel(replicas[1], 0, INIT)
    self.assertLess(self._close(sessions), 15)

  def test_a_gone_replicas_tokens_stop_piling_up(self):
    # Worker 1 never comes while the chief trains alone (one gradient per
    # step): each step gives it a token, but its queue on the PS keeps 3.
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    replicas = [Replica(test_cluster, i, sync_to_aggregate=1,
                         max_waiting_tokens=3) for i in range(2)]
    sessions = self._sessions(replicas[:1])
    for _ in range(6):
      self.step_all(replicas[:1])
    self.assertEqual(self._tokens_waiting(replicas[0]), [0, 3])
    # It comes back: it empties its queue, starts at step 6 and counts once.
    sessions += self._sessions(replicas[1:])
    self.step_all(replicas[1:])
    self.assertModel(replicas[0], 7, expected_after(*[[0]] * 6, [1]))
    self.assertEqual(self._tokens_waiting(replicas[0]), [1, 0])
    self.assertLess(self._close(sessions), 15)

  def _tokens_waiting(self, replica):
    """The size of each replica's token queue on the PS."""
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(replica.global_step.device):
      sizes = [tf.queue.FIFOQueue(-1, tf.int64, shapes=(),
                                  shared_name=f"sync_token_q_{i}").size()
               for i in range(replica.info.num_workers)]
    with tf.compat.v1.Session(replica.target, graph=graph,
                              config=replica.config) as session:
      return [int(n) for n in session.run(sizes, options=run_options())]

  def test_each_release_reaches_only_the_queues_it_names(self):
    """A stopping chief frees only its own step: a token to a live worker
    would end that worker's step early and drop its next gradient."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=3)
    chief = Replica(test_cluster, 0, sync_to_aggregate=2)
    sessions = self._sessions([chief])
    optimizer = chief.sync_optimizer
    for op, expected in [(optimizer.release_own_op, [1, 0, 0]),
                         (optimizer.release_others_op, [1, 1, 1]),
                         (optimizer.release_op, [2, 2, 2])]:
      chief.session.run(op, options=run_options())
      self.assertEqual(self._tokens_waiting(chief), expected)
    self.assertLess(self._close(sessions), 15)

  def test_a_token_bound_below_one_is_refused(self):
    with self.assertRaisesRegex(ValueError, "max_waiting_tokens must be at "
                                "least 1, not 0"):
      sync_replicas.SyncOptimizer(
          tf.compat.v1.train.GradientDescentOptimizer(0.1), 1, 1, 0,
          max_waiting_tokens=0)

  def test_a_lost_workers_token_does_not_let_the_chief_train_alone(self):
    """CI, kill -9 of worker 1 in a sync run (tests/test_faults.py): killed
    after its gradient went in but before it took its token, it left that
    token to whoever took next. With TF1's one shared queue the chief took
    it, sent a second gradient for the same step, and its two made a step;
    each such step left it a spare token again, so it trained alone."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    chief, worker = (Replica(test_cluster, i, sync_to_aggregate=2)
                     for i in range(2))
    sessions = self._sessions([chief, worker])
    # Worker 1's gradient goes in; the deadline cancels its wait for a
    # token, as the kill does.
    with self.assertRaises(tf.errors.DeadlineExceededError):
      worker.session.run(worker.train_op, options=run_options(3.0))
    chief.session.run(chief.train_op, options=run_options())
    self.assertModel(chief, 1, expected_after([0, 1]))

    # The chief's next gradient waits for worker 1's, however long.
    with self.assertRaises(tf.errors.DeadlineExceededError):
      chief.session.run(chief.train_op, options=run_options(1.0))
    self.assertModel(chief, 1, expected_after([0, 1]))

    # Worker 1 comes back: a new process empties its queue (the token of
    # step 1 it never took) and starts at the global step. Its gradient makes
    # step 2 with the one the chief sent before its deadline; only then does
    # its step return, and its next gradient waits for the chief's.
    with worker.new_session() as restarted:
      restarted.run(worker.sync_optimizer.local_step_init_op,
                    options=run_options())
      restarted.run(worker.train_op, options=run_options())
      self.assertModel(chief, 2, expected_after([0, 1], [0, 1]))
      with self.assertRaises(tf.errors.DeadlineExceededError):
        restarted.run(worker.train_op, options=run_options(1.0))
    self.assertEqual(chief.read()[0], 2)
    chief.session.run(chief.train_op, options=run_options())  # Stale: dropped.
    self.assertEqual(chief.read()[0], 2)
    self.assertLess(self._close(sessions), 15)

  def test_a_restarted_chief_releases_the_others_but_not_itself(self):
    """A chief that resumes a run hands every other worker a token (they may
    be blocked in a step whose gradient it will never aggregate); a token
    of its own would let its first gradient count twice, alone."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    chief, worker = (Replica(test_cluster, i, sync_to_aggregate=2)
                     for i in range(2))
    sessions = self._sessions([chief, worker])
    self.step_all([chief, worker])
    chief.session.close()  # Its sync thread ends with it.
    with chief.graph.as_default():
      hook = chief.sync_hook(restarted=True)
      hook.begin()
    with chief.new_session() as restarted:
      hook.after_create_session(restarted, tf.compat.v1.train.Coordinator())
      with self.assertRaises(tf.errors.DeadlineExceededError):
        restarted.run(chief.train_op, options=run_options(1.0))
      # The worker's token returns its step at once; its gradient and the
      # chief's make step 2.
      worker.session.run(worker.train_op, options=run_options())
      waits.wait_until(lambda: chief.read()[0] == 2, "global step 2",
                       STEP_TIMEOUT_SECS, poll_secs=0.05)
      self.assertVariables(chief.read()[1], expected_after([0, 1], [0, 1]))
      hook.end(restarted)
    self.assertLess(self._close(sessions[1:]), 15)

  def test_a_release_token_never_makes_a_gradient_count_twice(self):
    """A chief that resumes a run releases the other replicas, which may be
    blocked in a step; one that was not (it had just started) finds the
    token at the end of its first step. Its step returns, but its next
    gradient must not count in the same global step as its first."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    chief, worker = (Replica(test_cluster, i, sync_to_aggregate=2)
                     for i in range(2))
    sessions = self._sessions([chief, worker])
    self.step_all([chief, worker])
    chief.session.run(chief.sync_optimizer.release_others_op,
                      options=run_options())
    worker.session.run(worker.train_op, options=run_options())  # The release.
    with self.assertRaises(tf.errors.DeadlineExceededError):
      worker.session.run(worker.train_op, options=run_options(1.0))
    self.assertModel(chief, 1, expected_after([0, 1]))
    # The worker's first gradient of step 1 waits in the accumulators: with
    # the chief's, it makes step 2.
    chief.session.run(chief.train_op, options=run_options())
    self.assertModel(chief, 2, expected_after([0, 1], [0, 1]))
    self.assertLess(self._close(sessions), 15)

  def test_a_straggler_skips_to_the_newest_token(self):
    test_cluster = InProcessCluster(num_ps=1, num_workers=3)
    replicas = [Replica(test_cluster, i, sync_to_aggregate=2)
                for i in range(3)]
    sessions = self._sessions(replicas)
    self.step_all(replicas[:2])
    self.step_all(replicas[:2])
    self.assertEqual(replicas[0].read()[0], 2)
    # Worker 2's gradient of step 0 is stale; its queue holds the tokens of
    # steps 1 and 2 and it keeps the newest, so its next gradient is fresh:
    # with the chief's, it makes step 3. Had it kept the oldest, it would
    # send a stale gradient for each token it missed.
    self.step_all(replicas[2:])
    self.step_all([replicas[0], replicas[2]])
    self.assertModel(replicas[1], 3, expected_after([0, 1], [0, 1], [0, 2]))
    self.assertLess(self._close(sessions), 15)

  def test_backup_worker_gradient_is_dropped(self):
    test_cluster = InProcessCluster(num_ps=2, num_workers=3)
    replicas = [Replica(test_cluster, i, sync_to_aggregate=2)
                for i in range(3)]
    # All three sessions start at step 0, so worker 2's local step is 0.
    sessions = self._sessions(replicas)

    self.step_all(replicas[:2])
    self.assertModel(replicas[2], 1, expected_after([0, 1]))

    # The straggler's gradient (computed at step 0) is stale: dropped, and it
    # still gets a token (each step gives every replica one), so it returns.
    self.step_all(replicas[2:])
    self.assertModel(replicas[0], 1, expected_after([0, 1]))

    # Step 2 holds nothing of the stale gradient: workers 0 and 1 again.
    self.step_all(replicas[:2])
    self.assertModel(replicas[1], 2, expected_after([0, 1], [0, 1]))
    self.assertLess(self._close(sessions), 15)

  def test_any_two_of_three_make_a_step(self):
    test_cluster = InProcessCluster(num_ps=1, num_workers=3)
    replicas = [Replica(test_cluster, i, sync_to_aggregate=2)
                for i in range(3)]
    sessions = self._sessions(replicas)
    self.step_all([replicas[0], replicas[2]])
    self.assertModel(replicas[1], 1, expected_after([0, 2]))
    self.assertLess(self._close(sessions), 15)


if __name__ == "__main__":
  tf.test.main()
