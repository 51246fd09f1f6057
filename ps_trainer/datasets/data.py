"""Data sets and tf.data input pipelines, one shard per worker.

`load` reads a data set into numpy arrays (the ones read whole are
data_sets.py's, file formats readers.py's) and reports every bad input as a
one-line DataError. `train_dataset` and `test_dataset` are its graph-mode
tf.data pipelines (models/inputs.py makes them an input_fn), and
`iterator_input` reads one.

In-memory arrays enter the graph through placeholders fed once, when the
iterator's initializer runs (`feeds` names them), never as graph constants
(they can be hundreds of MB, and constants would be copied into every
GraphDef sent to the cluster) and never through feed_dict on every step
(slow with many replicas).

Data sets:
  digits     real 8x8 hand-written digits bundled in assets/digits.npz
             (UCI, CC BY 4.0; see assets/DIGITS_LICENSE.md), the default.
  synthetic  MNIST-shaped noisy class templates, generated in-graph
             (synthetic.py).
  mnist      the four standard IDX files in --data_dir.
  npz        a keras-layout .npz in --data_path.
  tfrecord   click records (sparse ids, dense features, a 0/1 label) in
             train* and test* TFRecord files in --data_dir, streamed from
             disk rather than loaded (tfrecords.py).
"""

import typing

import tensorflow as tf

from ps_trainer.datasets import data_files
from ps_trainer.datasets import data_sets
from ps_trainer.datasets import readers
from ps_trainer.datasets import record_checks
from ps_trainer.datasets import synthetic
from ps_trainer.datasets import tfrecords
from ps_trainer.datasets.data_sets import DataSet
from ps_trainer.datasets.readers import DataError

__all__ = ["DATASETS", "DataError", "DataSet", "INPUT_THREAD_NAME", "Input",
           "feature_specs", "feeds", "find_bad_records",
           "iterator_input", "load", "may_be_bad_records", "test_dataset",
           "train_dataset", "without_autotune"]

DATASETS = ("digits", "synthetic", "mnist", "npz", "tfrecord")

# The thread that draws synthetic batches. TF names a pool's threads "tf_" +
# its name; Linux keeps 15 characters of a thread's name, so keep it short.
_INPUT_POOL = "input"
INPUT_THREAD_NAME = "tf_" + _INPUT_POOL


class Input(typing.NamedTuple):
  """The tensors of one input pipeline.

  Attributes:
    features: float32 [batch, *input_shape]; for tfrecord a dict of "ids"
      (int64 SparseTensor [batch, None]) and "dense" (float32 [batch, D]).
    labels: int64 [batch].
    initializer: run once per session, with feed_dict, before reading
      features or labels; running it again restarts the pipeline. None when
      the pipeline needs no initialization.
    feed_dict: placeholder -> numpy array, fed when running initializer.
  """
  features: tf.Tensor
  labels: tf.Tensor
  initializer: tf.Operation | None
  feed_dict: dict


def load(name, data_dir="", data_path=""):
  """Loads a data set into memory with numpy (no TensorFlow ops).

  Args:
    name: one of DATASETS (the --dataset value).
    data_dir: --data_dir, the directory of the MNIST IDX files or of the
      TFRecord files (mnist and tfrecord).
    data_path: --data_path, the .npz file (npz only).

  Returns:
    A DataSet.

  Raises:
    DataError: unknown name, missing flag, or a missing or bad file.
  """
  if name == "tfrecord" and data_dir:  # Not data_sets.read's look again.
    records = record_checks.inspect(data_dir)
    return DataSet(name, (records.dense_dim,), 2, None, None, None, None,
                   records=records)
  in_memory = data_sets.read(name, data_dir, data_path)
  if in_memory is not None:
    return in_memory
  if name == "synthetic":
    x_test, y_test = synthetic.arrays(synthetic.TEST_SIZE, synthetic.TEST_SEED)
    return DataSet(name, synthetic.SHAPE, synthetic.CLASSES, None, None,
                   x_test, y_test)
  missing = data_files.missing_file_flag(name, data_dir, data_path)
  if missing:
    raise DataError(missing)
  raise DataError(f"--dataset={name}: unknown data set; accepted: "
                  f"{', '.join(DATASETS)}")


def may_be_bad_records(ds, error) -> bool:
  """Whether a run's TF error can come from a bad record of `ds`.

  Only streamed data sets are read during training (the others were read
  whole and checked before it), and only corrupt bytes or a record that
  breaks the schema fail the pipeline.
  """
  if ds.records is None:
    return False
  if isinstance(error, tf.errors.DataLossError):
    return True
  message = error.message or ""
  return isinstance(error, tf.errors.InvalidArgumentError) and (
      "IteratorGetNext" in message or "find_bad_record" in message)


def find_bad_records(ds):
  """After the input pipeline failed: a one-line DataError message naming
  the file and record at fault, or None (no bad record found).

  Scans every train and test file in full (about 100,000 records a
  second), and says so first: on a large data set that takes a while.
  """
  files = ds.records.train_files + ds.records.test_files
  print(f"ps_trainer: the input pipeline failed; scanning {len(files)} "
        "TFRecord file(s) for the bad record ...", flush=True)
  return record_checks.find_bad_record(files, ds.records.dense_dim)


def not_converted(function):
  """`function` for tf.data as it is, without AutoGraph.

  AutoGraph would rewrite it into a file in the temporary directory that is
  deleted only at a normal exit, and a task that restarts or is forced out
  ends without one: each such start left files behind. These functions are
  plain graph code, with no Python control flow to convert.
  """
  return tf.autograph.experimental.do_not_convert(function)


def train_dataset(ds, batch_size, num_shards, shard_index, seed):
  """This worker's endless training batches.

  Worker shard_index reads examples shard_index, shard_index + num_shards, ...
  (the assignment of Dataset.shard), shuffled with seed + shard_index and
  reshuffled every epoch. Batches are exactly batch_size and may span epochs,
  so a shard smaller than batch_size still works.

  The shard is cut in numpy before feeding, so a worker's session holds only
  its shard; the shuffle runs over int64 indices and each batch is gathered
  at once, so the shuffle buffer costs 8 bytes per example instead of a
  second copy of the images.

  Args:
    ds: the DataSet.
    batch_size: examples per batch (--batch_size).
    num_shards: number of training workers.
    shard_index: this worker's index in [0, num_shards).
    seed: base random seed (--seed).

  Returns:
    A tf.data.Dataset of (features, labels); arrays enter it through
    placeholders that feeds() names.

  Raises:
    DataError: bad batch_size or shard arguments, or fewer training examples
      than shards.
  """
  readers.check_positive(batch_size, "--batch_size")
  readers.check_shard(num_shards, shard_index)
  shard_seed = seed + shard_index
  if ds.records is not None:
    return tfrecords.train_dataset(ds.records, batch_size, num_shards,
                                   shard_index, seed)
  if ds.x_train is None:  # synthetic: generated here, endless by itself.
    dataset = tf.data.Dataset.counter().map(not_converted(
        lambda step: synthetic.batch(step, batch_size, shard_seed)))
    # Its own thread holds a pool resource: the iterator is initializable.
    return _on_input_thread(dataset.prefetch(tf.data.AUTOTUNE))
  if len(ds.x_train) < num_shards:
    raise DataError(
        f"--dataset={ds.name}: {len(ds.x_train)} training examples cannot "
        f"give each of {num_shards} workers at least one; use fewer workers")
  return _array_dataset(ds.x_train[shard_index::num_shards],
                        ds.y_train[shard_index::num_shards], batch_size,
                        shuffle_seed=shard_seed)


def test_dataset(ds, batch_size):
  """The whole test split once, in order. The last batch may be smaller
  than batch_size.

  Raises:
    DataError: bad batch_size.
  """
  readers.check_positive(batch_size, "--batch_size")
  if ds.records is not None:
    return tfrecords.test_dataset(ds.records, batch_size)
  return _array_dataset(ds.x_test, ds.y_test, batch_size, shuffle_seed=None)


_FEEDS = "ps_trainer/input_feeds"


def feeds(graph: tf.Graph) -> dict:
  """placeholder -> numpy array: what the iterators over arrays of `graph`
  need fed when their initializers run."""
  return dict(graph.get_collection(_FEEDS))


def feature_specs(ds):
  """The structure of one batch's features, with a batch dimension of None:
  a TensorSpec, or for click records {"ids": a SparseTensorSpec, "dense":
  a TensorSpec} ("dense" only when the records have dense features)."""
  if ds.name != "tfrecord":
    return tf.TensorSpec((None,) + tuple(ds.input_shape), tf.float32)
  specs = {"ids": tf.SparseTensorSpec([None, None], tf.int64)}
  if ds.input_shape[0]:
    specs["dense"] = tf.TensorSpec((None,) + tuple(ds.input_shape), tf.float32)
  return specs


def _on_input_thread(dataset):
  """Makes one thread of its own, named INPUT_THREAD_NAME, produce dataset.

  Otherwise the batches are drawn on the session's op threads, where nothing
  tells them from training. Named, a pinned task can let this thread alone
  use the host's idle cores (host_cores.release_threads): drawing a synthetic
  batch of 64 costs about 0.2 ms of a core, a tenth of a 1 PS + 1 worker step
  here (0.5-0.9 ms with Gaussian noise, before 2026-11-26).
  """
  pool = tf.raw_ops.ThreadPoolHandle(num_threads=1, display_name=_INPUT_POOL)
  specs = tf.nest.flatten(dataset.element_spec)
  variant = tf.raw_ops.ThreadPoolDataset(
      input_dataset=tf.data.experimental.to_variant(dataset), thread_pool=pool,
      output_types=[spec.dtype for spec in specs],
      output_shapes=[spec.shape for spec in specs])
  return tf.data.experimental.from_variant(variant, dataset.element_spec)


def without_autotune(dataset):
  """The dataset, to be iterated without tf.data's autotuning thread.

  That thread waits between its rounds, and the rounds grow to 60 s. Closing
  a session (or initializing an iterator again) wakes it before TF marks the
  iterator cancelled, so it can miss the wake-up and hold the close for the
  rest of its round: seen as 10-30 s ends of runs on tasks pinned to one core.
  Without it, prefetch(AUTOTUNE) still grows its buffer when it runs dry, and
  map(num_parallel_calls=AUTOTUNE) runs on as many threads as its pool has.
  """
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)


def iterator_input(dataset):
  """An Input over a tf.data pipeline in the default graph, with an
  initializable iterator, fed what the graph's arrays need (feeds)."""
  iterator = tf.compat.v1.data.make_initializable_iterator(
      without_autotune(dataset))
  features, labels = iterator.get_next()
  return Input(features, labels, iterator.initializer,
               feeds(tf.compat.v1.get_default_graph()))


def _array_dataset(x, y, batch_size, shuffle_seed):
  """Batches of arrays fed through placeholders (see feeds).

  Args:
    x: float32 [N, ...].
    y: int64 [N].
    batch_size: examples per batch.
    shuffle_seed: None for one ordered pass keeping the last partial batch;
      else an endless, shuffled stream of full batches.
  """
  x_in = tf.compat.v1.placeholder(tf.float32, (None,) + x.shape[1:],
                                  name="features")
  y_in = tf.compat.v1.placeholder(tf.int64, (None,), name="labels")
  tf.compat.v1.add_to_collection(_FEEDS, (x_in, x))
  tf.compat.v1.add_to_collection(_FEEDS, (y_in, y))
  # Sized from the fed array, so the graph does not depend on N.
  count = tf.shape(y_in, out_type=tf.int64)[0]
  dataset = tf.data.Dataset.range(count)
  if shuffle_seed is not None:
    dataset = dataset.shuffle(count, seed=shuffle_seed,
                              reshuffle_each_iteration=True).repeat()
  dataset = dataset.batch(batch_size, drop_remainder=shuffle_seed is not None)
  dataset = dataset.map(
      not_converted(lambda i: (tf.gather(x_in, i), tf.gather(y_in, i))))
  return dataset.prefetch(tf.data.AUTOTUNE)
