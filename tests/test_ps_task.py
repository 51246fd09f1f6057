"""A task's server and the PS task's life on its own: a port already taken, the warning that a
server listens on every interface, and run_ps, which never waits forever (vanished workers,
done flags and stop requests end it). In-process servers and listening sockets; the replicas'
updates are in test_sync.py.
"""

import contextlib
import io
import json
import socket
import threading
import time
from unittest import mock

import tensorflow as tf

from ps_trainer.cluster import ps_flags
from ps_trainer.cluster import ps_task
from ps_trainer.cluster import server as server_lib
from ps_trainer.cluster import waits
from ps_trainer.settings import cluster
from inprocess_cluster import InProcessCluster
from sync_testlib import FakeStop
import testutil

tf.compat.v1.disable_eager_execution()


class ServerStartTest(tf.test.TestCase):

  def test_a_taken_port_is_one_line_naming_task_and_port(self):
    (port,) = testutil.pick_free_ports(1)
    holder = socket.socket()
    holder.bind(("", port))
    holder.listen()
    self.addCleanup(holder.close)
    info = cluster.from_flags(f"127.0.0.1:{port}", "127.0.0.1:1", "ps", 0)
    with self.assertRaisesRegex(
        server_lib.ServerError,
        rf"^ps 0 cannot listen on port {port} \(127\.0\.0\.1:{port}\): "
        r"Address already in use; another process holds it"):
      server_lib.start_server(info)

  def test_a_task_warns_that_its_server_is_exposed_and_a_test_cluster_does_not(self):
    def started(start):
      err = io.StringIO()
      with mock.patch.object(socket, "if_nameindex", return_value=[(1, "lo"), (2, "eth0")]), \
          contextlib.redirect_stderr(err):
        start()
      return err.getvalue()
    (port,) = testutil.pick_free_ports(1)
    info = cluster.from_flags(f"127.0.0.1:{port}", "127.0.0.1:1", "ps", 0)
    self.assertRegex(started(lambda: server_lib.start_server(info)),
                     rf"^ps_trainer: warning: this task's TensorFlow server listens on port {port} "
                     "of every network interface, without authentication")
    self.assertEqual(started(lambda: InProcessCluster(num_ps=1, num_workers=1)), "")


class PsLifecycleTest(tf.test.TestCase):
  """run_ps never waits forever: vanished workers and stop requests end it."""

  def ps_info(self, num_workers: int) -> tuple:
    """(PS 0's ClusterInfo, its port, the workers' ports); nobody listens on the workers'."""
    ps_port, *worker_ports = testutil.pick_free_ports(1 + num_workers)
    info = cluster.from_flags(
        f"127.0.0.1:{ps_port}", ",".join(f"127.0.0.1:{p}" for p in worker_ports), "ps", 0)
    return info, ps_port, worker_ports

  def start_ps(self, info, stop, output: io.StringIO, **run_ps_args) -> tuple:
    """run_ps on a thread, under the caller's redirect of stdout to `output`; returns
    (the thread, the list its status goes to) once the PS serves."""
    statuses = []
    ps = threading.Thread(target=lambda: statuses.append(ps_task.run_ps(
        info, stop, poll_secs=0.05, probe_every_secs=0.1, **run_ps_args)), daemon=True)
    ps.start()
    waits.wait_until(lambda: f"waiting for {info.num_workers} worker(s)" in output.getvalue(),
                     "the PS", 60)
    return ps, statuses

  def run_ps(self, stop, wait_timeout_secs=60.0, num_workers=2):
    info, _, worker_ports = self.ps_info(num_workers)
    output = io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(output):
      status = ps_task.run_ps(info, stop, wait_timeout_secs, poll_secs=0.05,
                                 probe_every_secs=0.1)
    return status, time.monotonic() - start, output.getvalue().splitlines(), worker_ports

  def test_gives_up_when_no_worker_answers_for_the_bound(self):
    status, secs, lines, (w0, w1) = self.run_ps(FakeStop(), wait_timeout_secs=1.0)
    self.assertEqual(status, 1)
    self.assertLess(secs, 30)
    self.assertEqual(lines[-1], (
        f"ps 0: giving up: no worker has answered for 1 s (worker 0 at 127.0.0.1:{w0}, "
        f"worker 1 at 127.0.0.1:{w1}) and 0 of 2 said done (--wait_timeout_secs=1); exiting "
        "with status 1"))

  def test_a_ps_paused_past_the_bound_gives_up_with_the_time_it_heard_nothing(self):
    info, _, _ = self.ps_info(2)
    watch = ps_task._WorkerWatch(info, timeout_secs=20.0, probe_every_secs=0.1,  # pylint: disable=protected-access
                                 clock=lambda: 0.0)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      answering = watch.any_answering(132.0)  # Its first look after a pause of 132 s.
    self.assertFalse(answering)
    self.assertTrue(watch.gave_up(132.0))
    self.assertEqual(watch.silent_secs(132.0), 132.0)
    # No "giving up after 20 s" note: the give-up line follows at once and says it.
    self.assertEqual(output.getvalue(), "")

  def test_its_give_up_line_names_the_first_five_workers_of_a_big_job(self):
    status, _, lines, ports = self.run_ps(FakeStop(), wait_timeout_secs=1.0, num_workers=7)
    self.assertEqual(status, 1)
    named = ", ".join(f"worker {i} at 127.0.0.1:{p}" for i, p in enumerate(ports[:5]))
    self.assertEqual(lines[-1], (
        f"ps 0: giving up: no worker has answered for 1 s ({named} and 2 more) and 0 of 7 "
        "said done (--wait_timeout_secs=1); exiting with status 1"))

  def test_once_a_worker_is_done_it_names_the_ones_it_still_waits_for(self):
    info, ps_port, worker_ports = self.ps_info(7)
    output = io.StringIO()
    stop = FakeStop()
    waiting = ("ps 0: 1 of 7 worker(s) done; waiting for "
               + ", ".join(f"worker {i} at 127.0.0.1:{worker_ports[i]}" for i in range(1, 6))
               + " and 1 more")
    with contextlib.redirect_stdout(output):
      ps, statuses = self.start_ps(info, stop, output, wait_timeout_secs=600,
                                   straggler_note_secs=0.5)
      # The chief says it is done, as its last act; the others never came.
      self.say_done(ps_port, num_workers=7, replica=0)
      # At once, then again while nothing changes (after 0.5 s, then 1 s later, ...).
      waits.wait_until(lambda: output.getvalue().splitlines().count(waiting) >= 2,
                       "the PS to name the others twice", 60)
      stop.requested = True
      ps.join(timeout=60)
    self.assertEqual(statuses, [143], output.getvalue())

  def test_a_stopped_ps_whose_workers_then_say_done_exits_as_stopped(self):
    # Ctrl-C reaches every task of a launch.sh cluster: the workers stop and say done, and
    # the PS, stopped too, exits 130/143 as they do, not 0 as after a finished job.
    info, ps_port, worker_ports = self.ps_info(2)
    for port in worker_ports:  # They answer while they stop, so the PS waits for them.
      self.answering_worker(port)
    output = io.StringIO()
    stop = FakeStop(grace_secs=600)
    with contextlib.redirect_stdout(output):
      ps, statuses = self.start_ps(info, stop, output, wait_timeout_secs=600)
      stop.requested = True
      for replica in (0, 1):
        self.say_done(ps_port, num_workers=2, replica=replica)
      ps.join(timeout=60)
    self.assertEqual(statuses, [143], output.getvalue())
    self.assertEqual(output.getvalue().splitlines()[-1],
                     "ps 0: every worker is done; stopped on SIGTERM")

  def test_a_done_worker_still_counts_as_answering_but_is_not_named(self):
    info, ps_port, worker_ports = self.ps_info(2)
    # Worker 0 said done yet answers: stopped and started again, it trains on
    # with its flag still set. Worker 1 never came.
    worker0 = self.answering_worker(worker_ports[0])
    output = io.StringIO()
    stop = FakeStop(grace_secs=1.0)
    with contextlib.redirect_stdout(output):
      ps, statuses = self.start_ps(info, stop, output, wait_timeout_secs=2.0)
      self.say_done(ps_port, num_workers=2, replica=0)
      time.sleep(4.0)  # Twice the bound.
      stayed = ps.is_alive()
      self.close_listener(worker0)
      ps.join(timeout=30)
      stop.requested = True  # Ends a PS that waits on anyway, so the test fails, not hangs.
      ps.join(timeout=30)
    lines = output.getvalue().splitlines()
    self.assertTrue(stayed, lines)
    self.assertEqual(statuses, [1], lines)
    self.assertEqual(lines[-1], (
        f"ps 0: giving up: no worker has answered for 2 s (worker 1 at 127.0.0.1:"
        f"{worker_ports[1]}) and 1 of 2 said done (--wait_timeout_secs=2); exiting with status "
        "1"))

  def test_it_keeps_what_workers_trained_after_the_chief_stopped_until_the_bound(self):
    # An async chief stopped by hand; worker 1 trained on to the run's end. Leaving then would
    # lose every step since the chief's final checkpoint.
    info, ps_port, worker_ports = self.ps_info(2)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      ps, statuses = self.start_ps(info, FakeStop(), output, wait_timeout_secs=2.0,
                                   straggler_note_secs=0.2)
      start = time.monotonic()
      self.say_done(ps_port, num_workers=2, replica=0, value=ps_flags.STOPPED)
      self.say_done(ps_port, num_workers=2, replica=1)
      ps.join(timeout=60)
    lines = output.getvalue().splitlines()
    self.assertEqual(statuses, [1], lines)
    self.assertGreaterEqual(time.monotonic() - start, 2.0)
    self.assertIn(
        f"ps 0: every worker is done, but the chief (worker 0 at 127.0.0.1:{worker_ports[0]}) "
        "was stopped before the run's end: keeping the steps trained since its final checkpoint "
        "until it is started again with its command to save them (giving up after "
        "--wait_timeout_secs=2)", lines)
    self.assertEqual(lines[-1], (
        "ps 0: giving up: the chief was not started again within --wait_timeout_secs=2; the "
        "steps trained since its final checkpoint are lost; exiting with status 1"))
    # Said once: with no worker left to name, the notes every 0.2 s have nothing to add.
    self.assertEqual(lines.count("ps 0: 2 of 2 worker(s) done"), 1, lines)

  def test_giving_up_on_a_chief_that_died_after_the_others_finished_says_what_is_lost(self):
    info, ps_port, worker_ports = self.ps_info(2)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      ps, statuses = self.start_ps(info, FakeStop(), output, wait_timeout_secs=1.0)
      self.say_done(ps_port, num_workers=2, replica=1)  # Worker 1 finished; the chief is gone.
      ps.join(timeout=60)
    lines = output.getvalue().splitlines()
    self.assertEqual(statuses, [1], lines)
    self.assertEqual(lines[-1], (
        f"ps 0: giving up: no worker has answered for 1 s (worker 0 at 127.0.0.1:{worker_ports[0]}"
        ") and 1 of 2 said done (--wait_timeout_secs=1); the steps trained since the chief's last "
        "checkpoint are lost; exiting with status 1"))

  def test_a_stopped_chief_started_again_ends_the_kept_run(self):
    info, ps_port, _ = self.ps_info(2)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      ps, statuses = self.start_ps(info, FakeStop(), output, wait_timeout_secs=600)
      self.say_done(ps_port, num_workers=2, replica=0, value=ps_flags.STOPPED)
      self.say_done(ps_port, num_workers=2, replica=1)
      waits.wait_until(lambda: "keeping the steps" in output.getvalue(), "the PS to keep", 60)
      self.say_done(ps_port, num_workers=2, replica=0, value=0)  # Its first session.
      self.say_done(ps_port, num_workers=2, replica=0)  # It saved them and finished.
      ps.join(timeout=60)
    self.assertEqual(statuses, [0], output.getvalue())
    self.assertEqual(output.getvalue().splitlines()[-1], "ps 0: every worker is done; exiting")

  def test_a_job_stopped_before_its_end_keeps_nothing(self):
    # Every replica stopped (the whole job, by hand): none trained past the chief's checkpoint.
    info, ps_port, _ = self.ps_info(2)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      ps, statuses = self.start_ps(info, FakeStop(), output, wait_timeout_secs=600)
      for replica in (1, 0):
        self.say_done(ps_port, num_workers=2, replica=replica, value=ps_flags.STOPPED)
      ps.join(timeout=60)
    self.assertEqual(statuses, [0], output.getvalue())
    self.assertNotIn("keeping", output.getvalue())

  @staticmethod
  def accept_until_closed(listener: socket.socket) -> None:
    while True:
      try:
        listener.accept()[0].close()
      except OSError:
        return

  def answering_worker(self, port: int) -> socket.socket:
    """A listener on a worker's port that accepts connections until the test ends."""
    worker = socket.socket()
    worker.bind(("127.0.0.1", port))
    worker.listen()
    threading.Thread(target=self.accept_until_closed, args=(worker,), daemon=True).start()
    self.addCleanup(self.close_listener, worker)
    return worker

  @staticmethod
  def close_listener(listener: socket.socket) -> None:
    """Refuses connections from now on; close() alone leaves accept() blocked
    and the port open."""
    try:
      listener.shutdown(socket.SHUT_RDWR)
    except OSError:  # Already shut.
      pass
    listener.close()

  def say_done(self, ps_port: int, num_workers: int, replica: int,
               value: int = ps_flags.FINISHED) -> None:
    """Sets one replica's done flag on PS 0, as that replica does when it leaves."""
    graph = tf.Graph()
    with graph.as_default():
      flags = ps_flags.done_flags(0, num_workers)
      done = tf.compat.v1.scatter_update(flags, [replica], [value])
    # Seeing the PS alone, as a worker would: the master waits for every task it sees.
    only_ps = tf.compat.v1.ConfigProto(device_filters=["/job:ps"])
    with tf.compat.v1.Session(f"grpc://127.0.0.1:{ps_port}", graph=graph,
                              config=only_ps) as session:
      session.run(done)

  def test_the_replicas_not_done_are_named_as_their_tasks(self):
    with_chief = cluster.parse_tf_config(json.dumps({
        "cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"]},
        "task": {"type": "ps", "index": 0}}))
    self.assertEqual(ps_task.not_done_names(with_chief, [0, 1, 0]),
                     "chief at c:1, worker 1 at w1:1")
    # A sparse PS sees only itself, so it cannot tell whether replica 0 is a chief.
    sparse = cluster.parse_tf_config(json.dumps({
        "sparseCluster": {"worker": {}, "ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}),
        num_workers=3)
    self.assertEqual(ps_task.not_done_names(sparse, [1, 0, 0]), "replica 1, replica 2")
    many = cluster.from_flags("p:1", ",".join(f"w{i}:1" for i in range(8)), "ps", 0)
    self.assertEqual(ps_task.not_done_names(many, [0] * 8),
                     "worker 0 at w0:1, worker 1 at w1:1, worker 2 at w2:1, worker 3 at w3:1, "
                     "worker 4 at w4:1 and 3 more")

  def test_a_stop_request_ends_it_at_once_when_no_worker_answers(self):
    status, secs, lines, _ = self.run_ps(FakeStop(requested=True))
    self.assertEqual(status, 143)
    self.assertLess(secs, 30)
    self.assertEqual(lines[-1], "ps 0: stopped on SIGTERM with 0 of 2 worker(s) done")


if __name__ == "__main__":
  tf.test.main()
