"""Tests for --model=wide_deep: partitioned tables, sparse gradients, sparse updates.

Graph mode, no servers: placement is decided when ops are created, and the
updates are checked in a local session.
"""

import re

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from ps_trainer import models
from ps_trainer.graph import optimizers
from ps_trainer.graph import packing
from ps_trainer.graph import placement
from ps_trainer.graph import sync_replicas
from ps_trainer.settings import cluster

tf.compat.v1.disable_eager_execution()

_VOCAB = 1000
_DIM = 4
_DENSE = 3
_TABLES = ("model/wide/weights", "model/deep/embedding")


def _info(num_ps):
  ps = ",".join(f"127.0.0.1:{2000 + i}" for i in range(num_ps))
  return cluster.from_flags(ps, "127.0.0.1:3000", "worker", 0)


def _inputs():
  ids = tf.compat.v1.sparse_placeholder(tf.int64, [None, None], name="ids")
  dense = tf.compat.v1.placeholder(tf.float32, [None, _DENSE], name="dense")
  labels = tf.compat.v1.placeholder(tf.int64, [None], name="labels")
  return {"ids": ids, "dense": dense}, labels


def _build(num_ps):
  """The model on placeholders: (features, labels, loss) in the default graph."""
  features, labels = _inputs()
  logits = models.build_logits(
      "wide_deep", features, (_DENSE,), 2, (8,), vocab_size=_VOCAB,
      embedding_dim=_DIM, partitioner=tf.compat.v1.fixed_size_partitioner(max(num_ps, 1)))
  loss, _ = models.loss_and_accuracy(logits, labels)
  return features, labels, logits, loss


def _parts(table):
  """The parts of a table, not their optimizer slots."""
  return [v for v in tf.compat.v1.global_variables()
          if re.fullmatch(re.escape(table) + r"/part_\d+", v.op.name)]


def _feed(features, labels, rows):
  """Feeds a batch whose example i has the ids rows[i] (possibly none)."""
  indices = [[i, j] for i, row in enumerate(rows) for j in range(len(row))]
  values = [id_ for row in rows for id_ in row]
  return {
      features["ids"]: tf.compat.v1.SparseTensorValue(
          np.array(indices, np.int64).reshape(-1, 2),
          np.array(values, np.int64),
          np.array([len(rows), max(map(len, rows))], np.int64)),
      features["dense"]: np.ones((len(rows), _DENSE), np.float32),
      labels: np.array([1] * len(rows), np.int64)}


class PartitionTest(parameterized.TestCase):

  @parameterized.parameters(1, 2, 4)
  def test_every_ps_holds_a_part_of_each_table(self, num_ps):
    with tf.Graph().as_default():
      with tf.compat.v1.device(placement.device_function(_info(num_ps))):
        _build(num_ps)
      for table in _TABLES:
        parts = _parts(table)
        self.assertLen(parts, num_ps, table)
        self.assertEqual(sorted(v.device for v in parts),
                         [f"/job:ps/task:{i}" for i in range(num_ps)], table)
        self.assertEqual(sum(v.shape[0] for v in parts), _VOCAB)

  def test_tables_are_not_packed(self):
    # A packed read would move the whole table every step.
    with tf.Graph().as_default():
      with tf.compat.v1.device(placement.device_function(_info(2))):
        _build(2)
        reads = packing.PackedReads(tf.compat.v1.trainable_variables())
      for table in _TABLES:
        for part in _parts(table):
          self.assertIsNone(reads.value_of(part), part.op.name)
      dense = [v for v in tf.compat.v1.trainable_variables()
               if "hidden0/kernel" in v.op.name]
      self.assertIsNotNone(reads.value_of(dense[0]))


class SparseGradientTest(parameterized.TestCase):

  @parameterized.parameters(False, True)
  def test_table_gradients_stay_sparse(self, sync):
    with tf.Graph().as_default() as graph:
      with tf.compat.v1.device(placement.device_function(_info(2))):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        _, _, _, loss = _build(2)
        optimizer = optimizers.make_optimizer("adagrad", 0.1)
        if sync:
          optimizer = sync_replicas.SyncOptimizer(optimizer, 2, 2, replica_index=0)
        grads_and_vars = optimizer.compute_gradients(loss)
        optimizer.apply_gradients(grads_and_vars, global_step=global_step)
      part_shapes = set()
      for table in _TABLES:
        for part in _parts(table):
          part_shapes.add(tuple(part.shape.as_list()))
          grad = dict((v.op.name, g) for g, v in grads_and_vars)[part.op.name]
          self.assertIsInstance(grad, tf.IndexedSlices, part.op.name)
      # Nothing in the gradient computation has the shape of a whole part.
      for op in graph.get_operations():
        if "gradients" not in op.name:
          continue
        for out in op.outputs:
          if out.shape.rank is not None and out.shape.is_fully_defined():
            self.assertNotIn(tuple(out.shape.as_list()), part_shapes,
                             f"{op.name} ({op.type}) makes a dense table "
                             "gradient")

  @parameterized.parameters("sgd", "adagrad", "momentum")
  def test_a_step_changes_only_the_rows_it_looked_up(self, optimizer_name):
    rows = [[3, 1003], [17], [], [999, 3]]  # 1003 hashes to row 3.
    touched = {3, 17, 999}
    with tf.Graph().as_default():
      # Fixed weights: with some random draws every ReLU of an example's deep
      # tower is off, and its embedding rows rightly get no gradient.
      tf.compat.v1.set_random_seed(1)
      features, labels, _, loss = _build(2)
      train = optimizers.make_optimizer(optimizer_name, 0.5).minimize(loss)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        tables = {t: tf.concat([p.read_value() for p in _parts(t)], 0)
                  for t in _TABLES}
        before = session.run(tables)
        session.run(train, _feed(features, labels, rows))
        after = session.run(tables)
    for table in _TABLES:
      changed = set(np.flatnonzero(
          np.any(before[table] != after[table], axis=1)).tolist())
      self.assertEqual(changed, touched, table)

  def test_an_example_without_ids_keeps_its_place(self):
    with tf.Graph().as_default():
      features, labels, logits, _ = _build(1)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        out = session.run(logits, _feed(features, labels, [[5], [], [7], []]))
    self.assertEqual(out.shape, (4, 2))
    np.testing.assert_array_equal(out[:, 0], 0.0)  # [0, z]: sigmoid of z.


class ModelErrorTest(parameterized.TestCase):

  def test_needs_click_features(self):
    with tf.Graph().as_default():
      images = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 1])
      with self.assertRaisesRegex(models.ModelError,
                                  r"^--model=wide_deep .* --dataset=tfrecord$"):
        models.build_logits("wide_deep", images, (8, 8, 1), 10)


if __name__ == "__main__":
  tf.test.main()
