"""Packed reads and gradients: one tensor per PS each way, the same numbers."""

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from ps_trainer.datasets import data
from ps_trainer.graph import packing
from ps_trainer.graph import train_graph

from inprocess_cluster import InProcessCluster
import testutil

CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def _model(features):
  """A two-layer model from get_variable, as models/networks.py builds them."""
  with tf.compat.v1.variable_scope("model", reuse=tf.compat.v1.AUTO_REUSE):
    w1 = tf.compat.v1.get_variable(
        "w1", initializer=np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    b1 = tf.compat.v1.get_variable("b1", initializer=np.float32([.1, .2, .3]))
    w2 = tf.compat.v1.get_variable(
        "w2", initializer=np.linspace(1, -1, 6, dtype=np.float32).reshape(3, 2))
  hidden = tf.nn.relu(tf.linalg.matmul(features, w1) + b1)
  return tf.reduce_sum(tf.square(tf.linalg.matmul(hidden, w2)))


def _ancestors(fetches):
  """Every op the tensors or ops depend on."""
  seen, todo = set(), [getattr(f, "op", f) for f in fetches]
  while todo:
    op = todo.pop()
    if op in seen:
      continue
    seen.add(op)
    todo.extend(t.op for t in op.inputs)
    todo.extend(op.control_inputs)
  return seen


class PackingTest(absltest.TestCase):

  def build(self, wire_dtype, packed=True):
    """Gradients of _model on fixed features, with or without packing."""
    graph = tf.Graph()
    with graph.as_default(), tf.device(CPU):
      features = tf.constant(np.arange(8, dtype=np.float32).reshape(2, 4) / 8)
      _model(features)  # Creates the variables, as the eval graph does.
      variables = tf.compat.v1.trainable_variables()
      if not packed:
        return graph, tf.gradients(_model(features), variables), None
      reads = packing.PackedReads(variables, wire_dtype)
      with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                       custom_getter=reads.variable_getter()):
        loss = _model(features)
      grads = packing.pack_gradients(
          packing.gradients(loss, variables, reads), wire_dtype)
      return graph, [g for g, _ in grads], reads

  def evaluate(self, graph, tensors):
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run(tensors)

  def test_packed_float32_gradients_equal_the_plain_ones(self):
    plain = self.evaluate(*self.build(tf.float32, packed=False)[:2])
    packed = self.evaluate(*self.build(tf.float32)[:2])
    for p, q in zip(plain, packed):
      np.testing.assert_array_equal(p, q)

  def test_one_read_and_one_gradient_tensor_per_device(self):
    graph, grads, _ = self.build(tf.float32)
    concats = [op for op in graph.get_operations() if op.type == "ConcatV2"]
    self.assertEqual(sorted(op.name.split("/")[0] for op in concats),
                     ["packed_gradients", "packed_reads"])
    # The packed step reads no variable but through the pack.
    reads = {op.name for op in _ancestors(grads) if op.type == "ReadVariableOp"}
    self.assertNotEmpty(reads)
    self.assertTrue(all(name.startswith("packed_reads/") for name in reads),
                    reads)

  def test_bfloat16_wire_rounds_only_what_crosses_the_network(self):
    plain = self.evaluate(*self.build(tf.float32, packed=False)[:2])
    graph, grads, _ = self.build(tf.bfloat16)
    packed = self.evaluate(graph, grads)
    for p, q in zip(plain, packed):
      self.assertEqual(q.dtype, np.float32)
      # bfloat16 keeps 8 bits of mantissa: relative error below 2^-7, through
      # a read and a gradient both rounded.
      np.testing.assert_allclose(q, p, rtol=3e-2, atol=1e-3)
    casts = [op for op in graph.get_operations() if op.type == "Cast"]
    # Each variable's value to and from the wire, and its gradient too.
    self.assertLen(casts, 4 * 3)
    with graph.as_default():
      self.assertTrue(all(v.dtype.base_dtype == tf.float32
                          for v in tf.compat.v1.global_variables()))

  def test_the_parts_are_views_of_the_packed_tensor_not_copies(self):
    # The variables hold 12, 3 and 6 floats: without padding to 64 bytes,
    # TF's split would copy the whole packed tensor on every step.
    graph, grads, _ = self.build(tf.float32)
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      metadata = tf.compat.v1.RunMetadata()
      session.run(grads, options=tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                  run_metadata=metadata)
    splits = {node.node_name: sum(m.total_bytes for m in node.memory)
              for device in metadata.step_stats.dev_stats
              for node in device.node_stats
              if node.node_name in ("packed_reads/split",
                                    "packed_gradients/split")}
    self.assertEqual(splits, {"packed_reads/split": 0,
                              "packed_gradients/split": 0})

  def test_the_global_step_travels_with_the_variables_exactly(self):
    for wire_dtype in (tf.float32, tf.bfloat16):
      graph = tf.Graph()
      with graph.as_default(), tf.device(CPU):
        # Past float32's and bfloat16's integers: only its bits survive.
        step = tf.compat.v1.get_variable(
            "global_step", initializer=tf.constant(2**40 + 3, tf.int64),
            trainable=False)
        _model(tf.zeros([2, 4]))
        reads = packing.PackedReads(tf.compat.v1.trainable_variables(),
                                    wire_dtype, global_step=step)
        self.assertEqual(reads.global_step.dtype, tf.int64)
        ancestors = _ancestors([reads.global_step])
        # The step rides in the one packed tensor, read next to the model.
        self.assertIn("packed_reads/concat", {op.name for op in ancestors})
        self.assertLen([op for op in ancestors if op.type == "ReadVariableOp"],
                       4)
      self.assertEqual(self.evaluate(graph, reads.global_step), 2**40 + 3,
                       wire_dtype)

  def test_a_global_step_on_another_device_is_left_alone(self):
    graph = tf.Graph()
    with graph.as_default():
      with tf.device("/job:ps/task:1"):
        step = tf.compat.v1.get_variable("global_step", [], tf.int64,
                                         trainable=False)
      with tf.device("/job:ps/task:0"):
        _model(tf.zeros([2, 4]))
      reads = packing.PackedReads(tf.compat.v1.trainable_variables(),
                                  global_step=step)
    self.assertIsNone(reads.global_step)

  def test_a_kernel_gradient_crosses_as_its_two_factors_when_smaller(self):
    # x (2x8) @ w1 (8x6): w1's gradient, x^T @ dy, is 48 floats made of
    # 16 + 12. w2's (6x2) is 12 floats, made of 12 + 4: sent as it is.
    def build(factored):
      graph = tf.Graph()
      with graph.as_default(), tf.device(CPU):
        x = tf.constant(np.linspace(-2, 3, 16, dtype=np.float32).reshape(2, 8))
        w1 = tf.compat.v1.get_variable(
            "w1", initializer=np.linspace(-1, 1, 48,
                                          dtype=np.float32).reshape(8, 6))
        w2 = tf.compat.v1.get_variable(
            "w2", initializer=np.linspace(1, -2, 12,
                                          dtype=np.float32).reshape(6, 2))
        loss = tf.reduce_sum(tf.sin(tf.linalg.matmul(
            tf.nn.relu(tf.linalg.matmul(x, w1)), w2)))
        plain = tf.gradients(loss, [w1, w2])
        packed = packing.pack_gradients(list(zip(plain, [w1, w2])),
                                        factored=factored)
        (wire,) = tf.compat.v1.get_collection(packing.GRADIENT_PACKS)
      values = self.evaluate(graph, [plain, [g for g, _ in packed]])
      return wire.shape.num_elements(), values

    # Each part padded to 16 floats: 16 + 16 + 16, against 48 + 16.
    for factored, floats in ((True, 48), (False, 64)):
      with self.subTest(factored=factored):
        sent, (plain, packed) = build(factored)
        self.assertEqual(sent, floats)
        for p, q in zip(plain, packed):  # The PS's product is the same bits.
          np.testing.assert_array_equal(p, q)

  def test_what_the_ps_could_not_recompute_the_same_is_sent_whole(self):
    graph = tf.Graph()
    with graph.as_default(), tf.device(CPU):
      w = tf.compat.v1.get_variable("w", [8, 6])
      x = tf.ones([2, 8])
      twice = tf.gradients(tf.reduce_sum(x @ w) + tf.reduce_sum(2 * x @ w), w)
      unknown = tf.compat.v1.placeholder(tf.float32, [None, 8])
      some_batch = tf.gradients(tf.reduce_sum(unknown @ w), w)
      # A copy on the PS would not wait for the check.
      check = tf.debugging.assert_positive(
          tf.compat.v1.placeholder(tf.float32, []))
      y = tf.ones([2, 6])
      with tf.control_dependencies([check]):
        guarded = tf.linalg.matmul(x, y, transpose_a=True)
      once = tf.gradients(tf.reduce_sum(x @ w), w)
    self.assertIsNone(packing.gradient_factors(twice[0]))
    self.assertIsNone(packing.gradient_factors(some_batch[0]))
    self.assertIsNone(packing.gradient_factors(guarded))
    self.assertLen(packing.gradient_factors(once[0]), 2)

  def test_sparse_and_missing_gradients_pass_through(self):
    graph = tf.Graph()
    with graph.as_default(), tf.device(CPU):
      table = tf.compat.v1.get_variable("table", [5, 2])
      dense = tf.compat.v1.get_variable("dense", [2])
      unused = tf.compat.v1.get_variable("unused", [3])
      loss = tf.reduce_sum(tf.gather(table, [1, 3]) * dense)
      grads = tf.gradients(loss, [table, dense, unused])
      out = packing.pack_gradients(list(zip(grads, [table, dense, unused])))
    self.assertIsInstance(out[0][0], tf.IndexedSlices)
    self.assertIs(out[0][0], grads[0])
    self.assertIsNone(out[2][0])
    self.assertIn("packed_gradients", out[1][0].name)


def _trainer_graph(num_ps, *argv):
  """The training graph worker 0 of num_ps PS and 1 worker builds."""
  cfg = testutil.planned_config(
      "--model=mlp", "--hidden_units=32,16", "--dataset=synthetic",
      "--optimizer=sgd", *argv, num_ps=num_ps, num_workers=1)
  return train_graph.build_graph(cfg, data.load("synthetic"))


def _task(op) -> str:
  """The task an op runs on. One without a device runs where TF's placer
  puts it: with the op it is colocated with, or with the variable it reads
  (the optimizer's own reads of its beta powers)."""
  if not op.device:
    others = [group for group in op.colocation_groups()
              if group != f"loc:@{op.name}".encode()]
    if others:
      return _task(op.graph.get_operation_by_name(others[0][5:].decode()))
    resources = [t.op for t in op.inputs if t.dtype == tf.resource]
    if resources:
      return _task(resources[0])
  spec = tf.DeviceSpec.from_string(op.device)
  return f"{spec.job}:{spec.task}"


class TrainerStepTest(absltest.TestCase):
  """What a worker's step moves between tasks, in the graph the trainer builds."""

  def test_each_ps_and_the_worker_exchange_one_tensor_each_way(self):
    # A batch of 16 against a 784x256 kernel: its gradient goes as factors
    # and the PS multiplies them, still inside the one tensor each way.
    for num_ps, argv in ((1, ()), (2, ()), (1, ("--wire_dtype=bfloat16",)),
                         (1, ("--hidden_units=256", "--batch_size=16"))):
      with self.subTest(num_ps=num_ps, argv=argv):
        tg = _trainer_graph(num_ps, *argv)
        # What every async step runs: the update, and what the hooks fetch.
        step = _ancestors([tg.train_op, tg.loss, tg.global_step_read])
        crossing = sorted((_task(tensor.op), _task(op))
                          for op in step for tensor in op.inputs
                          if _task(tensor.op) != _task(op)
                          and "worker:0" in (_task(tensor.op), _task(op)))
        # The hooks' global step rides with the variables (no read of its own).
        expected = sorted([(f"ps:{i}", "worker:0") for i in range(num_ps)] +
                          [("worker:0", f"ps:{i}") for i in range(num_ps)])
        self.assertEqual(crossing, expected)


class FactoredTrainingTest(absltest.TestCase):

  def test_a_cluster_trains_the_same_bits_with_and_without_factors(self):
    # The trainer's graph on a real PS and worker (servers in this process):
    # at a batch of 8, both kernels' gradients cross as factors.
    test_cluster = InProcessCluster(num_ps=1, num_workers=1)
    log_dir = testutil.make_tempdir(self)

    def train(*argv):
      cfg = testutil.make_config(
          "--model=mlp", "--hidden_units=64", "--dataset=synthetic",
          "--batch_size=8", "--optimizer=sgd", *test_cluster.host_flags(),
          "--job_name=worker", "--task_index=0", f"--log_dir={log_dir}", *argv)
      tg = train_graph.build_graph(cfg, data.load("synthetic"))
      with tg.graph.as_default():
        packs = tf.compat.v1.get_collection(packing.GRADIENT_PACKS)
        init = tf.compat.v1.global_variables_initializer()
      target = test_cluster.targets[0]
      with tf.compat.v1.Session(target, graph=tg.graph) as session:
        session.run(init)  # Resets the PS's variables from the same seed.
        if tg.train_input.initializer is not None:
          session.run(tg.train_input.initializer,
                      feed_dict=tg.train_input.feed_dict)
        for _ in range(5):
          session.run(tg.train_op)
        return packs[0].shape.num_elements(), session.run(tg.model_variables)

    factored_floats, factored = train()
    whole_floats, whole = train("--nofactored_gradients")
    # 784x64 and 64x10 kernels: from 8x784 + 8x64 and 8x64 + 8x10 floats.
    self.assertEqual(factored_floats,
                     8 * 784 + 8 * 64 + 64 + 8 * 64 + 8 * 10 + 16)
    self.assertEqual(whole_floats, 784 * 64 + 64 + 64 * 10 + 16)
    for f, w in zip(factored, whole):
      np.testing.assert_array_equal(f, w)


if __name__ == "__main__":
  absltest.main()
