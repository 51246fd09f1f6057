"""SavedModel export: what it serves in a fresh process, tables saved in parts, failures."""

import contextlib
import io
import json
import os
import subprocess

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from ps_trainer import models
from ps_trainer.datasets import clicks
from ps_trainer.datasets import data
from ps_trainer.training import export
from ps_trainer.training import run_result
from ps_trainer.training import trainer

import testutil

tf.compat.v1.disable_eager_execution()

# Runs in a fresh process, eagerly, as a user of the export would: loads it with
# tf.saved_model.load, feeds serving_default the arrays of argv[2] (.npz), writes its outputs to
# argv[3] (.npz) and prints its signature and variables as one JSON line.
_SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
serve = model.signatures["serving_default"]
outputs = serve(**{k: tf.constant(v) for k, v in np.load(sys.argv[2]).items()})
np.savez(sys.argv[3], **{k: v.numpy() for k, v in outputs.items()})
spec = lambda t: [t.dtype.name, t.shape.as_list()]
print(json.dumps({
    "inputs": {k: spec(v) for k, v in serve.structured_input_signature[1].items()},
    "outputs": {k: spec(v) for k, v in serve.structured_outputs.items()},
    "variables": sorted(v.name.split(":")[0] for v in model.variables),
    "global_step": [int(v.numpy()) for v in model.variables
                    if v.name.startswith("global_step")]}))
"""

# Click examples: ids per example (one without any, one past the vocabulary, which the model
# hashes) and their dense features.
_ROWS = [[3, 17, 99], [], [42], [7, 7, 60, 1003]]
_DENSE_DIM = 3
_WIDE_DEEP_VARIABLES = [
    "global_step", "model/deep/embedding", "model/deep_logit/bias", "model/deep_logit/kernel",
    "model/hidden0/bias", "model/hidden0/kernel", "model/wide/bias", "model/wide/weights"]


def _serve(test, export_dir, inputs):
  """(outputs, signature) of serving_default on `inputs`, in a fresh process."""
  tmp = testutil.make_tempdir(test)
  np.savez(os.path.join(tmp, "in.npz"), **inputs)
  done = subprocess.run(
      [testutil.PYTHON, "-c", _SERVE, export_dir, os.path.join(tmp, "in.npz"),
       os.path.join(tmp, "out.npz")],
      env=testutil.trainer_env({"TF_CPP_MIN_LOG_LEVEL": "2"}), capture_output=True, text=True,
      timeout=120, check=False)
  test.assertEqual(done.returncode, 0, done.stderr[-3000:])
  with np.load(os.path.join(tmp, "out.npz")) as out:
    return dict(out), json.loads(done.stdout.splitlines()[-1])


def _padded(rows):
  """The ids as serving takes them: int64 [batch, longest row], padded."""
  ids = np.full((len(rows), max(map(len, rows))), export.IDS_PADDING, np.int64)
  for i, row in enumerate(rows):
    ids[i, :len(row)] = row
  return ids


def _dense(n):
  return np.random.default_rng(5).normal(size=(n, _DENSE_DIM)).astype(np.float32)


def _wide_deep_probabilities(cfg, num_parts, checkpoint, rows, dense):
  """What the model built as training builds it (tables in `num_parts` parts, sparse ids)
  predicts from `checkpoint`, or from fresh random weights saved there if it does not exist."""
  with tf.Graph().as_default():
    global_step = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.sparse_placeholder(tf.int64, [None, None])
    dense_dim = dense.shape[1]
    dense_in = tf.compat.v1.placeholder(tf.float32, [None, dense_dim])
    labels = tf.compat.v1.placeholder(tf.int64, [None])
    logits = models.build_logits(
        "wide_deep", {"ids": ids, "dense": dense_in}, (dense_dim,), 2,
        cfg.model.hidden_units, vocab_size=cfg.model.vocab_size,
        embedding_dim=cfg.model.embedding_dim,
        partitioner=tf.compat.v1.fixed_size_partitioner(max(num_parts, 1)))
    model_variables = tf.compat.v1.trainable_variables()
    tables = [v for v in model_variables if "/part_" in v.op.name]
    assert len(tables) == 2 * max(num_parts, 1), [v.op.name for v in tables]
    # Optimizer slots in the checkpoint, which the export must leave out.
    loss, _ = models.loss_and_accuracy(logits, labels)
    tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      if tf.io.gfile.exists(checkpoint + ".index"):
        saver.restore(session, checkpoint)
      else:
        session.run(tf.compat.v1.global_variables_initializer())
        rng = np.random.default_rng(3)  # Every weight non-zero, the wide ones too.
        for v in model_variables:
          v.load(rng.normal(size=v.shape.as_list()).astype(np.float32), session)
        global_step.load(int(checkpoint.rsplit("-", 1)[1]), session)
        saver.save(session, checkpoint)
      indices = [[i, j] for i, row in enumerate(rows) for j in range(len(row))]
      feed = {ids: tf.compat.v1.SparseTensorValue(
                  np.array(indices, np.int64).reshape(-1, 2),
                  np.array([x for row in rows for x in row], np.int64),
                  [len(rows), max(map(len, rows))]),
              dense_in: dense}
      return session.run(tf.nn.softmax(logits), feed)


def _wide_deep_config(log_dir, *argv):
  return testutil.make_config(
      "--model=wide_deep", "--dataset=tfrecord", "--vocab_size=101", "--embedding_dim=4",
      "--hidden_units=8", f"--log_dir={log_dir}", "--log_every_steps=1000", *argv)


_CLICKS = data.DataSet("tfrecord", (_DENSE_DIM,), 2, None, None, None, None)


class ExportTest(absltest.TestCase):

  def test_digits_export_serves_the_accuracy_in_result_json(self):
    log_dir = testutil.make_tempdir(self)
    cfg = testutil.make_config(f"--log_dir={log_dir}", "--train_steps=100",
                               "--log_every_steps=1000")
    dataset = data.load("digits")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      result = trainer.train(cfg, dataset)
      returned = export.export_and_record(cfg, dataset, result)
    path = os.path.join(log_dir, "export", "100")
    self.assertIn(f"export: {path} (serving_default: images float32 [None, 8, 8, 1] -> "
                  "probabilities, classes)\n", output.getvalue())
    written = testutil.read_result_json(log_dir)
    self.assertEqual(written, returned)
    self.assertEqual(written["export_dir"], os.path.abspath(path))
    self.assertEqual(os.listdir(os.path.dirname(path)), ["100"])  # Nothing half-written.

    served, signature = _serve(self, written["export_dir"], {"images": dataset.x_test})
    self.assertEqual(signature["inputs"], {"images": ["float32", [None, 8, 8, 1]]})
    self.assertEqual(signature["outputs"], {"probabilities": ["float32", [None, 10]],
                                            "classes": ["int64", [None]]})
    # The model's variables and the step they were trained to; no Adam slots.
    self.assertEqual(signature["variables"], ["global_step"] + [
        f"model/{layer}/{kind}" for layer in ("hidden0", "hidden1", "logits")
        for kind in ("bias", "kernel")])
    self.assertEqual(signature["global_step"], [100])
    np.testing.assert_allclose(served["probabilities"].sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(served["classes"], served["probabilities"].argmax(axis=1))
    accuracy = float(np.mean(served["classes"] == dataset.y_test))
    self.assertAlmostEqual(accuracy, written["accuracy"], delta=1e-6)

  def test_wide_deep_export_serves_padded_ids_as_training_predicts(self):
    data_dir, log_dir = testutil.make_tempdir(self), testutil.make_tempdir(self)
    with contextlib.redirect_stdout(io.StringIO()):
      clicks.write_click_set(data_dir, num_train=256, num_test=64, vocab=300,
                             dense_dim=_DENSE_DIM, num_shards=1, seed=1)
      cfg = _wide_deep_config(log_dir, f"--data_dir={data_dir}", "--train_steps=30",
                              "--batch_size=32", "--optimizer=adagrad")
      dataset = data.load("tfrecord", data_dir)
      trainer.train(cfg, dataset)
    path = export.export_saved_model(cfg, dataset, log_dir)
    self.assertEqual(path, os.path.join(log_dir, "export", "30"))
    self.assertEqual(
        export.describe(cfg, dataset),
        "serving_default: ids int64 [None, None], dense float32 [None, 3] -> probabilities, "
        "classes")

    dense = _dense(len(_ROWS))
    served, signature = _serve(self, path, {"ids": _padded(_ROWS), "dense": dense})
    self.assertEqual(signature["inputs"], {"ids": ["int64", [None, None]],
                                           "dense": ["float32", [None, _DENSE_DIM]]})
    self.assertEqual(signature["outputs"], {"probabilities": ["float32", [None, 2]],
                                            "classes": ["int64", [None]]})
    self.assertEqual(signature["variables"], _WIDE_DEEP_VARIABLES)
    expected = _wide_deep_probabilities(cfg, cfg.num_ps, tf.train.latest_checkpoint(log_dir),
                                        _ROWS, dense)
    np.testing.assert_allclose(served["probabilities"], expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(served["classes"], expected.argmax(axis=1))

  def test_tables_saved_in_parts_restore_whole(self):
    log_dir = testutil.make_tempdir(self)
    cfg = _wide_deep_config(log_dir)
    dense = _dense(len(_ROWS))
    # 101 rows in 2 parts: 51 and 50, as a run with 2 PS tasks saves them.
    expected = _wide_deep_probabilities(cfg, 2, os.path.join(log_dir, "model.ckpt-7"), _ROWS,
                                        dense)
    path = export.export_saved_model(cfg, _CLICKS, log_dir)
    self.assertEqual(path, os.path.join(log_dir, "export", "7"))
    self.assertEqual(
        [name for name, _ in tf.train.list_variables(os.path.join(path, "variables",
                                                                  "variables"))],
        _WIDE_DEEP_VARIABLES)
    # Padding is no id: the same examples padded wider predict the same.
    wider = np.pad(_padded(_ROWS), ((0, 0), (0, 3)), constant_values=export.IDS_PADDING)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
      signature = meta_graph.signature_def["serving_default"]
      probabilities = signature.outputs["probabilities"].name
      served, served_wider = (
          session.run(probabilities, {signature.inputs["ids"].name: ids,
                                      signature.inputs["dense"].name: dense})
          for ids in (_padded(_ROWS), wider))
    self.assertGreater(np.ptp(expected[:, 1]), 0.01)  # The examples do differ.
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(served_wider, served)

  def test_a_click_model_without_dense_features_serves_ids_alone(self):
    log_dir = testutil.make_tempdir(self)
    cfg = _wide_deep_config(log_dir)
    no_dense = np.zeros((len(_ROWS), 0), np.float32)
    expected = _wide_deep_probabilities(cfg, 2, os.path.join(log_dir, "model.ckpt-5"), _ROWS,
                                        no_dense)
    clicks_without_dense = data.DataSet("tfrecord", (0,), 2, None, None, None, None)
    self.assertEqual(export.describe(cfg, clicks_without_dense),
                     "serving_default: ids int64 [None, None] -> probabilities, classes")
    path = export.export_saved_model(cfg, clicks_without_dense, log_dir)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      signature = tf.compat.v1.saved_model.loader.load(
          session, ["serve"], path).signature_def["serving_default"]
      self.assertEqual(list(signature.inputs), ["ids"])
      served = session.run(signature.outputs["probabilities"].name,
                           {signature.inputs["ids"].name: _padded(_ROWS)})
    self.assertGreater(np.ptp(expected[:, 1]), 0.01)  # The examples do differ.
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-7)

  def test_the_same_step_again_keeps_the_first_export(self):
    log_dir = testutil.make_tempdir(self)
    cfg = _wide_deep_config(log_dir)
    _wide_deep_probabilities(cfg, 1, os.path.join(log_dir, "model.ckpt-7"), _ROWS,
                             _dense(len(_ROWS)))
    path = export.export_saved_model(cfg, _CLICKS, log_dir)
    saved_model_pb = os.path.join(path, "saved_model.pb")
    first = os.stat(saved_model_pb).st_mtime_ns
    # What an export killed half-way leaves behind.
    os.makedirs(os.path.join(log_dir, "export", ".partial-7-12345", "variables"))
    run_result.write(log_dir, {"global_step": 7})
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      result = export.export_and_record(cfg, _CLICKS, {"global_step": 7})
    self.assertEqual(result, {"global_step": 7, "export_dir": path})
    self.assertEqual(testutil.read_result_json(log_dir), result)
    self.assertIn("kept from an earlier export of this step)", output.getvalue())
    self.assertEqual(os.stat(saved_model_pb).st_mtime_ns, first)
    self.assertEqual(os.listdir(os.path.join(log_dir, "export")), ["7"])

  def test_failures_are_one_line_and_leave_checkpoint_and_result_json_alone(self):
    log_dir = testutil.make_tempdir(self)
    cfg = _wide_deep_config(log_dir)
    with self.assertRaisesRegex(export.ExportError,
                                rf"^no checkpoint in --log_dir={log_dir} to export$"):
      export.export_saved_model(cfg, _CLICKS, log_dir)
    checkpoint = os.path.join(log_dir, "model.ckpt-7")
    _wide_deep_probabilities(cfg, 2, checkpoint, _ROWS, _dense(len(_ROWS)))
    run_result.write(log_dir, {"global_step": 7})
    files = {name: os.stat(os.path.join(log_dir, name)).st_mtime_ns
             for name in os.listdir(log_dir)}
    intact = (rf"; the checkpoint {checkpoint} and result\.json are intact; run the same "
              r"command again to export$")
    # A checkpoint of another model.
    linear = testutil.make_config(f"--log_dir={log_dir}", "--model=linear")
    with self.assertRaisesRegex(export.ExportError,
                                rf"^the checkpoint {checkpoint} does not hold this model "
                                rf"\(it has no model/logits/\w+\): --log_dir holds another run's "
                                r"checkpoints; nothing exported$"):
      export.export_saved_model(linear, data.load("digits"), log_dir)
    # The same model with other sizes (a restore would not notice).
    with self.assertRaisesRegex(export.ExportError,
                                r"\(model/deep/embedding is \[101, 4\] there, \[101, 6\] here\)"):
      export.export_saved_model(_wide_deep_config(log_dir, "--embedding_dim=6"), _CLICKS,
                                log_dir)
    # An export directory that cannot be written.
    with open(os.path.join(log_dir, "export"), "w") as f:
      f.write("in the way")
    with self.assertRaisesRegex(export.ExportError,
                                rf"^the export {log_dir}/export/7 failed: [^\n]*{intact}"):
      export.export_and_record(cfg, _CLICKS, {"global_step": 7})
    files.pop("export", None)
    self.assertEqual({name: os.stat(os.path.join(log_dir, name)).st_mtime_ns
                      for name in os.listdir(log_dir) if name != "export"}, files)
    self.assertEqual(testutil.read_result_json(log_dir), {"global_step": 7})

  def test_a_failed_export_ends_the_run_with_one_line_and_status_1(self):
    log_dir = testutil.make_tempdir(self)
    with open(os.path.join(log_dir, "export"), "w") as f:
      f.write("in the way")
    done = subprocess.run(
        [testutil.PYTHON, "-m", "ps_trainer", f"--log_dir={log_dir}", "--train_steps=20",
         "--model=linear"],
        env=testutil.trainer_env(), capture_output=True, text=True, timeout=120, check=False)
    self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
    self.assertNotIn("Traceback", done.stderr)
    self.assertRegex(done.stderr.splitlines()[-1],
                     rf"^ps_trainer: error: the export {log_dir}/export/20 failed: .* run the "
                     "same command again to export$")
    self.assertIn("done: step 20", done.stdout)
    self.assertNotIn("export_dir", testutil.read_result_json(log_dir))
    self.assertIsNotNone(tf.train.latest_checkpoint(log_dir))


if __name__ == "__main__":
  absltest.main()
