"""Tests for the placement plan (plan.py, `./launch.sh plan`).

The plan is only worth reading if it is the truth: the CLI's JSON must equal
the devices the trainer's own graph gets on every worker, and the balance it
reports must hold for the large-table case the issue names.
"""

import json
import os
import subprocess
import sys

from absl.testing import absltest
import tensorflow as tf

from ps_trainer.datasets import clicks
from ps_trainer.datasets import data
from ps_trainer.graph import plan
from ps_trainer.graph import train_graph
import testutil

tf.compat.v1.disable_eager_execution()

_CLICK_FLAGS = ("--model=wide_deep", "--dataset=tfrecord", "--vocab_size=1000",
                "--embedding_dim=8", "--hidden_units=16", "--optimizer=adagrad")


def _cfg(argv, num_ps, num_workers, worker=0):
  return testutil.planned_config(*argv, num_ps=num_ps, num_workers=num_workers,
                                 worker=worker)


def _devices(cfg, dataset):
  tg = train_graph.build_graph(cfg, dataset)
  return {v["name"]: v["device"] for v in plan.variables_of(tg.graph)}


class PlanTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.data_dir = os.path.join(
        absltest.get_default_test_tmpdir(), "plan_clicks")
    clicks.write_click_set(cls.data_dir, num_train=400, num_test=100,
                           vocab=1000, dense_dim=3, num_shards=2, seed=1)

  def test_cli_json_is_the_placement_every_worker_builds(self):
    argv = _CLICK_FLAGS + (f"--data_dir={self.data_dir}",)
    out = subprocess.run(
        [sys.executable, "-m", "ps_trainer.plan_main", "--num_ps=3",
         "--num_workers=2", "--format=json", *argv],
        capture_output=True, text=True, timeout=120, cwd=str(testutil.REPO_ROOT),
        env=testutil.trainer_env(), check=False)
    self.assertEqual(out.returncode, 0, out.stderr)
    printed = json.loads(out.stdout)
    planned = {v["name"]: v["device"] for v in printed["variables"]}
    dataset = data.load("tfrecord", self.data_dir)
    for worker in (0, 1):
      self.assertEqual(planned, _devices(_cfg(argv, 3, 2, worker), dataset),
                       f"worker {worker}")
    # Every part of both tables is there, one per PS.
    for table in ("model/deep/embedding", "model/wide/weights"):
      self.assertEqual(
          sorted(planned[f"{table}/part_{i}"] for i in range(3)),
          [f"/job:ps/task:{i}" for i in range(3)])
    self.assertLen(printed["ps_bytes"], 3)
    self.assertEqual(sum(printed["ps_bytes"]),
                     sum(v["bytes"] for v in printed["variables"]))
    self.assertGreater(printed["bytes_per_step_per_worker"], 0)

  def test_cli_names_a_bad_data_file_or_flag_in_one_line_before_tensorflow_loads(self):
    missing = os.path.join(absltest.get_default_test_tmpdir(), "absent.npz")
    for argv, line in (
        (["--dataset=npz", f"--data_path={missing}"],
         f"--data_path={missing}: no such file; --dataset=npz needs a keras-layout .npz with "
         "keys x_train, y_train, x_test, y_test"),
        (["--dataset=mnist"], "--data_dir is not set; --dataset=mnist needs the four MNIST IDX"),
        ([f"--data_path={missing}"], f"--data_path={missing}: --dataset=digits does not read it")):
      with self.subTest(argv=argv):
        out = subprocess.run(
            [sys.executable, "-m", "ps_trainer.plan_main", *argv],
            capture_output=True, text=True, timeout=120, cwd=str(testutil.REPO_ROOT),
            env=testutil.tensorflow_blocked(self, testutil.trainer_env()), check=False)
        self.assertNotEqual(out.returncode, testutil.TENSORFLOW_IMPORTED, "TensorFlow loaded")
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertEqual(out.stdout, "")
        self.assertLen(out.stderr.splitlines(), 1, out.stderr)
        self.assertStartsWith(out.stderr, f"plan: error: {line}")

  def test_the_run_signature_is_on_ps_0_whatever_the_model(self):
    # A worker reads the chief's flags there before it trains. Placed by
    # bytes, it moved with the model: a worker with other --hidden_units
    # looked on another PS than the chief wrote to, and waited for it until
    # --wait_timeout_secs rather than name the difference.
    digits = data.load("digits")
    for argv, num_ps in (((), 2), (("--hidden_units=64,128",), 2),
                         (("--model=cnn",), 2), ((), 3),
                         (("--model=linear",), 3)):
      with self.subTest(argv=argv, num_ps=num_ps):
        devices = _devices(_cfg(argv, num_ps, 2, worker=1), digits)
        self.assertEqual(devices["ps_trainer/run_signature"],
                         "/job:ps/task:0")

  def test_four_ps_hold_a_200k_row_embedding_within_1_3x(self):
    argv = ("--model=wide_deep", "--dataset=tfrecord",
            f"--data_dir={self.data_dir}", "--vocab_size=200000",
            "--embedding_dim=16")
    for optimizer in ("adagrad", "adam"):
      cfg = _cfg(argv + (f"--optimizer={optimizer}",), 4, 2)
      result = plan.make(cfg, data.load("tfrecord", self.data_dir))
      self.assertLessEqual(max(result["ps_bytes"]),
                           1.3 * min(result["ps_bytes"]), result["ps_bytes"])
      self.assertAlmostEqual(result["balance"],
                             max(result["ps_bytes"]) / min(result["ps_bytes"]))

  def test_bytes_per_step_of_a_dense_model(self):
    # digits MLP 64-32-10: 64*32 + 32 + 32*10 + 10 floats, read and sent,
    # each variable padded to 64 bytes (10 floats to 16); the reads carry
    # the global step too (8 bytes, padded). The batch of 64 is larger than
    # the 64x32 kernel's factors are worth: it crosses whole.
    argv = ("--model=mlp", "--hidden_units=32", "--dataset=digits",
            "--batch_size=64")
    dataset = data.load("digits")
    result = plan.make(_cfg(argv, 1, 1), dataset)
    dense = (64 * 32 + 32 + 32 * 10 + 16) * 4
    self.assertEqual(result["bytes_per_step_detail"]["dense_read"], dense + 64)
    self.assertEqual(result["bytes_per_step_detail"]["dense_gradient"], dense)
    self.assertEqual(result["bytes_per_step_per_worker"], 2 * dense + 64)
    half = plan.make(_cfg(argv + ("--wire_dtype=bfloat16",), 1, 1), dataset)
    # bfloat16 pads to 32 elements: 10 to 32, the step's 4 to 32.
    dense = (64 * 32 + 32 + 32 * 10 + 32) * 2
    self.assertEqual(half["bytes_per_step_per_worker"], 2 * dense + 64)

  def test_a_small_batch_sends_kernel_gradients_as_factors(self):
    # MLP 784-256-10 at batch 64: the 784x256 kernel's gradient crosses as
    # 64x784 inputs and 64x256 output gradients; the 256x10 one whole.
    argv = ("--model=mlp", "--hidden_units=256", "--dataset=synthetic",
            "--batch_size=64")
    dataset = data.load("synthetic")
    whole = (784 * 256 + 256 + 256 * 10 + 16) * 4
    for extra, gradient in (
        ((), (64 * 784 + 64 * 256 + 256 + 256 * 10 + 16) * 4),
        (("--nofactored_gradients",), whole)):
      with self.subTest(extra=extra):
        result = plan.make(_cfg(argv + extra, 1, 1), dataset)
        detail = result["bytes_per_step_detail"]
        self.assertEqual(detail["dense_gradient"], gradient)
        self.assertEqual(detail["dense_read"], whole + 64)
        # The header says when the gradients cross whole.
        self.assertEqual("--nofactored_gradients" in plan.to_text(result),
                         bool(extra))

  def test_table_rows_count_per_step_not_the_table(self):
    argv = _CLICK_FLAGS + (f"--data_dir={self.data_dir}", "--batch_size=32")
    dataset = data.load("tfrecord", self.data_dir)
    detail = plan.make(_cfg(argv, 2, 1), dataset)["bytes_per_step_detail"]
    rows = 32 * dataset.records.mean_ids_per_example
    self.assertAlmostEqual(detail["rows_per_table"], rows)
    # Each row: 8 floats of embedding + 1 wide weight, plus an id per table.
    self.assertAlmostEqual(detail["sparse_read"], rows * ((8 + 1) * 4 + 16))
    self.assertLess(detail["sparse_read"], 1000 * 9 * 4)

  def test_a_batch_moves_no_more_rows_than_a_table_has(self):
    argv = _CLICK_FLAGS + (f"--data_dir={self.data_dir}", "--batch_size=32",
                           "--vocab_size=4")
    dataset = data.load("tfrecord", self.data_dir)
    self.assertGreater(32 * dataset.records.mean_ids_per_example, 4)
    result = plan.make(_cfg(argv, 2, 1), dataset)
    detail = result["bytes_per_step_detail"]
    self.assertEqual(detail["rows_per_table"], 4)
    self.assertEqual(detail["sparse_read"], 4 * ((8 + 1) * 4 + 16))
    self.assertIn("(at most 4 rows per table:", plan.to_text(result))


if __name__ == "__main__":
  absltest.main()
