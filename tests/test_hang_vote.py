"""Sync replicas agree that every one of them is stuck before any starts again for it.

In-process servers: 1 PS and 3 workers, each worker voting through its own server as a
replica's stall watch does.
"""

import contextlib
import io
import socket
import time

from absl.testing import absltest
import tensorflow as tf

from ps_trainer.cluster import ps_flags
from ps_trainer.cluster import server as server_lib
from ps_trainer.faults import hang_vote
from ps_trainer.faults import ps_runs
from ps_trainer.graph import placement
from ps_trainer.settings import cluster
import inprocess_cluster
import testutil

tf.compat.v1.disable_eager_execution()

ALL_STUCK = "so were the steps of all 3 replicas"
FOLLOWED = "another replica found every replica's step stuck as long"


class HangVoteTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cluster = inprocess_cluster.InProcessCluster(num_ps=1, num_workers=3)

  def setUp(self):
    super().setUp()
    # What PS 0 does when it starts: the flags of the test before are gone.
    ps_flags.init_done_flags(self.cluster.ps_targets[0], self.cluster.info("ps", 0))
    infos = [self.cluster.info("worker", i) for i in range(3)]
    self.votes = [hang_vote.HangVote(ps_runs.PsRuns(self.cluster.targets[i], info), info)
                  for i, info in enumerate(infos)]

  def flags(self):
    """PS 0's hang flags: one per replica, then the count of agreed restarts."""
    return list(ps_flags.run_on_ps(
        self.cluster.targets[0], self.cluster.info("worker", 0), [0], 10,
        lambda: ps_flags.hang_flags(3).read_value()))

  def test_the_last_replica_stuck_decides_and_the_others_follow(self):
    self.assertEqual(self.flags(), [0, 0, 0, 0])
    self.assertIsNone(self.votes[0].verdict(may_decide=True))
    self.assertIsNone(self.votes[1].verdict(may_decide=True))
    self.assertEqual(self.flags(), [1, 1, 0, 0])
    self.assertEqual(self.votes[2].verdict(may_decide=True), ALL_STUCK)
    self.assertEqual(self.flags(), [0, 0, 0, 1])  # Cleared, and one agreed restart.
    # A replica that follows needs no answer from its peers: they are starting again.
    self.assertEqual(self.votes[0].verdict(may_decide=False), FOLLOWED)
    self.assertEqual(self.votes[1].verdict(may_decide=True), FOLLOWED)

  def test_a_replica_out_of_its_step_or_a_silent_peer_keeps_the_others_waiting(self):
    self.assertIsNone(self.votes[0].verdict(may_decide=True))
    self.votes[0].leave()  # Its step ended: a chief's save, say, holds up the others.
    self.assertIsNone(self.votes[1].verdict(may_decide=True))
    self.assertIsNone(self.votes[2].verdict(may_decide=True))
    self.assertEqual(self.flags(), [0, 1, 1, 0])
    # Stuck again, but a peer does not answer: its flag is set, nobody decides.
    self.assertIsNone(self.votes[0].verdict(may_decide=False))
    self.assertEqual(self.flags(), [1, 1, 1, 0])
    self.assertIsNone(self.votes[1].verdict(may_decide=False))
    self.assertEqual(self.votes[1].verdict(may_decide=True), ALL_STUCK)
    self.assertEqual(self.votes[2].verdict(may_decide=True), FOLLOWED)

  def test_a_replica_in_its_first_steps_joins_only_a_vote_begun(self):
    self.assertIsNone(self.votes[0].verdict(may_decide=True, may_begin=False))
    self.assertEqual(self.flags(), [0, 0, 0, 0])  # A slow first step: no vote begins.
    self.assertIsNone(self.votes[1].verdict(may_decide=True))
    self.assertIsNone(self.votes[2].verdict(may_decide=True, may_begin=False))
    self.assertEqual(self.votes[0].verdict(may_decide=True, may_begin=False), ALL_STUCK)

  def test_leave_clears_a_set_flag_and_a_ps_started_again_is_no_agreement(self):
    self.assertTrue(self.votes[0].leave())  # Nothing to clear.
    self.assertIsNone(self.votes[0].verdict(may_decide=True))
    self.assertIsNone(self.votes[1].verdict(may_decide=True))
    self.assertTrue(self.votes[0].leave())
    self.assertEqual(self.flags(), [0, 1, 0, 0])
    for vote in self.votes:
      vote.verdict(may_decide=True)  # An agreement: the count is 1.
    self.assertTrue(self.votes[0].leave())  # Its new session.
    self.assertIsNone(self.votes[0].verdict(may_decide=True))  # Stuck again, at count 1.
    # PS 0 started again: its flags and count are zero, which is not a count moved on.
    ps_flags.init_done_flags(self.cluster.ps_targets[0], self.cluster.info("ps", 0))
    self.assertIsNone(self.votes[0].verdict(may_decide=True))

  def test_the_global_step_is_read_where_the_training_graph_placed_it(self):
    two_ps = inprocess_cluster.InProcessCluster(num_ps=2, num_workers=1)
    info = two_ps.info("worker", 0)
    graph = tf.Graph()
    with graph.as_default():
      # Placed as train_graph places it; a larger variable first takes PS 0.
      with tf.compat.v1.device(placement.device_function(info)):
        tf.compat.v1.get_variable("filler", [1000])
        step = tf.compat.v1.train.get_or_create_global_step()
      moved = step.assign_add(37)
    with tf.compat.v1.Session(two_ps.targets[0], graph=graph,
                              config=server_lib.session_config(info)) as session:
      session.run(step.initializer)
      session.run(moved)
    self.assertEqual(tf.DeviceSpec.from_string(step.device).task, 1)
    read = ps_runs.global_step_reader(ps_runs.PsRuns(two_ps.targets[0], info), step.device)
    self.assertEqual(read(), 37)

  def test_a_vote_with_ps_0_gone_waits_on_at_once(self):
    ps_port, worker_port = testutil.pick_free_ports(2)
    info = cluster.from_flags(f"127.0.0.1:{ps_port}", f"127.0.0.1:{worker_port}", "worker", 0)
    runs = ps_runs.PsRuns("grpc://127.0.0.1:1", info, timeout_secs=5)
    vote = hang_vote.HangVote(runs, info)
    started = time.monotonic()
    with contextlib.redirect_stderr(io.StringIO()):
      self.assertIsNone(vote.verdict(may_decide=True))
      self.assertFalse(vote.leave())
      self.assertIsNone(ps_runs.global_step_reader(runs, "/job:ps/task:0")())
    self.assertLess(time.monotonic() - started, 5)


  def test_a_ps_that_accepts_connections_but_never_serves_costs_one_bounded_wait(self):
    # A PS stopped with SIGSTOP, say: the kernel still accepts its connections, and TF would
    # wait for it without a bound.
    silent_ps = socket.socket()
    self.addCleanup(silent_ps.close)
    silent_ps.bind(("127.0.0.1", 0))
    silent_ps.listen(16)
    (worker_port,) = testutil.pick_free_ports(1)
    hosts = (f"127.0.0.1:{silent_ps.getsockname()[1]}", f"127.0.0.1:{worker_port}")
    info = cluster.from_flags(*hosts, "worker", 0)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
      runs = ps_runs.PsRuns(server_lib.start_server(info).target, info, timeout_secs=1)
      self.addCleanup(self.end_the_waiting_run, runs, hosts, silent_ps)
      started = time.monotonic()
      self.assertIsNone(ps_runs.global_step_reader(runs, "/job:ps/task:0")())
      first = time.monotonic() - started
      # While that run waits, no other starts: the vote waits on at once, without a warning.
      self.assertIsNone(hang_vote.HangVote(runs, info).verdict(may_decide=True))
      second = time.monotonic() - started - first
    self.assertGreaterEqual(first, 1)
    self.assertLess(first, 3)
    self.assertLess(second, 0.5)
    warnings = [line for line in stderr.getvalue().splitlines() if "could not" in line]
    self.assertEqual(warnings, ["ps_trainer: warning: worker 0: could not read the global step "
                                "on ps 0: no answer within 1 s"])

  def end_the_waiting_run(self, runs: ps_runs.PsRuns, hosts, silent_ps: socket.socket):
    """The run the test left waiting on the silent PS would wait as long as the process lives,
    TF logging every 10 s that it waits (which shows between tests on a pytest-xdist worker): a
    real PS on that port lets it end. That server stays until the process ends, as TF's do."""
    silent_ps.close()
    waiting = runs._running  # pylint: disable=protected-access
    if waiting is None or not waiting.is_alive():
      return
    try:
      server_lib.start_server(cluster.from_flags(*hosts, "ps", 0), warn_if_exposed=False)
    except server_lib.ServerError:
      return  # Another process took the port in between: the run waits on, harmless.
    waiting.join(timeout=10)
    self.assertFalse(waiting.is_alive(), "the run on the silent PS still waits with a PS there")


if __name__ == "__main__":
  absltest.main()
