"""Replicas with known gradients on an in-process cluster, for the sync tests.

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

import threading
import time

import numpy as np
import tensorflow as tf

from ps_trainer.cluster import ps_flags
from ps_trainer.cluster import server as server_lib
from ps_trainer.graph import placement
from ps_trainer.graph import sync_replicas
from ps_trainer.training import sync

LEARNING_RATE = 0.25
STEP_TIMEOUT_SECS = 20      # one training step, normally milliseconds
THREAD_TIMEOUT_SECS = 60    # a whole replica's run, normally a second or two

INIT = {"var0": np.array([1.0, 2.0], np.float32),
        "var1": np.array([10.0, -3.0, 0.5], np.float32)}


def replica_grads(replica):
  """Replica i's constant gradients: powers of two, exact in float32."""
  scale = 2.0 ** replica
  return {"var0": scale * np.array([1.0, 2.0], np.float32),
          "var1": scale * np.array([0.5, -1.0, 0.25], np.float32)}


def expected_after(*step_replicas, average=True):
  """Variables after one update per entry (the replicas it aggregates)."""
  value = {k: v.copy() for k, v in INIT.items()}
  for replicas in step_replicas:
    for k in value:
      grads = [replica_grads(r)[k] for r in replicas]
      value[k] -= LEARNING_RATE * (np.mean(grads, 0) if average
                                   else np.sum(grads, 0))
  return value


def run_options(secs=STEP_TIMEOUT_SECS):
  return tf.compat.v1.RunOptions(timeout_in_ms=int(secs * 1000))


class Replica:
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
                 for k, g in replica_grads(self.info.replica_index).items()}
        if gated:
          grads = self._gated(grads)
        self.train_op = optimizer.apply_gradients(
            [(grads[k], v) for k, v in self.variables.items()],
            global_step=self.global_step)
      self.done_signals = ps_flags.DoneSignals(self.info)
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
                                 options=run_options())
    return int(step), values

  def done_counts(self):
    """How many replicas have set their done flag on each PS."""
    graph = tf.Graph()  # self.graph is final: new ops need their own graph.
    with graph.as_default():
      counts = [tf.math.count_nonzero(ps_flags.done_flags(i, self.info.num_workers))
                for i in range(self.info.num_ps)]
      with tf.compat.v1.Session(self.target, config=self.config) as session:
        return [int(n) for n in session.run(counts, options=run_options())]


class BoundedThread(threading.Thread):
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


class FakeStop:
  """Stands in for stops.StopRequest (whose real one arms a forced exit)."""

  def __init__(self, requested=False, grace_secs=20.0):
    self.who = "chief"
    self.requested = requested
    self.grace_secs = grace_secs
    self.signal_name = "SIGTERM"

  def exit_status(self):
    return 143


class SyncTestCase(tf.test.TestCase):

  def run_in_threads(self, fns, timeout=THREAD_TIMEOUT_SECS):
    """Runs {name: fn} concurrently; fails on a timeout or any exception."""
    threads = [BoundedThread(name, fn) for name, fn in fns.items()]
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

  def step_all(self, replicas):
    """One step of each replica's MonitoredSession, run concurrently."""
    self.run_in_threads({
        f"worker {r.info.task_index}":
            (lambda r=r: r.session.run(r.train_op, options=run_options()))
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
