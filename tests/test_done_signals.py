"""A replica that leaves tells every PS that answers it is done, and never waits for one that doesn't;
one that starts again is not done until it says so again.

In-process servers: a worker, and PS tasks of which some were never started.
"""

import contextlib
import io
import threading
import types
from unittest import mock

from absl.testing import absltest
import tensorflow as tf

from ps_trainer.cluster import ps_flags
from ps_trainer.cluster import server as server_lib
from ps_trainer.faults import peers
from ps_trainer.settings import cluster
import testutil

tf.compat.v1.disable_eager_execution()


def _ps_and_worker_1():
  """In-process servers of PS 0 (its done flags made) and worker 1 of a 1 PS + 2 workers
  cluster; worker 0, the chief, is not started. (ps info, its target, worker 1's info, its
  target, the workers' ports)."""
  ps_port, *worker_ports = testutil.pick_free_ports(3)
  hosts = (f"127.0.0.1:{ps_port}", ",".join(f"127.0.0.1:{p}" for p in worker_ports))
  ps = cluster.from_flags(*hosts, "ps", 0)
  ps_target = server_lib.start_server(ps).target
  ps_flags.init_done_flags(ps_target, ps)
  worker1 = cluster.from_flags(*hosts, "worker", 1)
  return ps, ps_target, worker1, server_lib.start_server(worker1).target, worker_ports


class DoneSignalsTest(absltest.TestCase):

  def _leave(self, info, bound_secs=15):
    """Runs signal_done for `info`'s worker in a thread; returns the warnings it printed."""
    target = server_lib.start_server(info).target
    # Before, creating the session waited for an absent PS without bound (a worker stopped while
    # it waited for its PS stayed until its 20 s grace ran out); a thread keeps this test bounded.
    leaving = threading.Thread(
        target=ps_flags.signal_done, args=(target, info, True),
        kwargs={"timeout_secs": 5}, daemon=True)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
      leaving.start()
      leaving.join(timeout=bound_secs)
    self.assertFalse(leaving.is_alive(), f"signal_done still waits after {bound_secs} s")
    return stderr.getvalue()

  def test_a_worker_whose_ps_never_came_leaves_at_once(self):
    ps_port, worker_port = testutil.pick_free_ports(2)
    info = cluster.from_flags(f"127.0.0.1:{ps_port}", f"127.0.0.1:{worker_port}", "worker", 0)
    warnings = self._leave(info)
    # As the trainer's other lines read, not in absl's format ("W1125 13:36:42.23 ... ps_flags.py:139]").
    self.assertIn(f"\nps_trainer: warning: could not tell ps 0 at 127.0.0.1:{ps_port} that this "
                  "worker is done: not answering\n", "\n" + warnings)

  def test_the_ps_tasks_that_answer_are_told_though_one_is_missing(self):
    ps0_port, ps1_port, worker_port = testutil.pick_free_ports(3)
    hosts = (f"127.0.0.1:{ps0_port},127.0.0.1:{ps1_port}", f"127.0.0.1:{worker_port}")
    ps0 = cluster.from_flags(*hosts, "ps", 0)
    ps0_target = server_lib.start_server(ps0).target
    ps_flags.init_done_flags(ps0_target, ps0)  # As run_ps does first.

    warnings = self._leave(cluster.from_flags(*hosts, "worker", 0))

    self.assertIn(f"ps_trainer: warning: could not tell ps 1 at 127.0.0.1:{ps1_port} that",
                  warnings)
    self.assertNotIn("ps 0", warnings)
    # PS 0 can finish without ps 1.
    self.assertEqual(self._flags(ps0_target, ps0, 1), [ps_flags.FINISHED])

  def test_a_replica_started_again_is_not_done_until_it_says_so_again(self):
    ps, ps_target, worker1, worker1_target, _ = _ps_and_worker_1()

    # Stopped by a SIGTERM.
    ps_flags.signal_done(worker1_target, worker1, finished=False, timeout_secs=5)
    self.assertEqual(self._flags(ps_target, ps, 2), [0, ps_flags.STOPPED])
    ps_flags.clear_done(worker1_target, worker1)  # Started again, before its session.
    self.assertEqual(self._flags(ps_target, ps, 2), [0, 0])
    ps_flags.signal_done(worker1_target, worker1, finished=True, timeout_secs=5)
    self.assertEqual(self._flags(ps_target, ps, 2), [0, ps_flags.FINISHED])

  def test_a_replica_waits_for_a_ps_that_has_not_yet_made_its_flags(self):
    # A PS listens a moment before it creates its flags; a chief that saw its port answer
    # used to fail the run with NotFoundError there.
    ps_port, *worker_ports = testutil.pick_free_ports(3)
    hosts = (f"127.0.0.1:{ps_port}", ",".join(f"127.0.0.1:{p}" for p in worker_ports))
    ps = cluster.from_flags(*hosts, "ps", 0)
    ps_target = server_lib.start_server(ps).target
    chief = cluster.from_flags(*hosts, "worker", 0)
    chief_target = server_lib.start_server(chief).target

    with self.assertRaisesRegex(tf.errors.UnavailableError,
                                r"^a PS did not take this replica's done flag: "):
      ps_flags.clear_done(chief_target, chief, timeout_secs=1)  # No flags made: retried.
    making = threading.Timer(1.0, ps_flags.init_done_flags, args=(ps_target, ps))
    making.start()
    self.addCleanup(making.cancel)
    ps_flags.clear_done(chief_target, chief, timeout_secs=30)
    making.join()
    self.assertEqual(self._flags(ps_target, ps, 2), [0, 0])

  def _flags(self, ps_target: str, ps: cluster.ClusterInfo, num_workers: int) -> list:
    """PS 0's done flags, read as the PS reads them."""
    graph = tf.Graph()
    with graph.as_default():
      flags = ps_flags.done_flags(0, num_workers)
    with tf.compat.v1.Session(ps_target, graph=graph, config=server_lib.session_config(ps)) as s:
      return [int(f) for f in s.run(flags.read_value())]


class ChiefGoneTest(absltest.TestCase):
  """An async worker that ends the run after its chief died, or was stopped, says its steps
  are unsaved."""

  def test_a_chief_that_refuses_connections_without_saying_done_is_gone(self):
    ps, ps_target, worker1, worker1_target, worker_ports = _ps_and_worker_1()
    cfg = types.SimpleNamespace(cluster=worker1, train=types.SimpleNamespace(wait_timeout_secs=20))
    others = peers.Peers(cfg, None, worker1_target, None, None)
    chief = f"worker 0 at 127.0.0.1:{worker_ports[0]}"
    with mock.patch.object(peers, "CHIEF_BACK_SECS", 0.5):
      self.assertEqual(others.chief_gone(), chief)
      # A chief stopped before the run's end saved only until its stop.
      self._chief_says(ps, ps_target, ps_flags.STOPPED)
      self.assertEqual(others.chief_gone(), chief)
      # One that finished the run saved all of it.
      self._chief_says(ps, ps_target, ps_flags.FINISHED)
      self.assertEqual(others.chief_gone(), "")

  def _chief_says(self, ps, ps_target, value):
    ps_flags.run_on_ps(ps_target, ps, [0], 5,
                       lambda: ps_flags.done_flags(0, 2)[0].assign(value))


class LastResortTest(absltest.TestCase):

  def test_a_replica_forced_out_after_it_finished_still_says_it_finished(self):
    info = cluster.from_flags("127.0.0.1:1", "127.0.0.1:2,127.0.0.1:3", "worker", 1)
    cfg = types.SimpleNamespace(cluster=info, train=types.SimpleNamespace(wait_timeout_secs=20))
    resorts = []
    stop = types.SimpleNamespace(
        requested=False,
        add_last_resort=lambda action, what, before_restart=True: resorts.append(action))
    said = []
    with mock.patch.object(ps_flags, "signal_done",
                           lambda target, info, finished, timeout_secs: said.append(finished)):
      others = peers.Peers(cfg, None, "", None, stop)
      others.add_last_resorts()
      (say_done,) = resorts
      say_done()  # Forced out mid-run.
      others.leave(finished=True)
      say_done()  # Forced out later, in its export say: the PS must not keep the run for it.
    self.assertEqual(said, [False, True, True])


if __name__ == "__main__":
  absltest.main()
