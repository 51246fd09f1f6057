"""Tests for ps_trainer.datasets.data: the data sets loaded, and their pipelines.

Pipelines run in graph mode. Reading IDX and npz files: test_readers.py.
"""

import glob
import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import dataset_options_pb2

from ps_trainer.cluster import host_cores
from ps_trainer.datasets import clicks
from ps_trainer.datasets import data
from ps_trainer.datasets import data_files
from ps_trainer.datasets import data_sets
from ps_trainer.datasets import synthetic
import testutil


def _train_input(*args, **kwargs):
  """This worker's training pipeline with its iterator, as the trainer reads it."""
  return data.iterator_input(data.train_dataset(*args, **kwargs))


def _test_input(*args, **kwargs):
  """The test split's pipeline with its iterator, as the trainer scores it."""
  return data.iterator_input(data.test_dataset(*args, **kwargs))


class LoadTest(parameterized.TestCase):

  def test_the_config_knows_which_data_sets_read_which_flag(self):
    # config.py refuses a data flag the data set ignores, and a missing one; its table must
    # be data.load's.
    missing = os.path.join(testutil.make_tempdir(self), "absent")
    for name in data.DATASETS:
      for flag, readers_of_flag in data_files.FILE_FLAGS.items():
        try:
          data.load(name, **{flag: missing})
          read = False
        except data.DataError as e:
          read = missing in str(e)
        self.assertEqual(read, name in readers_of_flag, f"--dataset={name} --{flag}")

  def test_digits_bundled(self):
    ds = data.load("digits")
    self.assertEqual(ds.name, "digits")
    self.assertEqual(ds.input_shape, (8, 8, 1))
    self.assertEqual(ds.num_classes, 10)
    self.assertEqual(ds.x_train.shape, (1437, 8, 8, 1))
    self.assertEqual(ds.x_test.shape, (360, 8, 8, 1))
    self.assertEqual(ds.y_train.shape, (1437,))
    for x in (ds.x_train, ds.x_test):
      self.assertEqual(x.dtype, np.float32)
      self.assertBetween(float(x.min()), 0.0, 0.0)
      self.assertBetween(float(x.max()), 1.0, 1.0)
      np.testing.assert_array_equal(x * 16, np.round(x * 16))  # k / 16
    for y in (ds.y_train, ds.y_test):
      self.assertEqual(y.dtype, np.int64)
      self.assertSetEqual(set(y.tolist()), set(range(10)))  # stratified
    self.assertBetween(np.bincount(ds.y_test).min(), 35, 37)

  def test_digits_file_is_a_valid_npz_input(self):
    path = data_sets.DIGITS_PATH
    np.testing.assert_array_equal(data.load("npz", data_path=path).x_test,
                                  data.load("digits").x_test)
    self.assertLess(os.path.getsize(path), 1 << 20)

  def test_synthetic_test_split_fixed(self):
    first, second = data.load("synthetic"), data.load("synthetic")
    self.assertIsNone(first.x_train)
    self.assertIsNone(first.y_train)
    self.assertEqual(first.input_shape, (28, 28, 1))
    self.assertEqual(first.num_classes, 10)
    self.assertEqual(first.x_test.shape, (1000, 28, 28, 1))
    self.assertEqual(first.x_test.dtype, np.float32)
    self.assertEqual(first.y_test.dtype, np.int64)
    self.assertSetEqual(set(first.y_test.tolist()), set(range(10)))
    self.assertBetween(float(first.x_test.min()), 0.0, 1.0)
    self.assertBetween(float(first.x_test.max()), 0.0, 1.0)
    np.testing.assert_array_equal(first.x_test, second.x_test)
    np.testing.assert_array_equal(first.y_test, second.y_test)

  def test_unknown_name(self):
    with self.assertRaisesRegex(
        data.DataError, r"^--dataset=cifar: unknown data set; accepted: "
        r"digits, synthetic, mnist, npz, tfrecord$"):
      data.load("cifar")

  def test_package_does_not_import_sklearn(self):
    package = os.path.dirname(data.__file__)
    for path in glob.glob(os.path.join(package, "**", "*.py"), recursive=True):
      with open(path) as f:
        self.assertNotRegex(f.read(), r"(?m)^\s*(import|from)\s+sklearn",
                            msg=path)


def _index_data_set(n, shape=(2,)):
  """A DataSet whose example i is filled with the value i (so i is visible)."""
  x = np.broadcast_to(np.arange(n, dtype=np.float32).reshape(
      (n,) + (1,) * len(shape)), (n,) + shape).copy()
  y = np.arange(n, dtype=np.int64)
  return data.DataSet("npz", shape, n, x, y, x[:n // 2], y[:n // 2])


def _read(pipeline, batches):
  """Reads `batches` batches in a fresh session; returns (features, labels)."""
  with tf.compat.v1.Session() as sess:
    if pipeline.initializer is not None:
      sess.run(pipeline.initializer, pipeline.feed_dict)
    out = [sess.run([pipeline.features, pipeline.labels])
           for _ in range(batches)]
  return (np.concatenate([f for f, _ in out]),
          np.concatenate([l for _, l in out]))


def _iterated_options(graph):
  """The tf.data options of the dataset each iterator of `graph` reads: None
  for one not ending in options of its own (TF's defaults, autotune on)."""
  graph_def = graph.as_graph_def()
  nodes = {node.name: node for node in graph_def.node}
  functions = {f.signature.name: f for f in graph_def.library.function}
  read = []
  for node in graph_def.node:
    if node.op == "MakeIterator":  # An initializable iterator.
      read.append(nodes[node.input[0].split(":")[0]])
    elif node.op == "OneShotIterator":  # Its dataset is a function's result.
      factory = functions[node.attr["dataset_factory"].func.name]
      (result,) = factory.ret.values()
      read.append(next(n for n in factory.node_def
                       if n.name == result.split(":")[0]))
  return [dataset_options_pb2.Options.FromString(
      node.attr["serialized_options"].s)
          if node.op == "OptionsDataset" else None for node in read]


def _cpu_seconds(thread):
  with open(f"/proc/self/task/{thread}/schedstat") as schedstat:
    return int(schedstat.read().split()[0]) / 1e9


def _train_labels(ds, batch_size, batches, num_shards=1, shard_index=0,
                  seed=0):
  with tf.Graph().as_default():
    return _read(_train_input(ds, batch_size, num_shards, shard_index,
                                  seed), batches)[1]


class PipelineTest(tf.test.TestCase, parameterized.TestCase):

  def test_train_batches_of_digits(self):
    ds = data.load("digits")
    with tf.Graph().as_default():
      pipeline = _train_input(ds, 32, 2, 1, seed=3)
      self.assertEqual(pipeline.features.shape.as_list(), [32, 8, 8, 1])
      self.assertEqual(pipeline.features.dtype, tf.float32)
      self.assertEqual(pipeline.labels.dtype, tf.int64)
      features, labels = _read(pipeline, 3)
    self.assertEqual(features.shape, (96, 8, 8, 1))
    self.assertEqual(labels.dtype, np.int64)
    self.assertAllInRange(features, 0.0, 1.0)

  def test_arrays_are_fed_not_embedded(self):
    ds = _index_data_set(5000, (64,))
    with tf.Graph().as_default() as graph:
      pipeline = _train_input(ds, 8, 1, 0, seed=0)
      graph_bytes = graph.as_graph_def().ByteSize()
    self.assertLess(graph_bytes, 100_000)  # the array alone is 1.3 MB
    self.assertLen(pipeline.feed_dict, 2)

  @parameterized.named_parameters(
      ("two_shards_small_batch", 40, 2, 4),
      ("three_shards_batch_larger_than_shard", 41, 3, 64))
  def test_shards_disjoint_and_cover(self, n, num_shards, batch_size):
    ds = _index_data_set(n)
    firsts = []
    for shard in range(num_shards):
      size = len(range(shard, n, num_shards))
      batches = -(-2 * size // batch_size)  # at least two epochs
      labels = _train_labels(ds, batch_size, batches, num_shards, shard)
      epoch, second = labels[:size], labels[size:2 * size]
      self.assertCountEqual(epoch, range(shard, n, num_shards))
      self.assertCountEqual(second, epoch)  # endless: epoch two follows
      firsts.append(epoch)
    everything = np.concatenate(firsts)
    self.assertCountEqual(everything, range(n))  # disjoint and covering

  def test_reshuffled_every_epoch(self):
    labels = _train_labels(_index_data_set(40), 40, 2)
    self.assertCountEqual(labels[:40], labels[40:])
    self.assertNotAllEqual(labels[:40], labels[40:])

  def test_shuffle_seeded_per_shard_and_reproducible(self):
    ds = _index_data_set(60)
    # Position of each example within its shard: compares orders across
    # shards, which hold different examples.
    order = lambda shard, seed: _train_labels(ds, 30, 1, 2, shard, seed) // 2
    self.assertAllEqual(order(0, 5), order(0, 5))
    self.assertNotAllEqual(order(0, 5), order(1, 5))
    self.assertNotAllEqual(order(0, 5), order(0, 6))
    # seed + shard_index: shard 1 at seed 5 shuffles like shard 0 at seed 6.
    self.assertAllEqual(order(1, 5), order(0, 6))

  def test_test_input_reads_each_example_once(self):
    ds = _index_data_set(20)  # test split: examples 0..9
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      pipeline = _test_input(ds, 4)
      for _ in range(2):  # the initializer restarts the pass
        sess.run(pipeline.initializer, pipeline.feed_dict)
        sizes, seen = [], []
        while True:
          try:
            features, labels = sess.run([pipeline.features, pipeline.labels])
          except tf.errors.OutOfRangeError:
            break
          sizes.append(len(labels))
          seen.extend(labels)
          self.assertAllEqual(features[:, 0], labels)
        self.assertEqual(sizes, [4, 4, 2])  # last partial batch kept
        self.assertEqual(seen, list(range(10)))  # in order, once each

  def test_pipelines_leave_no_autograph_files(self):
    # A task that restarts or is forced out skips the exit that removes them. In a process of
    # its own: AutoGraph converts a function once per process, so an earlier test here that
    # built the same pipeline would hide the file.
    tmp, clicks_dir = testutil.make_tempdir(self), testutil.make_tempdir(self)
    script = """
import os, sys, tempfile
tempfile.tempdir = sys.argv[1]
import tensorflow as tf
from ps_trainer.datasets import clicks
from ps_trainer.datasets import data
clicks.write_click_set(sys.argv[2], num_train=64, num_test=16, vocab=50, num_shards=2)
for ds in (data.load("digits"), data.load("synthetic"),
           data.load("tfrecord", data_dir=sys.argv[2])):
  with tf.Graph().as_default():
    data.iterator_input(data.train_dataset(ds, 8, 1, 0, seed=0))
    data.iterator_input(data.test_dataset(ds, 8))
print(sorted(n for n in os.listdir(sys.argv[1]) if "autograph" in n))
"""
    out = subprocess.run([sys.executable, "-c", script, tmp, clicks_dir], capture_output=True,
                         text=True, env=testutil.trainer_env(), timeout=120, check=True)
    self.assertEqual(out.stdout.strip().splitlines()[-1], "[]")

  def test_every_pipeline_reads_without_the_autotune_thread(self):
    # TF's autotune thread can miss the wake-up of a session's close and hold
    # it for the rest of its round, up to 60 s (data._without_autotune).
    clicks_dir = testutil.make_tempdir(self)
    clicks.write_click_set(clicks_dir, num_train=64, num_test=16, vocab=50,
                           num_shards=2)
    for ds in (data.load("digits"), data.load("synthetic"),
               data.load("tfrecord", data_dir=clicks_dir)):
      with self.subTest(ds.name), tf.Graph().as_default() as graph:
        _train_input(ds, 8, 2, 1, seed=0)
        _test_input(ds, 8)
        options = _iterated_options(graph)
        self.assertLen(options, 2)  # The training and the test iterator.
        for option in options:
          self.assertIsNotNone(option)
          self.assertTrue(option.autotune_options.HasField("enabled"))
          self.assertFalse(option.autotune_options.enabled)

  def test_synthetic_pipeline(self):
    ds = data.load("synthetic")
    with tf.Graph().as_default():
      pipeline = _train_input(ds, 16, 2, 0, seed=1)
      self.assertIsNotNone(pipeline.initializer)  # Its thread pool needs one.
      self.assertEqual(pipeline.feed_dict, {})
      self.assertEqual(pipeline.features.shape.as_list(), [16, 28, 28, 1])
      self.assertEqual(pipeline.labels.dtype, tf.int64)
      features, labels = _read(pipeline, 50)  # endless: far past any epoch
    self.assertAllInRange(features, 0.0, 1.0)
    self.assertAllInRange(labels, 0, 9)
    self.assertLen(set(labels.tolist()), 10)
    self.assertAllEqual(_train_labels(ds, 16, 2, 2, 0, 1),
                        _train_labels(ds, 16, 2, 2, 0, 1))
    self.assertNotAllEqual(_train_labels(ds, 16, 2, 2, 0, 1),
                           _train_labels(ds, 16, 2, 2, 1, 1))

  @absltest.skipIf(not os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"),
                   "needs Linux per-thread CPU time")
  def test_synthetic_batches_are_drawn_on_the_named_input_thread(self):
    # host_cores.release_threads finds the thread by this name; if the draws
    # ran on TF's op threads instead, releasing it would free nothing.
    ds = data.load("synthetic")
    # Pipelines of earlier tests in this process may keep theirs.
    earlier = set(host_cores.threads_named(data.INPUT_THREAD_NAME))
    with tf.Graph().as_default():
      pipeline = _train_input(ds, 64, 1, 0, seed=0)
      with tf.compat.v1.Session() as sess:
        sess.run(pipeline.initializer)
        threads = [thread for thread in
                   host_cores.threads_named(data.INPUT_THREAD_NAME)
                   if thread not in earlier]
        self.assertLen(threads, 1)
        before = _cpu_seconds(threads[0])
        for _ in range(400):
          sess.run(pipeline.features)
        spent = _cpu_seconds(threads[0]) - before
    # 400 batches of 64 take 0.08-0.12 s of a core to draw (0.2-0.3 ms each).
    self.assertGreater(spent, 0.03)

  def test_synthetic_batches_and_the_numpy_split_share_one_distribution(self):
    # The test split (and the bench's plain TF1 baseline) come from numpy,
    # training batches from TF: a change to one generator alone would train
    # and test on different tasks. Gaussian noise of the same deviation would
    # move the mean pixel by 0.02 and the share of pixels clipped at 1 by 0.015.
    ds = data.load("synthetic")
    with tf.Graph().as_default():
      features, _ = _read(_train_input(ds, 500, 1, 0, seed=5), 4)
    numpy_features, _ = synthetic.arrays(2000, seed=11)

    def summary(x):
      return [x.mean(), x.std(), (x == 0).mean(), (x == 1).mean()]

    self.assertAllClose(summary(features), summary(numpy_features), atol=3e-3)

  def test_synthetic_learnable_by_linear_model(self):
    ds = data.load("synthetic")
    with tf.Graph().as_default():
      train = _train_input(ds, 64, 1, 0, seed=0)
      test = _test_input(ds, 500)
      weights = tf.Variable(tf.zeros([28 * 28, 10]))
      bias = tf.Variable(tf.zeros([10]))
      logits = lambda x: tf.matmul(tf.reshape(x, [-1, 28 * 28]), weights) + bias
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=train.labels, logits=logits(train.features)))
      step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
      hits = tf.reduce_sum(tf.cast(tf.equal(
          tf.argmax(logits(test.features), 1), test.labels), tf.int32))
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train.initializer)
        for _ in range(200):
          sess.run(step)
        sess.run(test.initializer, test.feed_dict)
        accuracy = (sess.run(hits) + sess.run(hits)) / 1000
    self.assertGreater(accuracy, 0.9)

  @parameterized.named_parameters(
      ("zero_batch", dict(batch_size=0), r"^--batch_size=0: must be a "
       r"positive integer$"),
      ("shard_out_of_range", dict(shard_index=2),
       r"^shard_index=2: must be in \[0, 2\)$"),
      ("more_shards_than_examples", dict(num_shards=4, shard_index=3),
       r"^--dataset=npz: 3 training examples cannot give each of 4 workers "
       r"at least one"))
  def test_bad_arguments(self, override, message):
    args = dict(batch_size=2, num_shards=2, shard_index=0, seed=0)
    args.update(override)
    with tf.Graph().as_default():
      with self.assertRaisesRegex(data.DataError, message):
        _train_input(_index_data_set(3), **args)


if __name__ == "__main__":
  absltest.main()
