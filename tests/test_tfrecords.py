"""Tests for ps_trainer.datasets.tfrecords: the training and test pipelines over a TFRecord data set
(shapes, shards, shuffling, epochs, what is refused). Small TFRecord files are written into temp
dirs (tfrecords_testlib.py); record k has dense[0] == k, so a batch says which records it holds.
Pipelines run in graph mode.
"""

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from ps_trainer.datasets import record_checks
from ps_trainer.datasets import tfrecords
import testutil
import tfrecords_testlib

# As the trainer runs them (and as the rest of the suite leaves TF).
tf.compat.v1.disable_eager_execution()


def _rows(ids_value, dense, labels):
  """Batch -> {record k: (ids tuple, dense tuple, label)}."""
  rows = {}
  ids = [[] for _ in range(len(labels))]
  for (row, _), value in zip(ids_value.indices, ids_value.values):
    ids[row].append(int(value))
  for i, label in enumerate(labels):
    rows.setdefault(int(dense[i][0]), []).append(
        (tuple(ids[i]), tuple(dense[i].tolist()), int(label)))
  return rows


def _written(first, count):
  ids, dense, labels = tfrecords_testlib.records(first, count)
  return {first + i: (tuple(ids[i]), tuple(dense[i].tolist()), labels[i])
          for i in range(count)}


def _read_records(dataset, batches):
  """Reads batches from dataset; returns the record keys k in stream order
  and {k: [(ids, dense, label) as read, ...]}."""
  with tf.Graph().as_default():
    features, labels = tf.compat.v1.data.make_one_shot_iterator(
        dataset()).get_next()
    with tf.compat.v1.Session() as sess:
      out = [sess.run([features, labels]) for _ in range(batches)]
  order, rows = [], {}
  for value, label in out:
    order.extend(int(k) for k in value["dense"][:, 0])
    for k, seen in _rows(value["ids"], value["dense"], label).items():
      rows.setdefault(k, []).extend(seen)
  return order, rows


class PipelineTest(tf.test.TestCase, parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.directory = testutil.make_tempdir(self)
    tfrecords_testlib.write_set(self.directory)  # train: records 0-9, 10-16, 17-29
    self.records = record_checks.inspect(self.directory)

  def test_shapes_and_dtypes(self):
    with tf.Graph().as_default():
      features, labels = tf.compat.v1.data.make_one_shot_iterator(
          tfrecords.train_dataset(self.records, 8, 1, 0, 0)).get_next()
      self.assertIsInstance(features["ids"], tf.SparseTensor)
      self.assertEqual(features["ids"].dtype, tf.int64)
      self.assertEqual(features["ids"].shape.as_list(), [8, None])
      self.assertEqual(features["dense"].dtype, tf.float32)
      self.assertEqual(features["dense"].shape.as_list(), [8, tfrecords_testlib.DENSE_DIM])
      self.assertEqual(labels.dtype, tf.int64)
      self.assertEqual(labels.shape.as_list(), [8])

  def test_no_dense_gives_zero_columns(self):
    directory = testutil.make_tempdir(self)
    tfrecords_testlib.write_set(directory, dense_dim=0)
    records = record_checks.inspect(directory)
    for dataset in (lambda: tfrecords.train_dataset(records, 4, 1, 0, 0),
                    lambda: tfrecords.test_dataset(records, 4)):
      with tf.Graph().as_default():
        features, labels = tf.compat.v1.data.make_one_shot_iterator(
            dataset()).get_next()
        self.assertEqual(features["dense"].shape.as_list()[1], 0)
        # A model's concat of embeddings and dense works with no columns.
        joined = tf.concat([tf.ones([tf.size(labels), 2]),
                            features["dense"]], axis=1)
        with tf.compat.v1.Session() as sess:
          self.assertEqual(sess.run(joined).shape, (4, 2))

  def test_one_epoch_holds_what_was_written(self):
    order, rows = _read_records(
        lambda: tfrecords.train_dataset(self.records, 10, 1, 0, 3), 3)
    self.assertCountEqual(order, range(30))  # each record once
    self.assertEqual({k: v[0] for k, v in rows.items()}, _written(0, 30))

  @parameterized.named_parameters(
      # 3 files, 2 workers: worker 0 reads files 0 and 2, worker 1 file 1.
      ("file_sharding", 2, [list(range(10)) + list(range(17, 30)),
                            list(range(10, 17))]),
      # 3 files, 4 workers: each reads all and keeps every 4th record of the
      # files' interleaved stream, which is the same on every worker.
      ("record_sharding", 4, None))
  def test_shards_disjoint_and_cover(self, num_shards, expected):
    seen = []
    for shard in range(num_shards):
      size = (len(expected[shard]) if expected
              else len(range(shard, 30, num_shards)))
      order, rows = _read_records(
          lambda: tfrecords.train_dataset(self.records, 3, num_shards, shard,
                                          0), -(-2 * size // 3))
      epoch = order[:size]
      if expected:
        self.assertCountEqual(epoch, expected[shard])
      self.assertCountEqual(order[size:2 * size], epoch)  # endless
      for k in epoch:
        self.assertEqual(rows[k][0], _written(k, 1)[k])
      seen.extend(epoch)
    self.assertCountEqual(seen, range(30))  # disjoint and covering

  def test_shard_files(self):
    files = ("a", "b", "c", "d", "e")
    self.assertEqual(tfrecords.shard_files(files, 2, 0), ("a", "c", "e"))
    self.assertEqual(tfrecords.shard_files(files, 2, 1), ("b", "d"))
    self.assertEqual(tfrecords.shard_files(files, 5, 4), ("e",))
    self.assertEqual(tfrecords.shard_files(files, 6, 5), files)  # by record
    self.assertFalse(tfrecords.uses_record_sharding(files, 5))
    self.assertTrue(tfrecords.uses_record_sharding(files, 6))

  def test_shuffled_reproducibly_and_reshuffled_each_epoch(self):
    read = lambda seed: _read_records(
        lambda: tfrecords.train_dataset(self.records, 30, 1, 0, seed), 2)[0]
    first = read(1)
    self.assertEqual(first, read(1))
    self.assertNotEqual(first, read(2))
    self.assertNotEqual(first[:30], sorted(first[:30]))
    self.assertNotEqual(first[:30], first[30:])

  def test_test_dataset_reads_each_record_once_in_order(self):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      iterator = tf.compat.v1.data.make_initializable_iterator(
          tfrecords.test_dataset(self.records, 4))
      features, labels = iterator.get_next()
      for _ in range(2):  # re-initialized for each evaluation
        sess.run(iterator.initializer)
        sizes, order, rows = [], [], {}
        while True:
          try:
            value, label = sess.run([features, labels])
          except tf.errors.OutOfRangeError:
            break
          sizes.append(len(label))
          order.extend(int(k) for k in value["dense"][:, 0])
          rows.update(_rows(value["ids"], value["dense"], label))
        self.assertEqual(sizes, [4, 4, 3])  # last partial batch kept
        self.assertEqual(order, list(range(30, 41)))
        self.assertEqual({k: v[0] for k, v in rows.items()},
                         _written(30, 11))

  @parameterized.named_parameters(
      ("zero_batch", dict(batch_size=0),
       r"^--batch_size=0: must be a positive integer$"),
      ("zero_shards", dict(num_shards=0),
       r"^num_shards=0: must be a positive integer$"),
      ("shard_out_of_range", dict(shard_index=2),
       r"^shard_index=2: must be in \[0, 2\)$"))
  def test_bad_arguments(self, override, message):
    args = dict(batch_size=2, num_shards=2, shard_index=0, seed=0)
    args.update(override)
    with self.assertRaisesRegex(record_checks.DataError, message):
      tfrecords.train_dataset(self.records, **args)
    if "batch_size" in override:
      with self.assertRaisesRegex(record_checks.DataError, message):
        tfrecords.test_dataset(self.records, 0)

  def test_worker_without_records(self):
    directory = testutil.make_tempdir(self)
    tfrecords_testlib.write_set(directory, train_sizes=(4, 0, 5))
    records = record_checks.inspect(directory)
    tfrecords.train_dataset(records, 2, 3, 0, 0)
    with self.assertRaisesRegex(
        record_checks.DataError, r"worker 1 of 3 reads train-1\.tfrecord, which "
        r"hold no records; write records into every train\* file or use "
        r"fewer workers"):
      tfrecords.train_dataset(records, 2, 3, 1, 0)
    directory = testutil.make_tempdir(self)
    tfrecords_testlib.write_set(directory, train_sizes=(2, 1))
    with self.assertRaisesRegex(
        record_checks.DataError, r"3 training records cannot give each of 4 "
        r"workers at least one; use fewer workers"):
      tfrecords.train_dataset(record_checks.inspect(directory), 2, 4, 3, 0)


if __name__ == "__main__":
  absltest.main()
