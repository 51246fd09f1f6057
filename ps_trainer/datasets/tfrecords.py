"""The tf.data pipelines over TFRecord click files (--dataset=tfrecord).

`train_dataset` and `test_dataset` read a RecordSet that record_checks.inspect
has checked; the schema and its checks are there.
"""

import tensorflow as tf

from ps_trainer.datasets import readers
from ps_trainer.datasets import record_checks

__all__ = ["train_dataset", "test_dataset", "shard_files",
           "uses_record_sharding"]

DataError = readers.DataError

# Records in the training shuffle buffer: about 1 MB of click records, and
# wide enough to mix the files read in parallel.
SHUFFLE_BUFFER = 10_000
# Files read at once by a training pipeline.
PARALLEL_READS = 4


def shard_files(files, num_shards: int, shard_index: int) -> tuple:
  """Returns the files worker shard_index reads.

  With at least as many files as workers, worker i reads files i, i + n, ...
  (n = num_shards): each reads only its own. With fewer, every worker reads
  all files, interleaved a record at a time in the same order on every
  worker, and keeps records i, i + n, ... of that stream (record sharding:
  see uses_record_sharding).
  """
  readers.check_shard(num_shards, shard_index)
  files = tuple(files)
  if uses_record_sharding(files, num_shards):
    return files
  return files[shard_index::num_shards]


def uses_record_sharding(files, num_shards: int) -> bool:
  """Whether workers split records, not files: fewer files than workers."""
  return len(files) < num_shards


def _parse(serialized, dense_dim):
  """Parses a batch of serialized Examples into (features, labels)."""
  spec = {"ids": tf.io.VarLenFeature(tf.int64),
          "label": tf.io.FixedLenFeature([], tf.int64)}
  if dense_dim:
    spec["dense"] = tf.io.FixedLenFeature([dense_dim], tf.float32)
  parsed = tf.io.parse_example(serialized, spec)
  labels = parsed["label"]
  ids = parsed["ids"]
  # inspect saw only the first records of each file; a label the model's
  # loss cannot take, or an id that serving would drop, must still fail with
  # a message that says what to do.
  is_binary = tf.reduce_all(tf.logical_or(tf.equal(labels, 0),
                                          tf.equal(labels, 1)))
  ids_whole = tf.reduce_all(tf.greater_equal(ids.values, 0))
  names_it = ("ps_trainer.datasets.record_checks.find_bad_record(files) names "
              "the record")
  with tf.control_dependencies([
      tf.debugging.Assert(is_binary, [
          f"--dataset=tfrecord: a label is not 0 or 1; {names_it}"]),
      tf.debugging.Assert(ids_whole, [
          f"--dataset=tfrecord: an id is negative; {names_it}"])]):
    labels = tf.identity(labels)
  if dense_dim:
    dense = parsed["dense"]
  else:
    # [batch, 0], so a model's concat of embeddings and dense still works.
    dense = tf.zeros(tf.stack([tf.shape(labels)[0], 0]), tf.float32)
    dense.set_shape([labels.shape[0], 0])
  ids.set_shape([labels.shape[0], None])  # parse_example leaves [None, None]
  return {"ids": ids, "dense": dense}, labels


def train_dataset(records: record_checks.RecordSet, batch_size: int, num_shards: int,
                  shard_index: int, seed: int) -> tf.data.Dataset:
  """This worker's endless, shuffled training batches.

  Files are split between workers by shard_files. Records pass a shuffle
  buffer of SHUFFLE_BUFFER records seeded with seed + shard_index and
  reshuffled every epoch; with file sharding the file order is reshuffled
  every epoch too. Batches are exactly batch_size and may span epochs.

  Args:
    records: from inspect.
    batch_size: examples per batch (--batch_size).
    num_shards: number of training workers.
    shard_index: this worker's index in [0, num_shards).
    seed: base random seed (--seed).

  Returns:
    A tf.data.Dataset of (features, labels): features {"ids": int64
    SparseTensor [batch_size, None], "dense": float32 [batch_size, D]},
    labels int64 [batch_size].

  Raises:
    DataError: bad batch_size or shard arguments, or a worker that would get
      no records.
  """
  readers.check_positive(batch_size, "--batch_size")
  files = shard_files(records.train_files, num_shards, shard_index)
  _check_share(records, files, num_shards, shard_index)
  shard_seed = seed + shard_index
  dataset = tf.data.Dataset.from_tensor_slices(list(files))
  by_records = uses_record_sharding(records.train_files, num_shards)
  if not by_records:  # record sharding needs one order on every worker
    dataset = dataset.shuffle(len(files), seed=shard_seed,
                              reshuffle_each_iteration=True)
  dataset = dataset.interleave(
      tf.data.TFRecordDataset, cycle_length=min(len(files), PARALLEL_READS),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if by_records:
    dataset = dataset.shard(num_shards, shard_index)
  dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=shard_seed,
                            reshuffle_each_iteration=True).repeat()
  # Parsing a batch at once is several times faster than record by record.
  dataset = dataset.batch(batch_size, drop_remainder=True).map(
      _parser(records.dense_dim),
      num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.prefetch(tf.data.AUTOTUNE)


def _parser(dense_dim: int):
  """The batch parser tf.data maps over, as it is (data.not_converted)."""
  return tf.autograph.experimental.do_not_convert(
      lambda serialized: _parse(serialized, dense_dim))


def _check_share(records, files, num_shards, shard_index):
  """Raises DataError when worker shard_index would read no record at all.

  An endless pipeline over no records ends at once, so the worker would stop
  at its first step without saying why.
  """
  counts = dict(zip(records.train_files, records.train_records))
  if not counts:
    return
  if uses_record_sharding(records.train_files, num_shards):
    total = sum(counts.values())
    exact = all(count < record_checks.INSPECT_LIMIT
                for count in counts.values())
    if exact and total < num_shards:
      raise DataError(
          f"--data_dir={records.data_dir}: {total} training records cannot "
          f"give each of {num_shards} workers at least one; use fewer workers")
  elif not any(counts.get(f, 1) for f in files):
    raise DataError(
        f"--data_dir={records.data_dir}: worker {shard_index} of {num_shards} "
        f"reads {record_checks.file_names(files)}, which hold no records; write records into "
        f"every train* file or use fewer workers")


def test_dataset(records: record_checks.RecordSet, batch_size: int) -> tf.data.Dataset:
  """One ordered pass over the test files; the last batch may be partial.

  Args:
    records: from inspect.
    batch_size: examples per batch.

  Returns:
    A tf.data.Dataset of (features, labels) as train_dataset's, in file and
    record order, each test record once; re-initialize its iterator for
    another pass.

  Raises:
    DataError: bad batch_size.
  """
  readers.check_positive(batch_size, "--batch_size")
  dataset = tf.data.TFRecordDataset(list(records.test_files))
  dataset = dataset.batch(batch_size).map(
      _parser(records.dense_dim),
      num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.prefetch(tf.data.AUTOTUNE)
