"""Tests for ps_trainer.record_checks, ps_trainer.tfrecords and ps_trainer.clicks.

Small TFRecord files are written into temp dirs with write_examples, the
schema's reference writer. Record k of a data set has dense[0] == k, so a
batch says which records it holds. Pipelines run in graph mode.
"""

import contextlib
import io
import os
import re
import struct
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from ps_trainer import clicks
from ps_trainer import record_checks
from ps_trainer import tfrecords
import testutil

# As the trainer runs them (and as the rest of the suite leaves TF).
tf.compat.v1.disable_eager_execution()

DENSE_DIM = 3


def _records(first, count, dense_dim=DENSE_DIM):
  """Records first .. first + count - 1: (ids, dense, labels).

  Record k has k % 4 ids (none for k % 4 == 0), dense [k, -k, 0.5] and
  label k % 2.
  """
  ks = range(first, first + count)
  ids = [[k * 10 + j for j in range(k % 4)] for k in ks]
  dense = np.array([[k, -k, 0.5][:dense_dim] for k in ks], np.float32)
  dense = dense.reshape(count, dense_dim)
  return ids, dense if dense_dim else None, np.array([k % 2 for k in ks])


def _write_set(directory, train_sizes=(10, 7, 13), test_sizes=(5, 6),
               dense_dim=DENSE_DIM):
  """Writes train-i and test-i files of consecutive records; returns them."""
  first, paths = 0, []
  for split, sizes in (("train", train_sizes), ("test", test_sizes)):
    for i, size in enumerate(sizes):
      path = os.path.join(directory, f"{split}-{i}.tfrecord")
      record_checks.write_examples(path, *_records(first, size, dense_dim))
      paths.append(path)
      first += size
  return paths


def _example(**features):
  """A serialized Example; values: ("int64" | "float" | "bytes", list)."""
  feature = {}
  for name, (kind, values) in features.items():
    lists = {"int64": ("int64_list", tf.train.Int64List),
             "float": ("float_list", tf.train.FloatList),
             "bytes": ("bytes_list", tf.train.BytesList)}
    field, cls = lists[kind]
    feature[name] = tf.train.Feature(**{field: cls(value=values)})
  return tf.train.Example(
      features=tf.train.Features(feature=feature)).SerializeToString()


def _write_raw(path, records):
  with tf.io.TFRecordWriter(path) as writer:
    for record in records:
      writer.write(record)
  return path


def _record_offsets(path):
  """Byte offset of each record's payload in a TFRecord file."""
  with open(path, "rb") as f:
    raw = f.read()
  offsets, at = [], 0
  while at < len(raw):
    (length,) = struct.unpack("<Q", raw[at:at + 8])
    offsets.append(at + 12)  # length (8) and its CRC (4), then the payload
    at += 12 + length + 4
  return offsets


def _flip_payload_byte(path, record):
  raw = bytearray(open(path, "rb").read())
  raw[_record_offsets(path)[record] + 3] ^= 0xFF
  with open(path, "wb") as f:
    f.write(bytes(raw))


class InspectTest(parameterized.TestCase):

  def test_finds_files_and_schema(self):
    directory = testutil.make_tempdir(self)
    paths = _write_set(directory)
    with open(os.path.join(directory, "README.txt"), "w") as f:
      f.write("not data\n")
    os.mkdir(os.path.join(directory, "train_logs"))  # not a file: skipped
    records = record_checks.inspect(directory)
    self.assertEqual(records.data_dir, directory)
    self.assertEqual(records.train_files, tuple(paths[:3]))
    self.assertEqual(records.test_files, tuple(paths[3:]))
    self.assertEqual(records.dense_dim, DENSE_DIM)
    self.assertEqual(records.train_records, (10, 7, 13))
    ids = sum(k % 4 for k in range(41))
    self.assertAlmostEqual(records.mean_ids_per_example, ids / 41)

  def test_without_dense(self):
    directory = testutil.make_tempdir(self)
    _write_set(directory, dense_dim=0)
    self.assertEqual(record_checks.inspect(directory).dense_dim, 0)

  def test_reads_only_the_first_records_of_a_file(self):
    directory = testutil.make_tempdir(self)
    _write_set(directory, train_sizes=(250,))
    train = os.path.join(directory, "train-0.tfrecord")
    _flip_payload_byte(train, 200)  # past INSPECT_LIMIT
    records = record_checks.inspect(directory)
    self.assertEqual(records.train_records, (record_checks.INSPECT_LIMIT,))
    self.assertRegex(record_checks.find_bad_record(records.train_files),
                     rf"^{re.escape(train)}: record 200: corrupt")

  def test_empty_file_allowed_among_others(self):
    directory = testutil.make_tempdir(self)
    _write_set(directory, train_sizes=(0, 4))
    self.assertEqual(record_checks.inspect(directory).train_records, (0, 4))

  def test_data_dir_not_set(self):
    with self.assertRaisesRegex(
        record_checks.DataError, r"^--data_dir is not set; --dataset=tfrecord "
        r"needs --data_dir=DIR holding train\* and test\* files: .*ids \(int64 "
        r"list\), label \(int64, 0 or 1\) and optional dense"):
      record_checks.inspect("")

  def test_missing_dir(self):
    missing = os.path.join(testutil.make_tempdir(self), "nope")
    with self.assertRaisesRegex(
        record_checks.DataError,
        rf"^--data_dir={re.escape(missing)}: no such directory; "
        r"--dataset=tfrecord needs"):
      record_checks.inspect(missing)

  def test_unlistable_dir(self):
    directory = testutil.make_tempdir(self)
    _write_set(directory)
    # Tests run as root, whom no directory mode keeps out: the refusal is faked.
    denied = PermissionError(13, "Permission denied", directory)
    with mock.patch.object(record_checks.os, "listdir", side_effect=denied):
      with self.assertRaisesRegex(
          record_checks.DataError, rf"^--data_dir={re.escape(directory)}: "
          r"cannot list \(Permission denied\); --dataset=tfrecord needs"):
        record_checks.inspect(directory)

  @parameterized.named_parameters(("train", "train"), ("test", "test"))
  def test_no_files_of_a_split(self, split):
    directory = testutil.make_tempdir(self)
    for path in _write_set(directory):
      if os.path.basename(path).startswith(split):
        os.remove(path)
    with self.assertRaisesRegex(
        record_checks.DataError, rf"^--data_dir={re.escape(directory)}: no "
        rf"{split}\* files \(found: .*-0\.tfrecord, .*\); --dataset=tfrecord "
        r"needs"):
      record_checks.inspect(directory)

  def test_split_without_records(self):
    directory = testutil.make_tempdir(self)
    _write_set(directory, train_sizes=(0, 0))
    with self.assertRaisesRegex(
        record_checks.DataError, rf"^--data_dir={re.escape(directory)}: the "
        r"train\* files \(train-0\.tfrecord, train-1\.tfrecord\) hold no "
        r"records; each split needs at least one$"):
      record_checks.inspect(directory)

  def _bad_file(self, records=None, content=None, name="train-1.tfrecord"):
    """A good data set whose file `name` is replaced; returns (dir, path)."""
    directory = testutil.make_tempdir(self)
    _write_set(directory)
    path = os.path.join(directory, name)
    if content is None:
      _write_raw(path, records)
    else:
      with open(path, "wb") as f:
        f.write(content)
    return directory, path

  def _assert_inspect_error(self, directory, path, message):
    with self.assertRaises(record_checks.DataError) as cm:
      record_checks.inspect(directory)
    text = str(cm.exception)
    self.assertNotIn("\n", text)
    self.assertRegex(text, rf"^{re.escape(path)}: {message}")

  good = dict(ids=("int64", [1, 2]), label=("int64", [1]),
              dense=("float", [1.0, 2.0, 3.0]))

  @parameterized.named_parameters(
      ("not_an_example", b"\xff\xff\xff garbage",
       r"record 1: not a tf\.train\.Example \(.+\); --dataset=tfrecord needs"),
      ("missing_ids", dict(good, ids=None),
       r"record 1: no 'ids' feature \(found: dense, label\); "
       r"--dataset=tfrecord needs"),
      ("missing_label", dict(good, label=None),
       r"record 1: no 'label' feature \(found: dense, ids\)"),
      ("ids_as_floats", dict(good, ids=("float", [1.0])),
       r"record 1: feature 'ids' is float_list; expected int64_list"),
      ("ids_as_bytes", dict(good, ids=("bytes", [b"a"])),
       r"record 1: feature 'ids' is bytes_list; expected int64_list"),
      ("label_as_float", dict(good, label=("float", [1.0])),
       r"record 1: feature 'label' is float_list; expected int64_list"),
      ("dense_as_ints", dict(good, dense=("int64", [1, 2, 3])),
       r"record 1: feature 'dense' is int64_list; expected float_list"),
      ("label_two", dict(good, label=("int64", [2])),
       r"record 1: label is 2; expected 0 or 1 \(a binary click\)"),
      ("two_labels", dict(good, label=("int64", [0, 1])),
       r"record 1: label has 2 values; expected one, 0 or 1"),
      ("negative_id", dict(good, ids=("int64", [3, -4, 7])),
       r"record 1: ids\[1\] is -4; expected ids >= 0 \(the served model drops "
       r"negative ids\) \(--dataset=tfrecord\)$"),
      ("dense_length", dict(good, dense=("float", [1.0, 2.0])),
       r"record 1: dense has 2 values but .*train-0\.tfrecord: record 0 has "
       r"3; dense must have the same length in every record"),
      ("dense_missing", dict(good, dense=None),
       r"record 1: dense has 0 values but .*train-0\.tfrecord: record 0 has "
       r"3"))
  def test_bad_record(self, record, message):
    if isinstance(record, dict):
      record = _example(**{k: v for k, v in record.items() if v is not None})
    good = _example(**self.good)
    directory, path = self._bad_file([good, record, good])
    self._assert_inspect_error(directory, path, message)
    self.assertRegex(record_checks.find_bad_record([path]),
                     rf"^{re.escape(path)}: record 1: ")

  def test_dense_length_differs_between_files(self):
    directory = testutil.make_tempdir(self)
    _write_set(directory)
    test = os.path.join(directory, "test-1.tfrecord")
    record_checks.write_examples(test, *_records(0, 3, dense_dim=2))
    self._assert_inspect_error(
        directory, test, r"record 0: dense has 2 values but "
        r".*train-0\.tfrecord: record 0 has 3")

  @parameterized.named_parameters(
      ("text", b"hello, this is not a TFRecord file\n" * 3,
       r"record 0: corrupt or truncated TFRecord data \(corrupted record at "
       r"0.*\); expected an intact uncompressed TFRecord file"),
      ("gzipped", None, r"gzip-compressed; --dataset=tfrecord reads "
       r"uncompressed TFRecord files \(gunzip it\)$"))
  def test_unreadable_file(self, content, message):
    if content is None:
      path = os.path.join(testutil.make_tempdir(self), "gz")
      with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        writer.write(_example(**self.good))
      content = open(path, "rb").read()
    directory, path = self._bad_file(content=content)
    self._assert_inspect_error(directory, path, message)

  def test_truncated_file(self):
    directory = testutil.make_tempdir(self)
    _write_set(directory)
    path = os.path.join(directory, "train-2.tfrecord")
    raw = open(path, "rb").read()
    cut = _record_offsets(path)[5] + 2  # inside record 5
    with open(path, "wb") as f:
      f.write(raw[:cut])
    self._assert_inspect_error(
        directory, path, r"record 5: corrupt or truncated TFRecord data "
        r"\(truncated record at \d+")


class WriteExamplesTest(absltest.TestCase):

  def test_it_refuses_what_the_schema_refuses_before_writing(self):
    path = os.path.join(testutil.make_tempdir(self), "train-0")
    with self.assertRaisesRegex(ValueError, r"labels must be 0 or 1"):
      record_checks.write_examples(path, [[1]], None, [2])
    with self.assertRaisesRegex(ValueError, r"ids must be >= 0"):
      record_checks.write_examples(path, [[1], [2, -1]], None, [0, 1])
    self.assertFalse(os.path.exists(path))


class FindBadRecordTest(absltest.TestCase):

  def test_names_the_corrupt_file_and_record(self):
    directory = testutil.make_tempdir(self)
    paths = _write_set(directory)
    self.assertIsNone(record_checks.find_bad_record(paths))
    _flip_payload_byte(paths[2], 6)
    message = record_checks.find_bad_record(paths)
    self.assertRegex(message, rf"^{re.escape(paths[2])}: record 6: corrupt "
                     r"or truncated TFRecord data \(corrupted record at \d+\)")
    self.assertNotIn("\n", message)
    self.assertIsNone(record_checks.find_bad_record(paths[:2] + paths[3:]))

  def test_checks_against_the_data_sets_dense_dim(self):
    directory = testutil.make_tempdir(self)
    paths = _write_set(directory)
    self.assertIsNone(record_checks.find_bad_record(paths[1:], DENSE_DIM))
    self.assertRegex(record_checks.find_bad_record(paths[1:], 4),
                     r"record 0: dense has 3 values but the data set has 4")

  def test_pipeline_stops_on_a_bad_record_past_the_inspected_records(self):
    for ids, label, named, failure in (
        ([], 7, r"label is 7", r"a label is not 0 or 1"),
        ([3, -4], 0, r"ids\[1\] is -4; expected ids >= 0", r"an id is negative")):
      with self.subTest(failure=failure):
        directory = testutil.make_tempdir(self)
        _write_set(directory, train_sizes=(3,), dense_dim=0)
        train = os.path.join(directory, "train-0.tfrecord")
        good = _example(ids=("int64", [1]), label=("int64", [0]))
        _write_raw(train, [good] * 150 + [_example(ids=("int64", ids),
                                                   label=("int64", [label]))])
        records = record_checks.inspect(directory)  # the first 100 are fine
        self.assertEqual(records.dense_dim, 0)
        self.assertRegex(record_checks.find_bad_record(records.train_files),
                         rf"^{re.escape(train)}: record 150: {named}")
        with tf.Graph().as_default():
          _, labels = tf.compat.v1.data.make_one_shot_iterator(
              tfrecords.train_dataset(records, 151, 1, 0, 0)).get_next()
          with tf.compat.v1.Session() as sess:
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                        rf"{failure}; ps_trainer\.record_checks\.find_bad_record"):
              sess.run(labels)


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
  ids, dense, labels = _records(first, count)
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
    _write_set(self.directory)  # train: records 0-9, 10-16, 17-29
    self.records = record_checks.inspect(self.directory)

  def test_shapes_and_dtypes(self):
    with tf.Graph().as_default():
      features, labels = tf.compat.v1.data.make_one_shot_iterator(
          tfrecords.train_dataset(self.records, 8, 1, 0, 0)).get_next()
      self.assertIsInstance(features["ids"], tf.SparseTensor)
      self.assertEqual(features["ids"].dtype, tf.int64)
      self.assertEqual(features["ids"].shape.as_list(), [8, None])
      self.assertEqual(features["dense"].dtype, tf.float32)
      self.assertEqual(features["dense"].shape.as_list(), [8, DENSE_DIM])
      self.assertEqual(labels.dtype, tf.int64)
      self.assertEqual(labels.shape.as_list(), [8])

  def test_no_dense_gives_zero_columns(self):
    directory = testutil.make_tempdir(self)
    _write_set(directory, dense_dim=0)
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
    _write_set(directory, train_sizes=(4, 0, 5))
    records = record_checks.inspect(directory)
    tfrecords.train_dataset(records, 2, 3, 0, 0)
    with self.assertRaisesRegex(
        record_checks.DataError, r"worker 1 of 3 reads train-1\.tfrecord, which "
        r"hold no records; write records into every train\* file or use "
        r"fewer workers"):
      tfrecords.train_dataset(records, 2, 3, 1, 0)
    directory = testutil.make_tempdir(self)
    _write_set(directory, train_sizes=(2, 1))
    with self.assertRaisesRegex(
        record_checks.DataError, r"3 training records cannot give each of 4 "
        r"workers at least one; use fewer workers"):
      tfrecords.train_dataset(record_checks.inspect(directory), 2, 4, 3, 0)


class ClicksTest(absltest.TestCase):

  def test_cli_refuses_an_unwritable_out_dir_in_one_line(self):
    blocker = os.path.join(testutil.make_tempdir(self), "file")
    with open(blocker, "w", encoding="utf-8") as f:
      f.write("not a directory")
    for out_dir, reason in (
        (f"{blocker}/clicks", r"/file/clicks: cannot write there \(.+\); pass a "
                              r"directory this user can create and write"),
        (blocker, r"/file: is a file, not a directory; pass a directory \(it is "
                  r"created if missing\)")):
      err = io.StringIO()
      with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = clicks.main(["clicks", f"--out_dir={out_dir}",
                              "--train_examples=10", "--test_examples=5"])
      self.assertEqual(status, 2)
      self.assertRegex(err.getvalue(), rf"^clicks: error: --out_dir=.*{reason}\n$")

  def test_an_interrupted_write_leaves_no_train_file(self):
    directory = os.path.join(testutil.make_tempdir(self), "clicks")
    real_write = record_checks.write_examples
    calls = []

    def fail_on_second(path, *args):
      calls.append(path)
      if len(calls) == 2:
        raise KeyboardInterrupt  # Ctrl-C in the middle of the second file.
      real_write(path, *args)

    with mock.patch.object(record_checks, "write_examples", fail_on_second):
      with self.assertRaises(KeyboardInterrupt):
        clicks.write_click_set(directory, num_train=40, num_test=10,
                               vocab=50, num_shards=2)
    # The first file is whole; nothing named train* or test* is half written.
    self.assertEqual(sorted(n for n in os.listdir(directory)
                            if n.startswith(("train", "test"))),
                     ["train-00000-of-00002.tfrecord"])

  def test_writes_a_learnable_click_set(self):
    directory = os.path.join(testutil.make_tempdir(self), "clicks")
    stats = clicks.write_click_set(directory, num_train=3000, num_test=1000,
                                   vocab=5000, num_shards=3, seed=1)
    names = ["train-00000-of-00003.tfrecord", "train-00001-of-00003.tfrecord",
             "train-00002-of-00003.tfrecord", "test-00000-of-00001.tfrecord"]
    self.assertEqual(stats["files"],
                     [os.path.join(directory, n) for n in names])
    self.assertEqual(sorted(os.listdir(directory)), sorted(names))
    self.assertEqual(stats["train_examples"], 3000)
    self.assertEqual(stats["test_examples"], 1000)
    self.assertBetween(stats["majority_rate"], 0.55, 0.7)
    self.assertBetween(stats["positive_rate"], 0.3, 0.45)
    self.assertGreater(stats["bayes_accuracy"], stats["majority_rate"] + 0.1)
    records = record_checks.inspect(directory)
    self.assertEqual(records.dense_dim, 4)
    self.assertBetween(records.mean_ids_per_example, 3, 12)
    self.assertIsNone(record_checks.find_bad_record(stats["files"]))
    counts = [sum(1 for _ in tf.compat.v1.io.tf_record_iterator(f))
              for f in stats["files"]]
    self.assertEqual(counts, [1000, 1000, 1000, 1000])
    # Same seed, same data.
    again = os.path.join(testutil.make_tempdir(self), "clicks")
    clicks.write_click_set(again, num_train=3000, num_test=1000, vocab=5000,
                           num_shards=3, seed=1)
    for name in names:
      with open(os.path.join(directory, name), "rb") as a, open(
          os.path.join(again, name), "rb") as b:
        self.assertEqual(a.read(), b.read(), name)

  def test_refuses_a_directory_with_other_data(self):
    directory = testutil.make_tempdir(self)
    open(os.path.join(directory, "train-00007-of-00008.tfrecord"), "w").close()
    with self.assertRaisesRegex(
        record_checks.DataError, r"already holds train-00007-of-00008\.tfrecord, "
        r"which --data_dir would read with the new files; use an empty "
        r"directory"):
      clicks.write_click_set(directory, num_train=10, num_test=10, vocab=10)

  def test_cli(self):
    directory = os.path.join(testutil.make_tempdir(self), "out")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
      status = clicks.main(["clicks", f"--out_dir={directory}",
                            "--train_examples=40", "--test_examples=10",
                            "--vocab=100", "--dense_dim=0", "--shards=2"])
    self.assertEqual(status, 0)
    summary, stats = stdout.getvalue().split("\n", 1)
    self.assertRegex(summary, r"^clicks: wrote 40 training examples in 2 "
                     r"file\(s\) and 10 test examples to .* in [\d.]+ s; "
                     r"click rate")
    self.assertIn('"dense_dim": 0', stats)
    self.assertEqual(record_checks.inspect(directory).dense_dim, 0)

  def test_cli_bad_flags(self):
    for argv, message in (
        (["--vocab=0", "--out_dir=x"], r"--vocab=0"),
        (["--train_examples=3"], r"--out_dir is not set"),
        (["--out_dir=x", "--shards=5", "--train_examples=3"],
         r"--train_examples=3 is fewer than --shards=5; every train file needs at least one "
         r"example$"),
        (["--out_dir=x", "--nope=1"], r"nope")):
      stderr = io.StringIO()
      with contextlib.redirect_stderr(stderr):
        self.assertEqual(clicks.main(["clicks"] + argv), 2, argv)
      self.assertRegex(stderr.getvalue(), rf"^clicks: error: .*{message}")
      self.assertEqual(stderr.getvalue().count("\n"), 1, stderr.getvalue())


if __name__ == "__main__":
  absltest.main()
