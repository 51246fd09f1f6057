"""Tests for ps_trainer.datasets.record_checks: what inspect() finds in a TFRecord data set and the one
line it gives for each way a file can be wrong, write_examples (the schema's reference writer),
and finding a corrupt record. Small files in temp dirs (tfrecords_testlib.py).
"""

import os
import re
import struct
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from ps_trainer.datasets import record_checks
from ps_trainer.datasets import tfrecords
import testutil
import tfrecords_testlib

# As the trainer runs them (and as the rest of the suite leaves TF).
tf.compat.v1.disable_eager_execution()


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
    paths = tfrecords_testlib.write_set(directory)
    with open(os.path.join(directory, "README.txt"), "w") as f:
      f.write("not data\n")
    os.mkdir(os.path.join(directory, "train_logs"))  # not a file: skipped
    records = record_checks.inspect(directory)
    self.assertEqual(records.data_dir, directory)
    self.assertEqual(records.train_files, tuple(paths[:3]))
    self.assertEqual(records.test_files, tuple(paths[3:]))
    self.assertEqual(records.dense_dim, tfrecords_testlib.DENSE_DIM)
    self.assertEqual(records.train_records, (10, 7, 13))
    ids = sum(k % 4 for k in range(41))
    self.assertAlmostEqual(records.mean_ids_per_example, ids / 41)

  def test_without_dense(self):
    directory = testutil.make_tempdir(self)
    tfrecords_testlib.write_set(directory, dense_dim=0)
    self.assertEqual(record_checks.inspect(directory).dense_dim, 0)

  def test_reads_only_the_first_records_of_a_file(self):
    directory = testutil.make_tempdir(self)
    tfrecords_testlib.write_set(directory, train_sizes=(250,))
    train = os.path.join(directory, "train-0.tfrecord")
    _flip_payload_byte(train, 200)  # past INSPECT_LIMIT
    records = record_checks.inspect(directory)
    self.assertEqual(records.train_records, (record_checks.INSPECT_LIMIT,))
    self.assertRegex(record_checks.find_bad_record(records.train_files),
                     rf"^{re.escape(train)}: record 200: corrupt")

  def test_empty_file_allowed_among_others(self):
    directory = testutil.make_tempdir(self)
    tfrecords_testlib.write_set(directory, train_sizes=(0, 4))
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
    tfrecords_testlib.write_set(directory)
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
    for path in tfrecords_testlib.write_set(directory):
      if os.path.basename(path).startswith(split):
        os.remove(path)
    with self.assertRaisesRegex(
        record_checks.DataError, rf"^--data_dir={re.escape(directory)}: no "
        rf"{split}\* files \(found: .*-0\.tfrecord, .*\); --dataset=tfrecord "
        r"needs"):
      record_checks.inspect(directory)

  def test_split_without_records(self):
    directory = testutil.make_tempdir(self)
    tfrecords_testlib.write_set(directory, train_sizes=(0, 0))
    with self.assertRaisesRegex(
        record_checks.DataError, rf"^--data_dir={re.escape(directory)}: the "
        r"train\* files \(train-0\.tfrecord, train-1\.tfrecord\) hold no "
        r"records; each split needs at least one$"):
      record_checks.inspect(directory)

  def _bad_file(self, records=None, content=None, name="train-1.tfrecord"):
    """A good data set whose file `name` is replaced; returns (dir, path)."""
    directory = testutil.make_tempdir(self)
    tfrecords_testlib.write_set(directory)
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
    tfrecords_testlib.write_set(directory)
    test = os.path.join(directory, "test-1.tfrecord")
    record_checks.write_examples(test, *tfrecords_testlib.records(0, 3, dense_dim=2))
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
    tfrecords_testlib.write_set(directory)
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
    paths = tfrecords_testlib.write_set(directory)
    self.assertIsNone(record_checks.find_bad_record(paths))
    _flip_payload_byte(paths[2], 6)
    message = record_checks.find_bad_record(paths)
    self.assertRegex(message, rf"^{re.escape(paths[2])}: record 6: corrupt "
                     r"or truncated TFRecord data \(corrupted record at \d+\)")
    self.assertNotIn("\n", message)
    self.assertIsNone(record_checks.find_bad_record(paths[:2] + paths[3:]))

  def test_checks_against_the_data_sets_dense_dim(self):
    directory = testutil.make_tempdir(self)
    paths = tfrecords_testlib.write_set(directory)
    self.assertIsNone(record_checks.find_bad_record(paths[1:], tfrecords_testlib.DENSE_DIM))
    self.assertRegex(record_checks.find_bad_record(paths[1:], 4),
                     r"record 0: dense has 3 values but the data set has 4")

  def test_pipeline_stops_on_a_bad_record_past_the_inspected_records(self):
    for ids, label, named, failure in (
        ([], 7, r"label is 7", r"a label is not 0 or 1"),
        ([3, -4], 0, r"ids\[1\] is -4; expected ids >= 0", r"an id is negative")):
      with self.subTest(failure=failure):
        directory = testutil.make_tempdir(self)
        tfrecords_testlib.write_set(directory, train_sizes=(3,), dense_dim=0)
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
                                        rf"{failure}; ps_trainer\.datasets\.record_checks\.find_bad_record"):
              sess.run(labels)


if __name__ == "__main__":
  absltest.main()
