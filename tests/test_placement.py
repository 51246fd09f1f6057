"""Tests for ps_trainer.graph.placement: graphs built under the device function.

No servers: placement is decided when ops are created, so asserting on
`v.device` / `op.device` is enough (the lingvo style, DESIGN.md).
"""

import collections
import json
import re
from unittest import mock

from absl.testing import parameterized
import tensorflow as tf

from ps_trainer import models
from ps_trainer.graph import placement
from ps_trainer.graph import sync_replicas
from ps_trainer.settings import cluster

tf.compat.v1.disable_eager_execution()

_PS_DEVICE = re.compile(r"^/job:ps/task:(\d+)$")
_VARIABLE_OPS = ("VarHandleOp", "VariableV2")


def _info(num_ps, num_workers=2, job_name="worker", task_index=0):
  ps = ",".join(f"127.0.0.1:{2000 + i}" for i in range(num_ps))
  workers = ",".join(f"127.0.0.1:{3000 + i}" for i in range(num_workers))
  return cluster.from_flags(ps, workers, job_name, task_index)


def _ps_task(test, device):
  match = _PS_DEVICE.match(device)
  test.assertIsNotNone(match, f"{device!r} is not a PS device")
  return int(match.group(1))


def _bytes_per_ps(variables, num_ps, test):
  loads = [0] * num_ps
  for v in variables:
    loads[_ps_task(test, v.device)] += placement.variable_bytes(v.op)
  return loads


class _RecordingBalancer(placement.GreedyByteBalancer):
  """GreedyByteBalancer that remembers itself, to read `loads` afterwards."""
  instances = []

  def __init__(self, num_ps):
    super().__init__(num_ps)
    self.calls = []
    _RecordingBalancer.instances.append(self)

  def __call__(self, op):
    task = super().__call__(op)
    self.calls.append((op.name, task))
    return task


def _recording():
  _RecordingBalancer.instances = []
  return mock.patch.object(placement, "GreedyByteBalancer", _RecordingBalancer)


class VariableBytesTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(("resource", True), ("ref", False))
  def test_sizes(self, use_resource):
    with tf.Graph().as_default():
      kernel = tf.compat.v1.get_variable(
          "kernel", [784, 256], tf.float32, use_resource=use_resource)
      step = tf.compat.v1.get_variable(
          "step", [], tf.int64, initializer=tf.compat.v1.zeros_initializer(),
          use_resource=use_resource)
      half = tf.compat.v1.get_variable(
          "half", [3, 5], tf.float16, use_resource=use_resource)
      self.assertEqual(kernel.op.type,
                       "VarHandleOp" if use_resource else "VariableV2")
      self.assertEqual(placement.variable_bytes(kernel.op), 802816)
      self.assertEqual(placement.variable_bytes(step.op), 8)
      self.assertEqual(placement.variable_bytes(half.op), 30)

  @parameterized.named_parameters(("unknown_rank", None, 8),
                                  ("unknown_dim", [None, 4], 4 * 8))
  def test_unknown_dimensions_count_one_element(self, shape, expected):
    with tf.Graph().as_default():
      initial = tf.compat.v1.placeholder_with_default(
          tf.zeros([4, 4], tf.float64), shape)
      v = tf.compat.v1.Variable(initial, validate_shape=False,
                                use_resource=True)
      self.assertEqual(placement.variable_bytes(v.op), expected)

  def test_op_without_shape_counts_zero(self):
    with tf.Graph().as_default():
      self.assertEqual(placement.variable_bytes(tf.constant(1.0).op), 0)


class GreedyByteBalancerTest(tf.test.TestCase):

  def test_needs_a_ps(self):
    with self.assertRaisesRegex(ValueError, r"at least one PS task, got 0"):
      placement.GreedyByteBalancer(0)

  def test_each_variable_goes_to_the_lightest_ps(self):
    with tf.Graph().as_default():
      sizes = [100, 10, 10, 50, 1, 1]
      ops = [tf.compat.v1.get_variable(f"v{i}", [n]).op
             for i, n in enumerate(sizes)]
    balancer = placement.GreedyByteBalancer(2)
    # 100->0; 10->1; 10->1 (10<100); 50->1 (20<100); 1->1 (70<100); 1->1.
    self.assertEqual([balancer(op) for op in ops], [0, 1, 1, 1, 1, 1])
    self.assertEqual(balancer.loads, [400, 288])

  def test_ties_go_to_the_lowest_index(self):
    with tf.Graph().as_default():
      op = tf.compat.v1.get_variable("v", [2]).op
    balancer = placement.GreedyByteBalancer(3)
    self.assertEqual(balancer(op), 0)
    self.assertEqual(balancer(op), 1)
    self.assertEqual(balancer(op), 2)
    self.assertEqual(balancer(op), 0)


class DeviceFunctionTest(tf.test.TestCase, parameterized.TestCase):

  def _build(self, info, model, input_shape=(28, 28, 1),
             hidden_units=(256, 128)):
    features = tf.compat.v1.placeholder(tf.float32, (None,) + input_shape)
    with tf.compat.v1.device(placement.device_function(info)):
      global_step = tf.compat.v1.train.get_or_create_global_step()
      logits = models.build_logits(model, features, input_shape, 10,
                                   hidden_units)
    return global_step, logits

  @parameterized.product(num_ps=(1, 3), model=("linear", "mlp", "cnn"),
                         task_index=(0, 1))
  def test_variables_on_ps_compute_on_worker(self, num_ps, model, task_index):
    info = _info(num_ps, num_workers=2, task_index=task_index)
    with tf.Graph().as_default() as graph:
      global_step, logits = self._build(info, model)
      variables = tf.compat.v1.global_variables()
      self.assertIn(global_step, variables)
      for v in variables:
        self.assertLess(_ps_task(self, v.device), num_ps, v.name)
      worker = f"/job:worker/task:{task_index}"
      self.assertEqual(logits.op.device, worker)
      compute = [op for op in graph.get_operations()
                 if op.type in ("MatMul", "Conv2D", "MaxPool", "Relu",
                                "BiasAdd", "Reshape")]
      self.assertNotEmpty(compute)
      for op in compute:
        self.assertEqual(op.device, worker, op.name)

  def test_mlp_on_three_ps_is_balanced(self):
    info = _info(3)
    with tf.Graph().as_default(), _recording():
      self._build(info, "mlp")
      variables = tf.compat.v1.global_variables()
      (balancer,) = _RecordingBalancer.instances
      loads = _bytes_per_ps(variables, 3, self)
    self.assertEqual(balancer.loads, loads)
    self.assertEqual(sum(loads), 8 + 4 * (784 * 256 + 256 + 256 * 128 + 128 +
                                          128 * 10 + 10))
    self.assertTrue(all(loads), f"a PS holds nothing: {loads}")
    per_ps = collections.Counter(_ps_task(self, v.device) for v in variables)
    self.assertEqual(sorted(per_ps), [0, 1, 2])
    largest = max(placement.variable_bytes(v.op) for v in variables)
    self.assertLessEqual(max(loads) - min(loads), largest, loads)
    # The 784x256 kernel (802816 bytes) sits alone: nothing else would fit
    # beside it without making that PS heavier than the others need to be.
    kernel = [v for v in variables if v.op.name == "model/hidden0/kernel"][0]
    alone = [v.op.name for v in variables if v.device == kernel.device]
    self.assertEqual(alone, ["model/hidden0/kernel"])

  @parameterized.parameters(1, 2, 3, 4)
  def test_every_worker_computes_the_same_placement(self, num_ps):
    placements = []
    for task_index in range(3):
      with tf.Graph().as_default():
        self._build(_info(num_ps, num_workers=3, task_index=task_index), "cnn")
        placements.append({v.op.name: v.device
                           for v in tf.compat.v1.global_variables()})
    self.assertEqual(placements[0], placements[1])
    self.assertEqual(placements[0], placements[2])

  def test_chief_from_tf_config(self):
    tf_config = json.dumps({
        "cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"],
                    "ps": ["p0:2222", "p1:2222"]},
        "task": {"type": "chief", "index": 0}})
    info = cluster.parse_tf_config(tf_config)
    with tf.Graph().as_default():
      _, logits = self._build(info, "mlp")
      for v in tf.compat.v1.global_variables():
        self.assertLess(_ps_task(self, v.device), 2, v.name)
    self.assertEqual(logits.op.device, "/job:chief/task:0")

  def test_worker_beside_a_chief_job(self):
    tf_config = json.dumps({
        "cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"],
                    "ps": ["p0:2222"]},
        "task": {"type": "worker", "index": 1}})
    info = cluster.parse_tf_config(tf_config)
    with tf.Graph().as_default():
      _, logits = self._build(info, "linear")
      for v in tf.compat.v1.global_variables():
        self.assertEqual(v.device, "/job:ps/task:0")
    self.assertEqual(logits.op.device, "/job:worker/task:1")


class SkewedVariablesTest(tf.test.TestCase, parameterized.TestCase):
  """Greedy byte balancing against replica_device_setter's round-robin."""

  BIG = 1_000_000  # floats: 4 MB.

  def _place(self, device_fn, sizes):
    with tf.Graph().as_default():
      with tf.compat.v1.device(device_fn):
        for i, n in enumerate(sizes):
          tf.compat.v1.get_variable(
              f"v{i}", [n], initializer=tf.compat.v1.zeros_initializer())
      return [(v.op.name, placement.variable_bytes(v.op),
               _ps_task(self, v.device))
              for v in tf.compat.v1.global_variables()]

  def _round_robin(self, num_ps):
    return tf.compat.v1.train.replica_device_setter(
        ps_tasks=num_ps, ps_device="/job:ps",
        worker_device="/job:worker/task:0")

  @staticmethod
  def _loads(placed, num_ps):
    loads = [0] * num_ps
    for _, size, task in placed:
      loads[task] += size
    return loads

  def test_one_big_variable_sits_alone(self):
    sizes = [self.BIG] + [1000] * 10
    greedy = self._place(placement.device_function(_info(3)), sizes)
    naive = self._place(self._round_robin(3), sizes)
    big_task = greedy[0][2]
    self.assertEqual([name for name, _, task in greedy if task == big_task],
                     ["v0"])
    # The small ones share the other two PS tasks evenly.
    self.assertEqual(sorted(self._loads(greedy, 3)),
                     [5 * 4000, 5 * 4000, 4 * self.BIG])
    # Round-robin piles small variables onto the big one's PS as well.
    self.assertEqual([name for name, _, task in naive if task == naive[0][2]],
                     ["v0", "v3", "v6", "v9"])
    self.assertLess(max(self._loads(greedy, 3)), max(self._loads(naive, 3)))

  @parameterized.parameters(2, 3)
  def test_two_big_variables_go_to_different_ps(self, num_ps):
    # Round-robin sends variable i to PS i % num_ps: both big ones to PS 0.
    sizes = ([self.BIG] + [10] * (num_ps - 1)) * 2 + [10] * 5
    greedy = self._loads(
        self._place(placement.device_function(_info(num_ps)), sizes), num_ps)
    naive = self._loads(self._place(self._round_robin(num_ps), sizes), num_ps)
    self.assertGreaterEqual(naive[0], 8 * self.BIG)
    self.assertLess(max(greedy), 4 * self.BIG + 1000)
    self.assertLessEqual(max(greedy) - min(greedy), 4 * self.BIG)
    self.assertLess(max(greedy) - min(greedy), max(naive) - min(naive))


class SyncGraphPlacementTest(tf.test.TestCase):
  """The full training graph: model, sync optimizer with Adam slots."""

  def _build(self, num_ps, task_index=1, then=None):
    """Builds the graph; `then()` runs afterwards under the same placer."""
    info = _info(num_ps, num_workers=2, task_index=task_index)
    features = tf.compat.v1.placeholder(tf.float32, (None, 8, 8, 1))
    labels = tf.compat.v1.placeholder(tf.int64, (None,))
    with tf.compat.v1.device(placement.device_function(info)):
      global_step = tf.compat.v1.train.get_or_create_global_step()
      logits = models.build_logits("mlp", features, (8, 8, 1), 10, (32, 16))
      loss, _ = models.loss_and_accuracy(logits, labels)
      optimizer = sync_replicas.SyncOptimizer(
          tf.compat.v1.train.AdamOptimizer(0.01), 2, 2, info.replica_index)
      train_op = optimizer.minimize(loss, global_step=global_step)
      if then:
        then()
    return info, train_op

  def test_slots_and_accumulators_sit_with_their_variable(self):
    with tf.Graph().as_default() as graph:
      _, train_op = self._build(num_ps=2)
      devices = {op.name: op.device for op in graph.get_operations()}
      for v in tf.compat.v1.global_variables():
        _ps_task(self, v.device)
        name = v.op.name
        for suffix in ("/Adam", "/Adam_1"):
          if name + suffix in devices:
            self.assertEqual(devices[name + suffix], v.device, name + suffix)
      local = tf.compat.v1.local_variables()
      self.assertEqual([v.op.name for v in local], ["sync_rep_local_step"])
      self.assertEqual(local[0].device, "/job:worker/task:1")
      # Each replica's token queue, which its train op dequeues from.
      for i in range(2):
        self.assertStartsWith(devices[f"sync_token_q_{i}"],
                              devices["global_step"])
      self.assertIsNotNone(train_op)

  def test_balancer_loads_are_the_bytes_each_ps_holds(self):
    """`loads` must describe where variables really are.

    KNOWN BUG (fails on the code as of this test): replica_device_setter
    calls the ps_strategy for every op in STANDARD_PS_OPS, including ops
    whose device is decided elsewhere: Adam slots and beta powers (colocated
    with a variable), ResourceConditionalAccumulators (built under
    tf.device(var.device)) and the sync optimizer's worker-local step.
    GreedyByteBalancer adds their bytes to the PS it picks, though none of
    them lands there, so its loads drift from the real placement and every
    variable created afterwards is placed from wrong loads: here a variable
    made after minimize() goes to the PS that already holds ~3x more bytes.
    """
    with tf.Graph().as_default() as graph, _recording():
      self._build(num_ps=2, then=lambda: tf.compat.v1.get_variable(
          "after_optimizer", [100],
          initializer=tf.compat.v1.zeros_initializer()))
      balancer = _RecordingBalancer.instances[0]
      actual = [0, 0]
      for op in graph.get_operations():
        if op.type in _VARIABLE_OPS + ("ResourceConditionalAccumulator",):
          match = _PS_DEVICE.match(op.device)
          if match:
            actual[int(match.group(1))] += placement.variable_bytes(op)
      extra = graph.get_operation_by_name("after_optimizer")
    held_before = list(actual)
    held_before[_ps_task(self, extra.device)] -= 400
    lighter = min(range(2), key=lambda i: held_before[i])
    self.assertEqual(
        _ps_task(self, extra.device), lighter,
        f"bytes held before the new variable: {held_before}; balancer's "
        f"loads: {balancer.loads}; it was asked to place: {balancer.calls}")
    self.assertEqual(balancer.loads, actual)


if __name__ == "__main__":
  tf.test.main()
