"""Is a directory of TFRecord click files usable? Asked before training and after a failure.

The --dataset=tfrecord --data_dir=DIR input: DIR holds train* files (training)
and test* files (held out), each an uncompressed TFRecord file of
tf.train.Example records with the features
  ids    int64 list of any length, possibly empty: sparse categorical ids,
         each >= 0 (the served model pads rows with -1 and drops negative
         ids: a negative id would be trained on but ignored in serving);
  label  int64, one value, 0 or 1: the click;
  dense  float list of the same length D in every record; optional (absent
         from every record: D = 0).
write_examples is the reference writer of this schema.

`inspect` checks the files before any graph is built, reading only the first
INSPECT_LIMIT records of each file so that it stays fast on big data sets;
every bad input is a one-line DataError naming the file (and record). A bad
record further in is caught by the pipeline (tfrecords.py), whose errors do
not name the file ("corrupted record at 12345"); find_bad_record then scans
the files fully and names it.
"""

import contextlib
import dataclasses
import logging
import os
from typing import Optional

from google.protobuf import message
import numpy as np
import tensorflow as tf

from ps_trainer.console import errors
from ps_trainer.datasets import readers
from ps_trainer.datasets.data_files import TFRECORD_NEEDS

__all__ = ["DataError", "RecordSet", "inspect", "find_bad_record",
           "write_examples", "file_names"]

DataError = readers.DataError

_CONTEXT = "(--dataset=tfrecord)"

# Records read per file by inspect: enough to learn the schema and catch a
# wrong file, few enough for data sets of thousands of files.
INSPECT_LIMIT = 100
_GZIP_MAGIC = b"\x1f\x8b"
_FEATURE_KINDS = {"ids": "int64_list", "label": "int64_list",
                  "dense": "float_list"}


@dataclasses.dataclass(frozen=True)
class RecordSet:
  """A checked directory of TFRecord click files.

  Attributes:
    data_dir: the --data_dir value.
    train_files: full paths of the train* files, sorted.
    test_files: full paths of the test* files, sorted.
    dense_dim: D, the length of `dense`; 0 when records have no `dense`.
    mean_ids_per_example: mean length of `ids` over the records inspected.
    train_records: records of each train file, counted up to INSPECT_LIMIT
      (so exact below it, a lower bound at it); () when not counted.
  """
  data_dir: str
  train_files: tuple
  test_files: tuple
  dense_dim: int
  mean_ids_per_example: float
  train_records: tuple = ()


class _SchemaCheck:
  """Checks records one at a time; remembers D and where it was first seen."""

  def __init__(self, dense_dim=None):
    self.dense_dim = dense_dim
    self.dense_source = "the data set" if dense_dim is not None else None
    self.records = 0
    self.ids = 0

  def check(self, path, index, record):
    """Returns None when record fits the schema, else a one-line problem."""
    where = f"{path}: record {index}"
    try:
      example = tf.train.Example.FromString(record)
    except message.DecodeError as e:
      return (f"{where}: not a tf.train.Example ({errors.first_line(str(e))}); "
              f"{TFRECORD_NEEDS}")
    features = example.features.feature
    for name in ("ids", "label"):
      if name not in features:
        found = ", ".join(sorted(features)) or "none"
        return (f"{where}: no '{name}' feature (found: {found}); "
                f"{TFRECORD_NEEDS}")
    for name, kind in _FEATURE_KINDS.items():
      found = features[name].WhichOneof("kind") if name in features else None
      # A Feature with no list set parses as an empty list of any type.
      if found not in (None, kind):
        return (f"{where}: feature '{name}' is {found}; expected {kind} "
                f"{_CONTEXT}")
    label = features["label"].int64_list.value
    if len(label) != 1:
      return (f"{where}: label has {len(label)} values; expected one, 0 or 1 "
              f"{_CONTEXT}")
    if label[0] not in (0, 1):
      return (f"{where}: label is {label[0]}; expected 0 or 1 (a binary "
              f"click) {_CONTEXT}")
    ids = features["ids"].int64_list.value
    if ids and min(ids) < 0:
      at = next(i for i, v in enumerate(ids) if v < 0)
      return (f"{where}: ids[{at}] is {ids[at]}; expected ids >= 0 (the served "
              f"model drops negative ids) {_CONTEXT}")
    dense = (len(features["dense"].float_list.value) if "dense" in features
             else 0)
    if self.dense_dim is None:
      self.dense_dim, self.dense_source = dense, where
    elif dense != self.dense_dim:
      return (f"{where}: dense has {dense} values but {self.dense_source} has "
              f"{self.dense_dim}; dense must have the same length in every "
              f"record (or be absent from all) {_CONTEXT}")
    self.records += 1
    self.ids += len(ids)
    return None


def _records(path):
  """Yields the records of a TFRecord file; raises tf.errors.OpError."""
  # tf_record_iterator reads without a graph or eager context, so it works
  # the same in the trainer (eager disabled) and under pytest. Its one-time
  # deprecation warning would only confuse a trainer's log.
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    records = tf.compat.v1.io.tf_record_iterator(path)
  finally:
    logger.setLevel(level)
  yield from records


def _read_problem(path, index, error):
  """The one-line message for a file that fails to read at record index."""
  reason = errors.first_line(getattr(error, "message", str(error)),
                             type(error).__name__)
  if isinstance(error, tf.errors.DataLossError):
    with contextlib.suppress(OSError), open(path, "rb") as f:
      if f.read(2) == _GZIP_MAGIC:
        return (f"{path}: gzip-compressed; --dataset=tfrecord reads "
                f"uncompressed TFRecord files (gunzip it)")
    return (f"{path}: record {index}: corrupt or truncated TFRecord data "
            f"({reason}); expected an intact uncompressed TFRecord file "
            f"{_CONTEXT}")
  return f"{path}: cannot read ({reason}) {_CONTEXT}"


def _scan(path, check, limit=None):
  """Checks up to limit records of one file (all when None).

  Returns:
    (records read, the first problem or None).
  """
  index = 0
  try:
    for record in _records(path):
      problem = check.check(path, index, record)
      if problem:
        return index, problem
      index += 1
      if index == limit:
        break
  except tf.errors.OpError as e:
    return index, _read_problem(path, index, e)
  return index, None


def file_names(paths, most=3):
  """Base names of paths for a message: the first few, then a count."""
  names = [os.path.basename(p) for p in paths[:most]]
  if len(paths) > most:
    names.append(f"{len(paths) - most} more")
  return ", ".join(names)


def inspect(data_dir: str) -> RecordSet:
  """Finds and checks the TFRecord files of --data_dir.

  Reads the first INSPECT_LIMIT records of each file with Python (no graph),
  so it works whether eager execution is enabled or not. Empty files are
  allowed, but each split needs at least one record.

  Args:
    data_dir: the --data_dir value.

  Returns:
    A RecordSet.

  Raises:
    DataError: data_dir unset or missing; no train* or test* files; a file
      that cannot be read or is corrupt; a record that is not a
      tf.train.Example, lacks ids or label, has a feature of the wrong type, a
      label other than 0 or 1, a negative id, or a dense length different
      from another record's; a split without records.
  """
  train_files, test_files = readers.list_tfrecord_files(data_dir)
  check = _SchemaCheck()
  counts = {}
  for split, files in (("train", train_files), ("test", test_files)):
    for path in files:
      counts[path], problem = _scan(path, check, INSPECT_LIMIT)
      if problem:
        raise DataError(problem)
    if not any(counts[path] for path in files):
      raise DataError(f"--data_dir={data_dir}: the {split}* files "
                      f"({file_names(files)}) hold no records; each split needs "
                      f"at least one")
  return RecordSet(data_dir, train_files, test_files, check.dense_dim,
                   check.ids / check.records,
                   tuple(counts[path] for path in train_files))


def find_bad_record(files, dense_dim: Optional[int] = None) -> Optional[str]:
  """Scans files fully in Python for the first record that breaks the schema.

  For after a pipeline failed: TensorFlow's "corrupted record at N" names a
  byte offset but not the file. About 100,000 records a second.

  Args:
    files: TFRecord paths, in the order to scan.
    dense_dim: the expected length of dense (RecordSet.dense_dim); None to
      take it from the first record.

  Returns:
    A one-line message naming the first bad file and record (corrupt or
    truncated, not a tf.train.Example, a missing or mistyped feature, a
    label other than 0 or 1, a negative id, a dense length that differs), or
    None when every record is fine.
  """
  check = _SchemaCheck(dense_dim)
  for path in files:
    _, problem = _scan(path, check)
    if problem:
      return problem
  return None


def write_examples(path, ids, dense, labels):
  """Writes one uncompressed TFRecord file of click Examples.

  The reference for the schema: ids as an int64_list, dense as a float_list
  (left out when dense is None or has no columns), label as one int64.

  Args:
    path: the file to write (replaced if it exists).
    ids: N sequences of ints, each of any length.
    dense: float array [N, D], or None.
    labels: N ints, each 0 or 1.

  Raises:
    ValueError: lengths differ, a label is not 0 or 1, or an id is negative.
  """
  labels = np.asarray(labels, np.int64).reshape(-1)
  if len(ids) != len(labels):
    raise ValueError(f"{path}: {len(ids)} ids lists but {len(labels)} labels")
  if not np.isin(labels, (0, 1)).all():
    raise ValueError(f"{path}: labels must be 0 or 1")
  if any(min(row, default=0) < 0 for row in ids):
    raise ValueError(f"{path}: ids must be >= 0 (the served model drops "
                     "negative ids)")
  if dense is not None:
    dense = np.asarray(dense, np.float32)
    if dense.ndim != 2 or len(dense) != len(labels):
      raise ValueError(f"{path}: dense has shape {dense.shape}; expected "
                       f"[{len(labels)}, D]")
    if not dense.shape[1]:
      dense = None
  int64_feature = lambda v: tf.train.Feature(
      int64_list=tf.train.Int64List(value=v))
  with tf.io.TFRecordWriter(path) as writer:
    for i, label in enumerate(labels.tolist()):
      feature = {"ids": int64_feature(np.asarray(ids[i], np.int64).tolist()),
                 "label": int64_feature([label])}
      if dense is not None:
        feature["dense"] = tf.train.Feature(
            float_list=tf.train.FloatList(value=dense[i].tolist()))
      writer.write(tf.train.Example(
          features=tf.train.Features(feature=feature)).SerializeToString())
