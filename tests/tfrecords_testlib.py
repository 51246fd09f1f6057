"""Small TFRecord data sets for the tests of record_checks and tfrecords: record k of a set
has dense[0] == k, so a batch says which records it holds."""

import os

import numpy as np

from ps_trainer.datasets import record_checks

DENSE_DIM = 3


def records(first, count, dense_dim=DENSE_DIM):
  """Records first .. first + count - 1: (ids, dense, labels).

  Record k has k % 4 ids (none for k % 4 == 0), dense [k, -k, 0.5] and
  label k % 2.
  """
  ks = range(first, first + count)
  ids = [[k * 10 + j for j in range(k % 4)] for k in ks]
  dense = np.array([[k, -k, 0.5][:dense_dim] for k in ks], np.float32)
  dense = dense.reshape(count, dense_dim)
  return ids, dense if dense_dim else None, np.array([k % 2 for k in ks])


def write_set(directory, train_sizes=(10, 7, 13), test_sizes=(5, 6),
              dense_dim=DENSE_DIM):
  """Writes train-i and test-i files of consecutive records; returns them."""
  first, paths = 0, []
  for split, sizes in (("train", train_sizes), ("test", test_sizes)):
    for i, size in enumerate(sizes):
      path = os.path.join(directory, f"{split}-{i}.tfrecord")
      record_checks.write_examples(path, *records(first, size, dense_dim))
      paths.append(path)
      first += size
  return paths
