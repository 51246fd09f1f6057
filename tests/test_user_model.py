"""A user's own model_fn and input_fn: trained, scored, exported and checked
as the contract (README: Your own model) says, in one process with
ps_trainer.testing, plus one run of the real binary per bad input."""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from ps_trainer import testing
from ps_trainer.user_model import spec
import testutil
import small_models

tf = testing.tf

_MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "small_models.py")


def _served_accuracy(export_dir: str) -> float:
  """The accuracy of a fresh session serving the export on the whole set."""
  x, y = small_models._arrays()  # pylint: disable=protected-access
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
    signature = meta.signature_def["serving_default"]
    classes = session.run(signature.outputs["classes"].name,
                          {signature.inputs["x"].name: x})
  return float((classes == y).mean())


class TrainInProcessTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("layers", small_models.layers_model_fn),
      ("keras", small_models.keras_model_fn))
  def test_local_run_learns_scores_and_exports_what_it_reports(self, model_fn):
    log_dir = tempfile.mkdtemp()
    result = testing.train_in_process(
        model_fn, small_models.input_fn, num_ps=0, train_steps=300,
        log_dir=log_dir, optimizer="adam", learning_rate=0.01)
    self.assertEqual(result["global_step"], 300)
    self.assertGreater(result["metrics"]["accuracy"], 0.9)
    self.assertEqual(result["accuracy"], result["metrics"]["accuracy"])
    self.assertEqual(result["test_examples"], small_models.EXAMPLES)
    # The input's batches of 20, not --batch_size=64.
    self.assertAlmostEqual(result["examples_per_sec"] / result["steps_per_sec"], 20.0, places=6)
    with open(os.path.join(log_dir, "run_config.json")) as f:
      run_config = json.load(f)
    self.assertEqual(run_config["model"], result["config"]["model"])
    self.assertTrue(run_config["model"].endswith(f":{model_fn.__name__}"))
    from ps_trainer.training import export  # pylint: disable=g-import-not-at-top
    export_dir = export.export_saved_model(
        testing.config(model_fn, small_models.input_fn, flags={"log_dir": log_dir}), None,
        log_dir)
    self.assertAlmostEqual(_served_accuracy(export_dir), result["accuracy"], places=5)

  def test_two_ps_two_workers_async_and_sync(self):
    for sync in (False, True):
      with self.subTest(sync=sync):
        result = testing.train_in_process(
            small_models.keras_model_fn, small_models.input_fn, num_ps=2, num_workers=2,
            sync_replicas=sync, train_steps=150, optimizer="adam", learning_rate=0.02,
            params={"batch": 10})
        self.assertGreaterEqual(result["global_step"], 150)
        self.assertEqual(result["num_workers"], 2)
        self.assertGreater(result["accuracy"], 0.8)

  def test_keras_and_layers_variables_go_to_the_ps_tasks(self):
    for model_fn in (small_models.layers_model_fn, small_models.keras_model_fn):
      devices = testing.placement(model_fn, small_models.input_fn, num_ps=2)
      kernels = {name: d for name, d in devices.items() if name.endswith("kernel")}
      self.assertLen(kernels, 2, devices)
      for device in devices.values():
        self.assertRegex(device, r"^/job:ps/task:[01]$")
      self.assertLen(set(devices.values()), 2, devices)

  def test_a_large_variable_is_split_over_the_ps_and_a_small_one_is_not(self):
    def table_model(features, labels, mode):
      table = tf.compat.v1.get_variable("table", [1000, 64])  # 256 KB.
      ids = tf.cast(features["x"][:, 0] * 999, tf.int64)
      logits = tf.compat.v1.layers.dense(tf.nn.embedding_lookup(table, ids), 2)
      return small_models._spec(mode, logits, labels)  # pylint: disable=protected-access
    devices = testing.placement(table_model, small_models.input_fn, num_ps=4,
                                partition_min_bytes=64 * 1024)
    parts = sorted(name for name in devices if name.startswith("table/part_"))
    self.assertEqual(parts, [f"table/part_{i}" for i in range(4)])
    self.assertLen({devices[p] for p in parts}, 4)
    self.assertIn("dense/kernel", devices)


class InputTest(absltest.TestCase):

  def test_workers_with_unequal_data_finish_a_sync_run(self):
    # Worker 1's data ends every 2 steps; its input starts a new epoch instead of ending the
    # run, so worker 0 never waits for gradients that will not come.
    result = testing.train_in_process(
        small_models.layers_model_fn, small_models.unequal_input_fn, num_ps=1, num_workers=2,
        sync_replicas=True, train_steps=60, wait_timeout_secs=60)
    self.assertEqual(result["global_step"], 60)

  def test_an_input_fn_that_ignores_its_context_shuffles_differently_on_each_worker(self):
    from ps_trainer.datasets import data_sets  # pylint: disable=g-import-not-at-top
    from ps_trainer.graph import train_graph  # pylint: disable=g-import-not-at-top
    first_batches = []
    with testing.local_cluster(num_ps=1, num_workers=2) as cluster:
      for worker in (0, 1):
        cfg = testing.config(small_models.layers_model_fn, small_models.unsharded_input_fn,
                             flags={"log_dir": tempfile.mkdtemp()}, cluster=cluster,
                             worker=worker)
        tg = train_graph.build_graph(cfg, data_sets.from_input_fn("unsharded"))
        # Only the input runs, on the worker: no variable is read.
        with tf.compat.v1.Session(cluster.worker_targets[worker], graph=tg.graph) as session:
          session.run(tg.train_input.initializer)
          first_batches.append(session.run(tg.train_input.labels))
    self.assertEqual(first_batches[0].shape, (20,))
    self.assertFalse((first_batches[0] == first_batches[1]).all(), first_batches)


class UpdateOpsTest(absltest.TestCase):

  def test_batch_normalization_statistics_move_and_a_lambda_is_a_model_fn(self):
    log_dir = tempfile.mkdtemp()
    result = testing.train_in_process(
        lambda features, labels, mode: small_models.batch_norm_model_fn(features, labels, mode),
        small_models.input_fn, num_ps=0, train_steps=50, log_dir=log_dir)
    self.assertEqual(result["global_step"], 50)
    self.assertTrue(result["model"].endswith(":<lambda>"), result["model"])
    # The inputs are uniform in [0, 1): their mean is about 0.5, and 50 updates at TF's
    # momentum of 0.99 move the moving mean from 0 to about 0.2.
    moving_mean = tf.train.load_variable(log_dir, "batch_normalization/moving_mean")
    self.assertGreater(float(moving_mean.min()), 0.1)


class EvaluatorTest(absltest.TestCase):

  def test_the_evaluator_scores_a_users_checkpoint_with_its_metrics(self):
    from ps_trainer.datasets import data_sets  # pylint: disable=g-import-not-at-top
    from ps_trainer.training import evaluator  # pylint: disable=g-import-not-at-top
    from ps_trainer.faults import stops  # pylint: disable=g-import-not-at-top
    log_dir = tempfile.mkdtemp()
    result = testing.train_in_process(small_models.keras_model_fn, small_models.input_fn,
                                      num_ps=0, train_steps=200, log_dir=log_dir,
                                      optimizer="adam", learning_rate=0.01)
    cfg = testing.config(small_models.keras_model_fn, small_models.input_fn, flags=dict(
        ps_hosts="127.0.0.1:1", worker_hosts="127.0.0.1:2", job_name="evaluator",
        task_index=0, log_dir=log_dir, train_steps=200, wait_timeout_secs=30))
    evaluator.run(cfg, data_sets.from_input_fn("input_fn"), stops.StopRequest("evaluator"))
    scores = evaluator.read_scores(log_dir)
    self.assertEqual(scores[-1]["global_step"], 200)
    self.assertEqual(set(scores[-1]["metrics"]), {"loss", "accuracy"})
    self.assertAlmostEqual(scores[-1]["metrics"]["accuracy"], result["accuracy"], places=6)
    self.assertAlmostEqual(scores[-1]["loss"], result["loss"], places=5)


class ReadmeModelTest(absltest.TestCase):

  def test_the_readme_model_trains_on_two_ps_as_written(self):
    readme = (testutil.REPO_ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"Save this as `my_model.py`:\n\n```python\n(.*?)```", readme, re.DOTALL)
    self.assertIsNotNone(found, "README.md: the model of 'Your own model' is gone")
    self.assertLess(found.group(1).count("\n"), 40)
    namespace = {"__name__": "my_model"}
    exec(compile(found.group(1), "README.md (my_model.py)", "exec"), namespace)  # pylint: disable=exec-used
    result = testing.train_in_process(namespace["model_fn"], namespace["input_fn"], num_ps=2,
                                      num_workers=1, train_steps=200, params={"units": 32},
                                      optimizer="adam", learning_rate=0.01)
    self.assertEqual(result["global_step"], 200)
    self.assertGreater(result["metrics"]["accuracy"], 0.9)


class ContractErrorsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("no_model_spec", small_models.returns_a_dict, small_models.input_fn,
       r"returned dict, not a ps_trainer.ModelSpec"),
      ("vector_loss", small_models.vector_loss, small_models.input_fn,
       r"loss has shape \(None, 6\), not a scalar"),
      ("raises", small_models.raises, small_models.input_fn,
       r"raised in mode 'train': ValueError: units must be positive \(.*small_models.py:\d+\)"),
      ("unknown_argument", small_models.unknown_argument, small_models.input_fn,
       r"takes an argument 'config'; accepted names: features, labels, mode, params"),
      ("not_a_dataset", small_models.layers_model_fn, small_models.not_a_dataset,
       r"returned list in mode 'train', not a tf.data.Dataset"),
      ("not_pairs", small_models.layers_model_fn, small_models.not_pairs,
       r"returned a Dataset of TensorSpec, not of \(features, labels\) pairs"),
      ("endless_eval", small_models.layers_model_fn, small_models.endless_eval_input_fn,
       r"returned an endless dataset in mode 'eval'"),
      ("not_an_optimizer", small_models.keras_optimizer_model_fn, small_models.input_fn,
       r"optimizer is a object, not a TF1 optimizer"),
      ("keras3", small_models.keras3_model_fn, small_models.input_fn,
       r"uses Keras 3 \(`import keras`\), which cannot build TF1 graphs .*; use tf.keras"))
  def test_one_line_naming_what_is_wrong(self, model_fn, input_fn, pattern):
    with self.assertRaisesRegex(spec.ModelFnError, pattern) as raised:
      testing.placement(model_fn, input_fn, num_ps=1)
    self.assertNotIn("\n", str(raised.exception))


class BinaryBadInputTest(parameterized.TestCase):
  """Exit status 2 and one line, before any server starts."""

  @parameterized.named_parameters(
      ("missing_file", ["--model=no_such_file.py:model_fn"],
       r"--model=no_such_file.py:model_fn: no such file no_such_file.py"),
      ("no_function", [f"--model={_MODELS}:nothing_here"],
       r"small_models.py has no function 'nothing_here'"),
      ("params_not_an_object", [f"--model={_MODELS}:layers_model_fn", "--params=[1]"],
       r"--params=\[1\]: expected a JSON object"),
      ("input_fn_with_built_in_model", [f"--input_fn={_MODELS}:input_fn"],
       r"--input_fn=.* needs your own model .* --model=mlp is built in"))
  def test_exit_2_with_one_line(self, argv, pattern):
    self._assert_one_line(argv, "127.0.0.1:2", pattern)

  def test_a_model_fn_that_raises_is_named_before_the_server_starts(self):
    # This worker's own port is taken: had its server started first, the
    # error would be the port's.
    with socket.socket() as taken:
      taken.bind(("127.0.0.1", 0))
      taken.listen()
      self._assert_one_line(
          [f"--model={_MODELS}:raises", f"--input_fn={_MODELS}:input_fn"],
          f"127.0.0.1:{taken.getsockname()[1]}",
          r"raised in mode 'train': ValueError: units must be positive")

  def _assert_one_line(self, argv, worker_host, pattern):
    process = subprocess.run(
        [sys.executable, "-m", "ps_trainer", *argv, "--train_steps=5",
         "--ps_hosts=127.0.0.1:1", f"--worker_hosts={worker_host}", "--job_name=worker",
         "--task_index=0", f"--log_dir={tempfile.mkdtemp()}"],
        capture_output=True, text=True, timeout=120, env=testutil.trainer_env(),
        cwd=os.path.dirname(_MODELS))
    self.assertEqual(process.returncode, 2, process.stderr)
    self.assertNotIn("Traceback", process.stderr)
    lines = [l for l in process.stderr.splitlines() if l.startswith("ps_trainer: error:")]
    self.assertLen(lines, 1, process.stderr)
    self.assertRegex(lines[0], pattern)


if __name__ == "__main__":
  absltest.main()
