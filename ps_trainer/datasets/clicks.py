"""A synthetic click data set in the --dataset=tfrecord layout.

    python -m ps_trainer.datasets.clicks --out_dir=DIR [--train_examples=N]
        [--test_examples=N] [--vocab=N] [--dense_dim=D] [--shards=N]
        [--seed=S]

writes DIR/train-0000i-of-0000N.tfrecord (N = --shards) and
DIR/test-00000-of-00001.tfrecord, prints one summary line and the stats as
JSON. For tests, README examples and the large-embedding demo.

The task, drawn with numpy from --seed:
  ids    3 to 12 per example from a Zipf-like law over [0, vocab): a few
         thousand frequent ids carry most occurrences and recur often enough
         to be learned; the long tail is seen a handful of times or never;
  dense  D features ~ N(0, 1);
  label  Bernoulli(sigmoid(bias + sum of the ids' hidden weights + dense . w)),
         every id and dense feature having a hidden weight.
The true logit is exactly what a wide (linear, sum over ids) model computes,
so wide & deep can learn it; the stats give the majority-class rate (what a
model that learned nothing scores) and the Bayes accuracy (the best any model
can score) on the test split.
"""

import contextlib
import json
import os
import sys
import time

from absl import flags
import numpy as np

from ps_trainer.console import errors
from ps_trainer.console import help_flags
from ps_trainer.console import output_dir
from ps_trainer.console import quiet_import

if __name__ == "__main__":
  # Before record_checks loads TensorFlow: its native start-up notes would bury
  # the summary line.
  quiet_import.tensorflow()

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

from ps_trainer.datasets import record_checks  # pylint: disable=g-import-not-at-top,wrong-import-position
from ps_trainer.datasets.readers import DataError  # pylint: disable=g-import-not-at-top,wrong-import-position

# Zipf-Mandelbrot over id ranks: P(rank r) ~ (r + _ZIPF_OFFSET)^-_ZIPF_EXPONENT.
# The offset keeps the head from a single id present in most examples.
_ZIPF_EXPONENT = 1.1
_ZIPF_OFFSET = 10
_IDS_PER_EXAMPLE = (3, 12)  # inclusive
# Hidden weights. The ids' part of the logit has a standard deviation of
# about 2.2 (0.8 * sqrt(7.5 ids)), the dense part's about 0.8 (D = 4): the
# ids carry most of the signal, so the embedding matters. The bias puts the
# click rate near 0.37. With the defaults: majority rate 0.62, Bayes
# accuracy 0.81, knowing only the dense weights 0.66.
_ID_WEIGHT_STDDEV = 0.8
_DENSE_WEIGHT_STDDEV = 0.4
_BIAS = -0.8


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


class _Task:
  """The hidden part of the task: id and dense weights, drawn from a seed."""

  def __init__(self, vocab, dense_dim, rng):
    self.vocab, self.dense_dim = vocab, dense_dim
    self.id_weights = rng.normal(0.0, _ID_WEIGHT_STDDEV, vocab)
    self.dense_weights = rng.normal(0.0, _DENSE_WEIGHT_STDDEV, dense_dim)
    # Frequent ids are spread over [0, vocab), as real hashed ids are, not
    # packed at the bottom.
    self.rank_to_id = rng.permutation(vocab)
    rank_weight = (np.arange(vocab) + _ZIPF_OFFSET) ** -_ZIPF_EXPONENT
    self.rank_cdf = np.cumsum(rank_weight / rank_weight.sum())

  def draw(self, n, rng):
    """Draws n examples.

    Returns:
      (ids: a list of n int64 arrays, dense: float32 [n, D], labels: int64
      [n], click probabilities: float64 [n]).
    """
    counts = rng.integers(_IDS_PER_EXAMPLE[0], _IDS_PER_EXAMPLE[1] + 1, n)
    ranks = np.searchsorted(self.rank_cdf, rng.random(counts.sum()))
    flat_ids = self.rank_to_id[np.minimum(ranks, self.vocab - 1)]
    example = np.repeat(np.arange(n), counts)
    id_logit = np.bincount(example, self.id_weights[flat_ids], minlength=n)
    dense = rng.standard_normal((n, self.dense_dim)).astype(np.float32)
    probs = _sigmoid(_BIAS + id_logit + dense @ self.dense_weights)
    labels = (rng.random(n) < probs).astype(np.int64)
    ids = np.split(flat_ids.astype(np.int64), np.cumsum(counts)[:-1])
    return ids, dense, labels, probs


def _write_whole(path, ids, dense, labels):
  """Writes one file under a name --data_dir ignores, then renames it: an
  interrupted run leaves no truncated train* file to fail mid-training, nor
  the hidden part it had written."""
  partial = os.path.join(os.path.dirname(path),
                         ".partial-" + os.path.basename(path))
  try:
    record_checks.write_examples(partial, ids, dense, labels)
  except BaseException:  # Ctrl-C too.
    with contextlib.suppress(OSError):
      os.remove(partial)
    raise
  os.replace(partial, path)


def write_click_set(out_dir, num_train=200_000, num_test=20_000,
                    vocab=200_000, dense_dim=4, num_shards=4, seed=0) -> dict:
  """Writes a synthetic click data set for --dataset=tfrecord.

  Args:
    out_dir: the directory to write (created if missing); it must hold no
      other train* or test* files, which --data_dir would read too.
    num_train: training examples, split evenly over num_shards files.
    num_test: held-out examples, in one file.
    vocab: ids are in [0, vocab).
    dense_dim: D, dense features per example (0: no dense feature).
    num_shards: train files.
    seed: draws the hidden weights and the examples.

  Returns:
    Stats: train_examples, test_examples, positive_rate (training labels),
    majority_rate (the share of the test split's more common label),
    bayes_accuracy (the expected test accuracy of the true probabilities),
    mean_ids_per_example, vocab, dense_dim and files (the paths written).

  Raises:
    DataError: a bad argument, or out_dir holds other train*/test* files.
  """
  for name, value, least in (("num_train", num_train, num_shards),
                             ("num_test", num_test, 1), ("vocab", vocab, 1),
                             ("dense_dim", dense_dim, 0),
                             ("num_shards", num_shards, 1)):
    if not isinstance(value, (int, np.integer)) or value < least:
      raise DataError(f"{name}={value}: must be an integer >= {least}")
  train_paths = [os.path.join(out_dir, f"train-{i:05d}-of-{num_shards:05d}"
                              ".tfrecord") for i in range(num_shards)]
  test_path = os.path.join(out_dir, "test-00000-of-00001.tfrecord")
  os.makedirs(out_dir, exist_ok=True)
  others = sorted(
      name for name in os.listdir(out_dir)
      if name.startswith(("train", "test"))
      and os.path.join(out_dir, name) not in train_paths + [test_path])
  if others:
    raise DataError(
        f"{out_dir}: already holds {', '.join(others[:3])}"
        f"{', ...' if len(others) > 3 else ''}, which --data_dir would read "
        f"with the new files; use an empty directory")
  rng = np.random.default_rng(seed)
  task = _Task(vocab, dense_dim, rng)
  ids, dense, labels, probs = task.draw(num_train + num_test, rng)
  train_dense = dense[:num_train] if dense_dim else None
  bounds = np.linspace(0, num_train, num_shards + 1).astype(int)
  for path, start, stop in zip(train_paths, bounds, bounds[1:]):
    _write_whole(path, ids[start:stop],
                 None if train_dense is None else train_dense[start:stop],
                 labels[start:stop])
  _write_whole(test_path, ids[num_train:],
               dense[num_train:] if dense_dim else None, labels[num_train:])
  test_labels, test_probs = labels[num_train:], probs[num_train:]
  test_positive = float(test_labels.mean())
  return {
      "train_examples": int(num_train),
      "test_examples": int(num_test),
      "positive_rate": round(float(labels[:num_train].mean()), 4),
      "majority_rate": round(max(test_positive, 1.0 - test_positive), 4),
      "bayes_accuracy": round(float(np.maximum(
          test_probs, 1.0 - test_probs).mean()), 4),
      "mean_ids_per_example": round(
          float(np.mean([len(i) for i in ids])), 2),
      "vocab": int(vocab),
      "dense_dim": int(dense_dim),
      "files": train_paths + [test_path],
  }


def _define_flags(fv):
  flags.DEFINE_string("out_dir", None, "Directory to write (created if "
                      "missing).", flag_values=fv)
  flags.DEFINE_integer("train_examples", 200_000, "Training examples.",
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("test_examples", 20_000, "Held-out examples.",
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("vocab", 200_000, "Ids are in [0, vocab).",
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("dense_dim", 4, "Dense features per example.",
                       lower_bound=0, flag_values=fv)
  flags.DEFINE_integer("shards", 4, "Train files.", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_integer("seed", 0, "Seed of the hidden weights and examples.",
                       flag_values=fv)


def main(argv=None) -> int:
  """The CLI; returns the exit status (2 for bad flags)."""
  argv = sys.argv if argv is None else argv
  # Its own FlagValues: importing this module defines no global flags, so
  # it never collides with the trainer's.
  fv = flags.FlagValues()
  _define_flags(fv)
  if help_flags.asked(argv):
    print(__doc__ + "\nflags:\n" + fv.get_help())
    return 0
  try:
    extra = fv(argv)[1:]
  except flags.Error as e:
    print(f"clicks: error: {errors.flag_error(e)}", file=sys.stderr)
    return 2
  if extra:
    print(f"clicks: error: unexpected arguments {' '.join(extra)}; flags "
          f"only (--out_dir=DIR ...)", file=sys.stderr)
    return 2
  if not fv.out_dir:
    print("clicks: error: --out_dir is not set: the directory for the "
          "train* and test* files", file=sys.stderr)
    return 2
  if fv.train_examples < fv.shards:
    print(f"clicks: error: --train_examples={fv.train_examples} is fewer than "
          f"--shards={fv.shards}; every train file needs at least one example",
          file=sys.stderr)
    return 2
  try:
    output_dir.prepare(fv.out_dir, "--out_dir")
  except output_dir.OutputDirError as e:  # A file there, or not writable.
    print(f"clicks: error: {e}", file=sys.stderr)
    return 2
  start = time.monotonic()
  try:
    stats = write_click_set(fv.out_dir, fv.train_examples, fv.test_examples,
                            fv.vocab, fv.dense_dim, fv.shards, fv.seed)
  except DataError as e:
    print(f"clicks: error: {e}", file=sys.stderr)
    return 2
  except (OSError, tf.errors.OpError) as e:
    reason = getattr(e, "strerror", None) or errors.first_line(str(e))
    print(f"clicks: error: --out_dir={fv.out_dir}: cannot write there "
          f"({reason}); pass a directory this user can write",
          file=sys.stderr)
    return 2
  print(f"clicks: wrote {stats['train_examples']} training examples in "
        f"{fv.shards} file(s) and {stats['test_examples']} test examples to "
        f"{fv.out_dir} in {time.monotonic() - start:.1f} s; click rate "
        f"{stats['positive_rate']:.3f}, majority rate "
        f"{stats['majority_rate']:.3f}, Bayes accuracy "
        f"{stats['bayes_accuracy']:.3f}")
  print(json.dumps(stats, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
