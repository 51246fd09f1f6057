"""The end of a synchronous run on an in-process cluster: nobody hangs.

The replicas, their known gradients and the expected variables are in
sync_testlib.py.
"""

import contextlib
import io
import threading
import time
from unittest import mock

from absl.testing import absltest
import tensorflow as tf

from ps_trainer.cluster import ps_flags
from ps_trainer.faults import sync_end
from ps_trainer.training import hooks as hooks_lib
from ps_trainer.training import session as session_lib
from ps_trainer.training import sync
from inprocess_cluster import InProcessCluster
import sync_testlib
from sync_testlib import (INIT, THREAD_TIMEOUT_SECS, BoundedThread, FakeStop,
                          Replica, expected_after, run_options)

tf.compat.v1.disable_eager_execution()


class _ModelProbe(tf.compat.v1.train.SessionRunHook):
  """At the session's end: the global step, again half a second later, and
  the step of the newest checkpoint in `log_dir`; then calls `then`."""

  def __init__(self, replica, log_dir, then):
    self._replica = replica
    self._log_dir = log_dir
    self._then = then
    self.steps = None

  def end(self, session):
    try:
      at_end, _ = self._replica.read()
      time.sleep(0.5)
      later, _ = self._replica.read()
      saved = tf.train.load_variable(
          tf.train.latest_checkpoint(self._log_dir), "global_step")
      self.steps = (at_end, later, int(saved))
    finally:
      self._then()


class _ReleasesNothing:
  """A session whose release op runs, and no other worker ever says done."""

  def run(self, unused_fetches):
    return None


class OthersGoneAtTheEndTest(absltest.TestCase):
  """The chief's end when the other workers crashed without saying done."""

  def said(self, num_workers: int, gone: bool = True, stopping: bool = False) -> str:
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
      sync_end.release_workers(_ReleasesNothing(), "release", others=num_workers - 1,
                               workers_done=lambda _: 0, others_gone=lambda: gone,
                               bound_secs=120 if gone else 0.5, stopping=stopping)
    return output.getvalue()

  def test_the_chief_names_them_and_ends_the_run(self):
    self.assertEqual(self.said(2), "chief: the other worker to finish its last synchronous step, "
                     "but it does not answer; ending the run without it\n")
    self.assertEqual(self.said(3), "chief: 2 of 2 other workers to finish their last synchronous "
                     "step, but none of them answers; ending the run without them\n")

  def test_a_stopping_chief_says_it_stops_without_them_not_that_the_run_ends(self):
    # Only the chief was stopped: the other worker trains on, and says nothing.
    self.assertEqual(self.said(2, gone=False, stopping=True), (
        "chief: gave up after 0 s waiting for the other worker to finish its last synchronous "
        "step; stopping without it: one that trains on waits for this chief to be started "
        "again\n"))
    self.assertIn("ps_trainer: warning: gave up after 0 s waiting for the other worker to "
                  "finish its last synchronous step; ending the run without it",
                  self.said(2, gone=False))


class ReleaseBoundTest(absltest.TestCase):
  """How long the chief's end hands out tokens: the drain bound, or a stop's shorter one."""

  def bound_used(self, stop, last_step_applied=False) -> float:
    hook = sync.SyncReplicasHook(None, is_chief=True, num_workers=3, session_factory=None,
                                 workers_done=lambda _: 0, stop=stop,
                                 drain_timeout_secs=120, stopping_drain_secs=8)
    hook._release_op = "release"  # pylint: disable=protected-access
    if last_step_applied:
      hook._last_step_applied.set()  # pylint: disable=protected-access
    with mock.patch.object(sync_end, "release_workers") as release:
      hook.end(_ReleasesNothing())
    release.assert_called_once()
    (session, op, others, _, _, bound), kwargs = release.call_args
    self.assertEqual((op, others), ("release", 2))
    self.assertIsInstance(session, _ReleasesNothing)
    return bound, kwargs["stopping"]

  def test_a_run_that_ends_waits_the_drain_bound_and_a_stopped_one_less(self):
    self.assertEqual(self.bound_used(None), (120, False))
    self.assertEqual(self.bound_used(FakeStop(requested=False)), (120, False))
    self.assertEqual(self.bound_used(FakeStop(requested=True)), (8, True))
    # A stop in the run's last step: the run ends all the same, and says so.
    self.assertEqual(self.bound_used(FakeStop(requested=True), last_step_applied=True),
                     (8, False))


class CleanEndTest(sync_testlib.SyncTestCase):
  """The end of a sync run: every replica returns, nobody hangs (as in plain TF1).

  Wired as trainer.train wires it: StopAtStepHook and SyncReplicasHook in a
  MonitoredTrainingSession; after the session closes, each replica sets its
  done flag on every PS (ps_flags.signal_done); the chief's hook counts the
  others' flags on PS 0 (DoneSignals.others_done) and hands out sync tokens
  until every other replica has finished.
  """

  TRAIN_STEPS = 6

  def _run(self, num_workers, straggler=None):
    """Trains to TRAIN_STEPS; `straggler` runs one step more after stopping.

    The extra step stands for a replica still inside its last step when the
    chief stops: its gradient can never be aggregated, so only the chief's
    release tokens let it return.
    """
    test_cluster = InProcessCluster(num_ps=2, num_workers=num_workers)
    replicas = [Replica(test_cluster, i, sync_to_aggregate=num_workers)
                for i in range(num_workers)]
    for r in replicas:
      r.monitored_session([hooks_lib.StopAtStepHook(self.TRAIN_STEPS),
                           r.sync_hook(done_count=True,
                                       drain_timeout_secs=30)])

    threads = self.run_in_threads(
        {f"worker {r.info.task_index}":
             (lambda r=r: self._train_to_end(
                 r, extra_step=r.info.task_index == straggler))
         for r in replicas})
    step, _ = replicas[0].read()
    self.assertEqual(step, self.TRAIN_STEPS)
    self.assertEqual(replicas[0].done_counts(), [num_workers] * 2)
    for thread in threads.values():
      steps, close_secs = thread.result
      # Every step waits for every replica, and a replica takes only its
      # own tokens: one gradient each per global step, never two.
      self.assertEqual(steps, self.TRAIN_STEPS, thread.name)
      # No grace period waited out for the chief's sync thread, and the
      # chief waits for the others only as long as they need.
      self.assertLess(close_secs, 15, thread.name)
    return threads

  def _train_to_end(self, r, extra_step=False):
    """Steps until the hooks stop it, closes, says done: (steps, close secs).

    `extra_step`: one more step after stopping, outside the session.
    """
    steps = 0
    while not r.session.should_stop():
      r.session.run(r.train_op, options=run_options())
      steps += 1
    if extra_step:
      with r.new_session() as raw:
        raw.run(r.train_op, options=run_options())
    return steps, self._leave(r)

  def _leave(self, r):
    """Closes r's session and sets its done flags, as trainer.train does
    after its loop: the close's seconds."""
    start = time.monotonic()
    r.session.close()
    close_secs = time.monotonic() - start
    ps_flags.signal_done(r.target, r.info, finished=True, timeout_secs=10)
    return close_secs

  def test_two_workers_stop_at_the_last_step(self):
    self._run(num_workers=2)

  def test_worker_inside_its_last_step_is_released(self):
    self._run(num_workers=2, straggler=1)

  def test_three_workers_with_a_straggler(self):
    self._run(num_workers=3, straggler=2)

  def test_a_chief_step_spanning_the_last_two_steps_is_the_last(self):
    """CI, 1 PS + 3 workers, 2 per step: the chief's step began at global
    step N-2 and got a token of N, so TF's StopAtStepHook (read + 1 < N)
    let it start another step, whose fresh gradient waited for a partner
    that had gone home. Here, with a last step of 2, the chief's step reads
    step 0 and waits while workers 1 and 2 make both steps; its queue then
    holds the tokens of steps 1 and 2, and nothing but the sync thread's
    release at the last step would let a second chief step return."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=3)
    chief = Replica(test_cluster, 0, sync_to_aggregate=2, gated=True)
    workers = [Replica(test_cluster, i, sync_to_aggregate=2)
               for i in (1, 2)]
    chief.monitored_session([
        hooks_lib.StopAtStepHook(2),
        chief.sync_hook(done_count=True, last_step=2)])
    for w in workers:
      w.monitored_session([w.sync_hook()])

    chief_thread = BoundedThread("chief", lambda: self._train_to_end(chief)[0])
    chief_thread.start()
    with chief.new_session() as probe:
      self.assertEqual(probe.run(chief.next_read_seen, options=run_options()), 0)
      self.step_all(workers)  # Step 1.
      self.step_all(workers)  # Step 2, the last.
      probe.run(chief.open_gate, options=run_options())
      for w in workers:
        self._leave(w)
      chief_thread.join(THREAD_TIMEOUT_SECS)
    self.assertFalse(chief_thread.is_alive(), "the chief still runs")
    self.assertIsNone(chief_thread.error, chief_thread.error)
    # The gated step, and at most one more: if the gated step returned
    # before the sync thread flagged the last step, the chief starts
    # another, and only the release at the last step ends it.
    self.assertBetween(chief_thread.result, 1, 2)
    # Nothing aggregated past the last step.
    self.assertModel(chief, 2, expected_after([1, 2], [1, 2]))

  def test_a_stopping_chief_does_not_wait_for_a_worker_that_stopped_first(self):
    """A signal reaches the tasks one by one: worker 1 stopped after step 1,
    while the chief, stopped a moment later, had begun step 2, which needs
    worker 1's gradient. It waited out its 20 s grace period and ended with
    a last-resort checkpoint; now it hands out tokens a second into the stop,
    and its step returns without making a global step."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    chief, worker = (Replica(test_cluster, i, sync_to_aggregate=2)
                     for i in range(2))
    stop = FakeStop()
    chief.monitored_session([hooks_lib.StopOnRequestHook(stop),
                             chief.sync_hook(done_count=True, stop=stop)])
    worker.monitored_session([worker.sync_hook()])
    self.step_all([chief, worker])
    self._leave(worker)
    chief_thread = BoundedThread("chief", lambda: self._train_to_end(chief))
    chief_thread.start()
    time.sleep(1.0)
    self.assertTrue(chief_thread.is_alive(), "the chief's step 2 never blocked")
    stop.requested = True
    stopped_at = time.monotonic()
    chief_thread.join(THREAD_TIMEOUT_SECS)
    self.assertFalse(chief_thread.is_alive(), "the chief still runs")
    self.assertIsNone(chief_thread.error, chief_thread.error)
    # Well inside the STEP_TIMEOUT_SECS a step of _train_to_end may take.
    self.assertLess(time.monotonic() - stopped_at, 10)
    self.assertEqual(chief_thread.result[0], 1)  # The released step 2.
    self.assertModel(chief, 1, expected_after([0, 1]))

  def test_no_step_lands_after_a_stopping_chiefs_final_checkpoint(self):
    """Only the chief is stopped; two backups go on training, 2 of 3 per
    step. The saver's end used to come before the sync thread stopped, so
    the model moved on during and after the final checkpoint. Wired as
    trainer.py wires the chief (session.monitored_session: chief hooks, the
    saver, then the others), a probe after the saver sees the model hold
    still at the checkpoint's step while the workers keep sending."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=3)
    chief, *workers = (Replica(test_cluster, i, sync_to_aggregate=2)
                       for i in range(3))
    stop = FakeStop()
    log_dir = self.get_temp_dir()
    leave = threading.Event()
    sync_hook = chief.sync_hook(done_count=True, stop=stop)
    probe = _ModelProbe(chief, log_dir, then=leave.set)
    with chief.graph.as_default():
      session = session_lib.monitored_session(
          who="chief", is_chief=True, target=chief.target,
          config=chief.config, scaffold=tf.compat.v1.train.Scaffold(),
          hooks=[hooks_lib.StopOnRequestHook(stop), probe, sync_hook],
          chief_hooks=[sync_hook.final_checkpoint_guard()], log_dir=log_dir,
          save_checkpoint_secs=None, save_checkpoint_steps=10_000,
          save_summaries_steps=10_000, before_session=lambda: None)
    chief.session = session
    for w in workers:
      w.monitored_session([w.sync_hook()])

    def chief_run():
      for _ in range(3):
        session.run(chief.train_op, options=run_options())
      stop.requested = True
      return self._train_to_end(chief)

    def worker_run(w):
      steps = 0
      while not leave.is_set():  # Past the chief's stop, until the probe.
        w.session.run(w.train_op, options=run_options())
        steps += 1
      self._leave(w)
      return steps

    threads = self.run_in_threads(
        {"chief": chief_run,
         **{f"worker {w.info.task_index}": (lambda w=w: worker_run(w))
            for w in workers}})
    self.assertIsNotNone(probe.steps, "the probe never ran")
    at_end, half_a_second_later, saved = probe.steps
    self.assertGreaterEqual(at_end, 4)
    self.assertEqual(half_a_second_later, at_end)
    self.assertEqual(saved, at_end)
    self.assertLess(threads["chief"].result[1], 15)  # The close's seconds.

  def test_a_session_that_ended_on_an_error_leaves_no_sync_thread_after_close(self):
    # TF skips end() when the session closes on an error (a NaN, a lost PS): trainer.run then
    # calls close(), or the thread would stay blocked, inside process_end.tf_work(), and the
    # task's exit would wait for it.
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    chief = Replica(test_cluster, 0, sync_to_aggregate=2)
    hook = chief.sync_hook()
    chief.monitored_session([hook])
    aggregating = hook._thread  # pylint: disable=protected-access
    self.assertTrue(aggregating.is_alive())  # Waiting for the first step's gradients.
    started = time.monotonic()
    hook.close()
    aggregating.join(10)
    self.assertFalse(aggregating.is_alive(), "the sync thread still runs")
    self.assertLess(time.monotonic() - started, 10)
    hook.close()  # Again, or after end(): nothing left to stop.

  def test_chief_gives_up_on_a_silent_worker(self):
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    chief = Replica(test_cluster, 0, sync_to_aggregate=2)
    # Nothing to train (last step 0): the chief goes straight to the end and
    # waits for worker 1's done token, which never comes.
    session = chief.monitored_session([
        hooks_lib.StopAtStepHook(0),
        chief.sync_hook(done_count=True, drain_timeout_secs=1.5)])
    self.assertTrue(session.should_stop())
    threads = self.run_in_threads({"close": session.close}, timeout=30)
    self.assertBetween(threads["close"].seconds, 1.5, 10)
    self.assertModel(chief, 0, INIT)


if __name__ == "__main__":
  tf.test.main()
