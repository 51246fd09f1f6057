"""Tests for ps_trainer.datasets.clicks, the synthetic click-log writer: what it writes, what it refuses
and that an interrupted write leaves no half data set.
"""

import contextlib
import io
import os
from unittest import mock

from absl.testing import absltest
import tensorflow as tf

from ps_trainer.datasets import clicks
from ps_trainer.datasets import record_checks
import testutil

# As the trainer runs them (and as the rest of the suite leaves TF).
tf.compat.v1.disable_eager_execution()


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
      real_write(path, *args)
      if len(calls) == 2:
        raise KeyboardInterrupt  # Ctrl-C as the second file is being written.

    with mock.patch.object(record_checks, "write_examples", fail_on_second):
      with self.assertRaises(KeyboardInterrupt):
        clicks.write_click_set(directory, num_train=40, num_test=10,
                               vocab=50, num_shards=2)
    # The first file is whole; nothing else is left, not even the hidden part of the second.
    self.assertEqual(sorted(os.listdir(directory)), ["train-00000-of-00002.tfrecord"])

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
