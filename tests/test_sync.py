"""Synchronous and asynchronous updates on an in-process cluster.

Real gRPC servers run inside the test process (InProcessCluster). Each test
gets a fresh cluster: TF servers cannot be stopped, and the PS-side state
(variables, gradient accumulators, the sync token queues, the done flags) is
shared by name across sessions, so a reused cluster would carry one test's
tokens into the next.

Like TensorFlow's sync_replicas_optimizer_test.py, every replica applies a
known constant gradient, so the expected variables have a closed form.
Every run that could block has a RunOptions deadline and every thread a
bounded join: a broken sync end fails the test instead of hanging it.
"""

import contextlib
import io
import socket
import threading
import time

import numpy as np
import tensorflow as tf

from ps_trainer import cluster
from ps_trainer import hooks as hooks_lib
from ps_trainer import placement
from ps_trainer import server as server_lib
from ps_trainer import session as session_lib
from ps_trainer import sync
from ps_trainer import sync_replicas
from ps_trainer import waits
from inprocess_cluster import InProcessCluster
import testutil

tf.compat.v1.disable_eager_execution()

LEARNING_RATE = 0.25
STEP_TIMEOUT_SECS = 20      # one training step, normally milliseconds
THREAD_TIMEOUT_SECS = 60    # a whole replica's run, normally a second or two

INIT = {"var0": np.array([1.0, 2.0], np.float32),
        "var1": np.array([10.0, -3.0, 0.5], np.float32)}


def _grads(replica):
  """Replica i's constant gradients: powers of two, exact in float32."""
  scale = 2.0 ** replica
  return {"var0": scale * np.array([1.0, 2.0], np.float32),
          "var1": scale * np.array([0.5, -1.0, 0.25], np.float32)}


def _expected(*step_replicas, average=True):
  """Variables after one update per entry (the replicas it aggregates)."""
  value = {k: v.copy() for k, v in INIT.items()}
  for replicas in step_replicas:
    for k in value:
      grads = [_grads(r)[k] for r in replicas]
      value[k] -= LEARNING_RATE * (np.mean(grads, 0) if average
                                   else np.sum(grads, 0))
  return value


def _options(secs=STEP_TIMEOUT_SECS):
  return tf.compat.v1.RunOptions(timeout_in_ms=int(secs * 1000))


class _Replica:
  """One worker's graph (two PS variables, constant gradients) and session."""

  def __init__(self, test_cluster, index, sync_to_aggregate=None,
               gated=False,
               max_waiting_tokens=sync_replicas.MAX_WAITING_TOKENS):
    """`gated`: each step reads the global step for the hooks first, then
    waits for the test (open_gate) before its gradients go out, so one step
    can span several global steps, as a slow chief's does.
    `max_waiting_tokens`: the sync optimizer's bound on a replica's tokens."""
    self.info = test_cluster.info("worker", index)
    self.target = test_cluster.targets[index]
    self.config = server_lib.session_config(self.info)
    self.graph = tf.Graph()
    with self.graph.as_default():
      with tf.compat.v1.device(placement.device_function(self.info)):
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        self.variables = {
            name: tf.compat.v1.get_variable(name, initializer=value)
            for name, value in INIT.items()}
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(LEARNING_RATE)
        self.sync_optimizer = None
        if sync_to_aggregate:
          optimizer = self.sync_optimizer = sync_replicas.SyncOptimizer(
              optimizer, sync_to_aggregate, self.info.num_workers,
              self.info.replica_index, max_waiting_tokens=max_waiting_tokens)
        grads = {k: tf.constant(g)
                 for k, g in _grads(self.info.replica_index).items()}
        if gated:
          grads = self._gated(grads)
        self.train_op = optimizer.apply_gradients(
            [(grads[k], v) for k, v in self.variables.items()],
            global_step=self.global_step)
      self.done_signals = server_lib.DoneSignals(self.info)
      self.init_op = tf.compat.v1.global_variables_initializer()
    self.session = None

  def _gated(self, grads):
    # The hooks' read (StopAtStepHook's), as train_graph caches its own.
    read = tf.identity(self.global_step.read_value())
    self.graph.add_to_collection("global_step_read_op_cache", read)
    reads_seen = tf.queue.FIFOQueue(4, tf.int64, shared_name="reads_seen")
    gate = tf.queue.FIFOQueue(4, tf.float32, shared_name="gate")
    self.next_read_seen = reads_seen.dequeue()
    self.open_gate = gate.enqueue_many([tf.zeros([4])])
    with tf.control_dependencies([reads_seen.enqueue(read)]):
      opened = gate.dequeue()
    return {k: g + opened for k, g in grads.items()}

  def new_session(self):
    return tf.compat.v1.Session(self.target, graph=self.graph,
                                config=self.config)

  def sync_hook(self, done_count=False, drain_timeout_secs=30.0,
                last_step=None, restarted=False, stop=None):
    """SyncReplicasHook wired as trainer._sync_hook wires it."""
    workers_done = None
    if done_count:
      others_done = self.done_signals.others_done
      workers_done = lambda session: int(session.run(others_done))
    return sync.SyncReplicasHook(
        self.sync_optimizer, self.info.is_chief, self.info.num_workers,
        session_factory=self.new_session, workers_done=workers_done,
        drain_timeout_secs=drain_timeout_secs, last_step=last_step,
        restarted=lambda: restarted, stop=stop)

  def monitored_session(self, hooks):
    with self.graph.as_default():
      self.session = tf.compat.v1.train.MonitoredTrainingSession(
          master=self.target, is_chief=self.info.is_chief, hooks=hooks,
          config=self.config, save_summaries_steps=None,
          save_summaries_secs=None, log_step_count_steps=0,
          max_wait_secs=30, stop_grace_period_secs=5)
    return self.session

  def read(self):
    """(global step, {name: value}), read in a session of its own."""
    with self.new_session() as session:
      step, values = session.run([self.global_step, self.variables],
                                 options=_options())
    return int(step), values

  def done_counts(self):
    """How many replicas have set their done flag on each PS."""
    graph = tf.Graph()  # self.graph is final: new ops need their own graph.
    with graph.as_default():
      counts = [tf.reduce_sum(server_lib.done_flags(i, self.info.num_workers))
                for i in range(self.info.num_ps)]
      with tf.compat.v1.Session(self.target, config=self.config) as session:
        return [int(n) for n in session.run(counts, options=_options())]


class _Thread(threading.Thread):
  """Runs fn, keeps its result or exception, for a bounded join."""

  def __init__(self, name, fn):
    super().__init__(name=name, daemon=True)
    self._fn = fn
    self.result = None
    self.error = None
    self.seconds = None

  def run(self):
    start = time.monotonic()
    try:
      self.result = self._fn()
    except BaseException as e:  # pylint: disable=broad-except
      self.error = e
    self.seconds = time.monotonic() - start


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


class _Stop:
  """Stands in for stops.StopRequest (whose real one arms a forced exit)."""

  def __init__(self, requested=False, grace_secs=20.0):
    self.who = "chief"
    self.requested = requested
    self.grace_secs = grace_secs
    self.signal_name = "SIGTERM"

  def exit_status(self):
    return 143


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


class PsLifecycleTest(tf.test.TestCase):
  """run_ps never waits forever: vanished workers and stop requests end it."""

  def run_ps(self, stop, wait_timeout_secs=60.0):
    ps_port, *worker_ports = testutil.pick_free_ports(3)  # Nobody listens on the workers'.
    info = cluster.from_flags(
        f"127.0.0.1:{ps_port}", ",".join(f"127.0.0.1:{p}" for p in worker_ports), "ps", 0)
    output = io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(output):
      status = server_lib.run_ps(info, stop, wait_timeout_secs, poll_secs=0.05,
                                 probe_every_secs=0.1)
    return status, time.monotonic() - start, output.getvalue().splitlines(), worker_ports

  def test_gives_up_when_no_worker_answers_for_the_bound(self):
    status, secs, lines, (w0, w1) = self.run_ps(_Stop(), wait_timeout_secs=1.0)
    self.assertEqual(status, 1)
    self.assertLess(secs, 30)
    self.assertEqual(lines[-1], (
        f"ps 0: giving up: no worker has answered for 1 s (worker 0 at 127.0.0.1:{w0}, "
        f"worker 1 at 127.0.0.1:{w1}) and 0 of 2 said done (--wait_timeout_secs); exiting "
        "with status 1"))

  def test_a_stop_request_ends_it_at_once_when_no_worker_answers(self):
    status, secs, lines, _ = self.run_ps(_Stop(requested=True))
    self.assertEqual(status, 143)
    self.assertLess(secs, 30)
    self.assertEqual(lines[-1], "ps 0: stopped on SIGTERM with 0 of 2 worker(s) done")


class SyncTestCase(tf.test.TestCase):

  def run_in_threads(self, fns, timeout=THREAD_TIMEOUT_SECS):
    """Runs {name: fn} concurrently; fails on a timeout or any exception."""
    threads = [_Thread(name, fn) for name, fn in fns.items()]
    for thread in threads:
      thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
      thread.join(max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    self.assertEmpty(hung, f"still running after {timeout} s: {hung}")
    for thread in threads:
      if thread.error is not None:
        raise AssertionError(
            f"{thread.name} failed: {type(thread.error).__name__}: "
            f"{str(thread.error).splitlines()[0]}") from thread.error
    return {t.name: t for t in threads}

  def _step(self, replicas):
    """One step of each replica's MonitoredSession, run concurrently."""
    self.run_in_threads({
        f"worker {r.info.task_index}":
            (lambda r=r: r.session.run(r.train_op, options=_options()))
        for r in replicas})

  def assertModel(self, replica, step, expected):
    """The global step and the variables, read through `replica`."""
    read_step, values = replica.read()
    self.assertEqual(read_step, step)
    self.assertVariables(values, expected)

  def assertVariables(self, values, expected):
    self.assertEqual(set(values), set(expected))
    for name in expected:
      self.assertAllClose(values[name], expected[name], rtol=0, atol=1e-6,
                          msg=name)


class AsyncTest(SyncTestCase):

  def test_each_gradient_is_applied_on_its_own(self):
    test_cluster = InProcessCluster(num_ps=2, num_workers=2)
    chief, worker = (_Replica(test_cluster, i) for i in range(2))
    # Both PS tasks hold something: the placement is part of the setting.
    devices = {v.device for v in chief.variables.values()}
    devices.add(chief.global_step.device)
    self.assertEqual(devices, {"/job:ps/task:0", "/job:ps/task:1"})
    with chief.new_session() as session:
      session.run(chief.init_op, options=_options())
      session.run(chief.train_op, options=_options())
    self.assertModel(worker, 1, _expected([0], average=False))
    with worker.new_session() as session:
      session.run(worker.train_op, options=_options())
    self.assertModel(chief, 2, _expected([0], [1], average=False))


class SyncTest(SyncTestCase):

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
    replicas = [_Replica(test_cluster, i, sync_to_aggregate=2)
                for i in range(2)]
    sessions = self._sessions(replicas)
    self.assertModel(replicas[1], 0, INIT)

    self._step(replicas)
    self.assertModel(replicas[0], 1, _expected([0, 1]))

    self._step(replicas)
    self.assertModel(replicas[1], 2, _expected([0, 1], [0, 1]))

    # The chief's sync thread sits in take_grad for step 3; closing must not
    # wait out a grace period for it (NOTES.md, failure mode 1).
    self.assertLess(self._close(sessions), 15)

  def test_a_lone_gradient_does_not_make_a_step(self):
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    replicas = [_Replica(test_cluster, i, sync_to_aggregate=2)
                for i in range(2)]
    sessions = self._sessions(replicas)
    with self.assertRaises(tf.errors.DeadlineExceededError):
      replicas[0].session.run(replicas[0].train_op, options=_options(1.0))
    self.assertModel(replicas[1], 0, INIT)
    self.assertLess(self._close(sessions), 15)

  def test_a_gone_replicas_tokens_stop_piling_up(self):
    # Worker 1 never comes while the chief trains alone (one gradient per
    # step): each step gives it a token, but its queue on the PS keeps 3.
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    replicas = [_Replica(test_cluster, i, sync_to_aggregate=1,
                         max_waiting_tokens=3) for i in range(2)]
    sessions = self._sessions(replicas[:1])
    for _ in range(6):
      self._step(replicas[:1])
    self.assertEqual(self._tokens_waiting(replicas[0]), [0, 3])
    # It comes back: it empties its queue, starts at step 6 and counts once.
    sessions += self._sessions(replicas[1:])
    self._step(replicas[1:])
    self.assertModel(replicas[0], 7, _expected(*[[0]] * 6, [1]))
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
      return [int(n) for n in session.run(sizes, options=_options())]

  def test_each_release_reaches_only_the_queues_it_names(self):
    """A stopping chief frees only its own step: a token to a live worker
    would end that worker's step early and drop its next gradient."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=3)
    chief = _Replica(test_cluster, 0, sync_to_aggregate=2)
    sessions = self._sessions([chief])
    optimizer = chief.sync_optimizer
    for op, expected in [(optimizer.release_own_op, [1, 0, 0]),
                         (optimizer.release_others_op, [1, 1, 1]),
                         (optimizer.release_op, [2, 2, 2])]:
      chief.session.run(op, options=_options())
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
    chief, worker = (_Replica(test_cluster, i, sync_to_aggregate=2)
                     for i in range(2))
    sessions = self._sessions([chief, worker])
    # Worker 1's gradient goes in; the deadline cancels its wait for a
    # token, as the kill does.
    with self.assertRaises(tf.errors.DeadlineExceededError):
      worker.session.run(worker.train_op, options=_options(3.0))
    chief.session.run(chief.train_op, options=_options())
    self.assertModel(chief, 1, _expected([0, 1]))

    # The chief's next gradient waits for worker 1's, however long.
    with self.assertRaises(tf.errors.DeadlineExceededError):
      chief.session.run(chief.train_op, options=_options(1.0))
    self.assertModel(chief, 1, _expected([0, 1]))

    # Worker 1 comes back: a new process empties its queue (the token of
    # step 1 it never took) and starts at the global step. Its gradient makes
    # step 2 with the one the chief sent before its deadline; only then does
    # its step return, and its next gradient waits for the chief's.
    with worker.new_session() as restarted:
      restarted.run(worker.sync_optimizer.local_step_init_op,
                    options=_options())
      restarted.run(worker.train_op, options=_options())
      self.assertModel(chief, 2, _expected([0, 1], [0, 1]))
      with self.assertRaises(tf.errors.DeadlineExceededError):
        restarted.run(worker.train_op, options=_options(1.0))
    self.assertEqual(chief.read()[0], 2)
    chief.session.run(chief.train_op, options=_options())  # Stale: dropped.
    self.assertEqual(chief.read()[0], 2)
    self.assertLess(self._close(sessions), 15)

  def test_a_restarted_chief_releases_the_others_but_not_itself(self):
    """A chief that resumes a run hands every other worker a token (they may
    be blocked in a step whose gradient it will never aggregate); a token
    of its own would let its first gradient count twice, alone."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    chief, worker = (_Replica(test_cluster, i, sync_to_aggregate=2)
                     for i in range(2))
    sessions = self._sessions([chief, worker])
    self._step([chief, worker])
    chief.session.close()  # Its sync thread ends with it.
    with chief.graph.as_default():
      hook = chief.sync_hook(restarted=True)
      hook.begin()
    with chief.new_session() as restarted:
      hook.after_create_session(restarted, tf.compat.v1.train.Coordinator())
      with self.assertRaises(tf.errors.DeadlineExceededError):
        restarted.run(chief.train_op, options=_options(1.0))
      # The worker's token returns its step at once; its gradient and the
      # chief's make step 2.
      worker.session.run(worker.train_op, options=_options())
      waits.wait_until(lambda: chief.read()[0] == 2, "global step 2",
                       STEP_TIMEOUT_SECS, poll_secs=0.05)
      self.assertVariables(chief.read()[1], _expected([0, 1], [0, 1]))
      hook.end(restarted)
    self.assertLess(self._close(sessions[1:]), 15)

  def test_a_release_token_never_makes_a_gradient_count_twice(self):
    """A chief that resumes a run releases the other replicas, which may be
    blocked in a step; one that was not (it had just started) finds the
    token at the end of its first step. Its step returns, but its next
    gradient must not count in the same global step as its first."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    chief, worker = (_Replica(test_cluster, i, sync_to_aggregate=2)
                     for i in range(2))
    sessions = self._sessions([chief, worker])
    self._step([chief, worker])
    chief.session.run(chief.sync_optimizer.release_others_op,
                      options=_options())
    worker.session.run(worker.train_op, options=_options())  # The release.
    with self.assertRaises(tf.errors.DeadlineExceededError):
      worker.session.run(worker.train_op, options=_options(1.0))
    self.assertModel(chief, 1, _expected([0, 1]))
    # The worker's first gradient of step 1 waits in the accumulators: with
    # the chief's, it makes step 2.
    chief.session.run(chief.train_op, options=_options())
    self.assertModel(chief, 2, _expected([0, 1], [0, 1]))
    self.assertLess(self._close(sessions), 15)

  def test_a_straggler_skips_to_the_newest_token(self):
    test_cluster = InProcessCluster(num_ps=1, num_workers=3)
    replicas = [_Replica(test_cluster, i, sync_to_aggregate=2)
                for i in range(3)]
    sessions = self._sessions(replicas)
    self._step(replicas[:2])
    self._step(replicas[:2])
    self.assertEqual(replicas[0].read()[0], 2)
    # Worker 2's gradient of step 0 is stale; its queue holds the tokens of
    # steps 1 and 2 and it keeps the newest, so its next gradient is fresh:
    # with the chief's, it makes step 3. Had it kept the oldest, it would
    # send a stale gradient for each token it missed.
    self._step(replicas[2:])
    self._step([replicas[0], replicas[2]])
    self.assertModel(replicas[1], 3, _expected([0, 1], [0, 1], [0, 2]))
    self.assertLess(self._close(sessions), 15)

  def test_backup_worker_gradient_is_dropped(self):
    test_cluster = InProcessCluster(num_ps=2, num_workers=3)
    replicas = [_Replica(test_cluster, i, sync_to_aggregate=2)
                for i in range(3)]
    # All three sessions start at step 0, so worker 2's local step is 0.
    sessions = self._sessions(replicas)

    self._step(replicas[:2])
    self.assertModel(replicas[2], 1, _expected([0, 1]))

    # The straggler's gradient (computed at step 0) is stale: dropped, and it
    # still gets a token (each step gives every replica one), so it returns.
    self._step(replicas[2:])
    self.assertModel(replicas[0], 1, _expected([0, 1]))

    # Step 2 holds nothing of the stale gradient: workers 0 and 1 again.
    self._step(replicas[:2])
    self.assertModel(replicas[1], 2, _expected([0, 1], [0, 1]))
    self.assertLess(self._close(sessions), 15)

  def test_any_two_of_three_make_a_step(self):
    test_cluster = InProcessCluster(num_ps=1, num_workers=3)
    replicas = [_Replica(test_cluster, i, sync_to_aggregate=2)
                for i in range(3)]
    sessions = self._sessions(replicas)
    self._step([replicas[0], replicas[2]])
    self.assertModel(replicas[1], 1, _expected([0, 2]))
    self.assertLess(self._close(sessions), 15)


class CleanEndTest(SyncTestCase):
  """The end of a sync run: every replica returns, nobody hangs (NOTES.md 1).

  Wired as trainer.train wires it: StopAtStepHook and SyncReplicasHook in a
  MonitoredTrainingSession; after the session closes, each replica sets its
  done flag on every PS (server.signal_done); the chief's hook counts the
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
    replicas = [_Replica(test_cluster, i, sync_to_aggregate=num_workers)
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
      r.session.run(r.train_op, options=_options())
      steps += 1
    if extra_step:
      with r.new_session() as raw:
        raw.run(r.train_op, options=_options())
    return steps, self._leave(r)

  def _leave(self, r):
    """Closes r's session and sets its done flags, as trainer.train does
    after its loop: the close's seconds."""
    start = time.monotonic()
    r.session.close()
    close_secs = time.monotonic() - start
    server_lib.signal_done(r.target, r.info, r.done_signals, r.graph,
                           timeout_secs=10)
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
    chief = _Replica(test_cluster, 0, sync_to_aggregate=2, gated=True)
    workers = [_Replica(test_cluster, i, sync_to_aggregate=2)
               for i in (1, 2)]
    chief.monitored_session([
        hooks_lib.StopAtStepHook(2),
        chief.sync_hook(done_count=True, last_step=2)])
    for w in workers:
      w.monitored_session([w.sync_hook()])

    chief_thread = _Thread("chief", lambda: self._train_to_end(chief)[0])
    chief_thread.start()
    with chief.new_session() as probe:
      self.assertEqual(probe.run(chief.next_read_seen, options=_options()), 0)
      self._step(workers)  # Step 1.
      self._step(workers)  # Step 2, the last.
      probe.run(chief.open_gate, options=_options())
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
    self.assertModel(chief, 2, _expected([1, 2], [1, 2]))

  def test_a_stopping_chief_does_not_wait_for_a_worker_that_stopped_first(self):
    """A signal reaches the tasks one by one: worker 1 stopped after step 1,
    while the chief, stopped a moment later, had begun step 2, which needs
    worker 1's gradient. It waited out its 20 s grace period and ended with
    a last-resort checkpoint; now it hands out tokens a second into the stop,
    and its step returns without making a global step."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    chief, worker = (_Replica(test_cluster, i, sync_to_aggregate=2)
                     for i in range(2))
    stop = _Stop()
    chief.monitored_session([hooks_lib.StopOnRequestHook(stop),
                             chief.sync_hook(done_count=True, stop=stop)])
    worker.monitored_session([worker.sync_hook()])
    self._step([chief, worker])
    self._leave(worker)
    chief_thread = _Thread("chief", lambda: self._train_to_end(chief))
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
    self.assertModel(chief, 1, _expected([0, 1]))

  def test_no_step_lands_after_a_stopping_chiefs_final_checkpoint(self):
    """Only the chief is stopped; two backups go on training, 2 of 3 per
    step. The saver's end used to come before the sync thread stopped, so
    the model moved on during and after the final checkpoint. Wired as
    trainer.py wires the chief (session.monitored_session: chief hooks, the
    saver, then the others), a probe after the saver sees the model hold
    still at the checkpoint's step while the workers keep sending."""
    test_cluster = InProcessCluster(num_ps=1, num_workers=3)
    chief, *workers = (_Replica(test_cluster, i, sync_to_aggregate=2)
                       for i in range(3))
    stop = _Stop()
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
        session.run(chief.train_op, options=_options())
      stop.requested = True
      return self._train_to_end(chief)

    def worker_run(w):
      steps = 0
      while not leave.is_set():  # Past the chief's stop, until the probe.
        w.session.run(w.train_op, options=_options())
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

  def test_chief_gives_up_on_a_silent_worker(self):
    test_cluster = InProcessCluster(num_ps=1, num_workers=2)
    chief = _Replica(test_cluster, 0, sync_to_aggregate=2)
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
