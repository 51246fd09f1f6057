"""Packed reads and gradients: one tensor per PS each way, the same numbers."""

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from ps_trainer import packing

CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def _model(features):
  """A two-layer model from get_variable, as models.py builds them."""
  with tf.compat.v1.variable_scope("model", reuse=tf.compat.v1.AUTO_REUSE):
    w1 = tf.compat.v1.get_variable(
        "w1", initializer=np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    b1 = tf.compat.v1.get_variable("b1", initializer=np.float32([.1, .2, .3]))
    w2 = tf.compat.v1.get_variable(
        "w2", initializer=np.linspace(1, -1, 6, dtype=np.float32).reshape(3, 2))
  hidden = tf.nn.relu(tf.linalg.matmul(features, w1) + b1)
  return tf.reduce_sum(tf.square(tf.linalg.matmul(hidden, w2)))


def _ancestors(tensors):
  """Every op the tensors depend on."""
  seen, todo = set(), [t.op for t in tensors]
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
    self.assertLen(casts, 4)  # To and from the wire, both ways.
    with graph.as_default():
      self.assertTrue(all(v.dtype.base_dtype == tf.float32
                          for v in tf.compat.v1.global_variables()))

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


if __name__ == "__main__":
  absltest.main()
