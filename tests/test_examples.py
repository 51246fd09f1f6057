"""The examples/ run for real: each trains in local mode, reaches its accuracy floor and exports.

One subprocess per example (`python -m ps_trainer --model=examples/X.py:model_fn ...`), the three
started together in setUpClass; the tests then read their result.json and the CNN's export.
"""

import os
import shutil
import subprocess
import tempfile

from absl.testing import absltest
import numpy as np

import testutil

TRAIN_STEPS = 200
# name -> (extra flags, test accuracy floor). Measured at 200 steps: CNN 0.947, MLP 0.972,
# clicks 0.890 (51% of its test examples are clicks).
EXAMPLES = {
    "keras_cnn": ((), 0.8),
    "layers_mlp": (('--params={"hidden_units": [128, 64]}',), 0.85),
    "wide_deep_clicks": (("--optimizer=adagrad", "--learning_rate=0.5"), 0.75),
}


class ExamplesTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(prefix="ps_trainer_examples_", dir=os.environ.get("TEST_TMPDIR"))
    cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
    procs = {}
    for name, (flags, _) in EXAMPLES.items():
      script = f"examples/{name}.py"
      procs[name] = testutil.start(
          [testutil.PYTHON, "-m", "ps_trainer", f"--model={script}:model_fn",
           f"--input_fn={script}:input_fn", f"--train_steps={TRAIN_STEPS}",
           f"--log_dir={os.path.join(cls.root, name)}", *flags],
          os.path.join(cls.root, f"{name}.log"), cwd=testutil.REPO_ROOT)
      cls.addClassCleanup(procs[name].kill_group)
    # Started together: on 2 cores the three runs take about as long as two one after another.
    cls.codes = {name: proc.wait(timeout=240) for name, proc in procs.items()}
    cls.procs = procs

  def _result(self, name: str) -> dict:
    self.assertEqual(self.codes[name], 0, self.procs[name].log_tail())
    return testutil.read_result_json(os.path.join(self.root, name))

  def test_each_example_trains_and_exports(self):
    for name, (_, floor) in EXAMPLES.items():
      with self.subTest(name):
        result = self._result(name)
        self.assertEqual(result["global_step"], TRAIN_STEPS)
        self.assertGreater(result["accuracy"], floor)
        self.assertEqual(set(result["metrics"]), {"loss", "accuracy"})
        self.assertEqual(result["metrics"]["accuracy"], result["accuracy"])
        self.assertTrue(os.path.isfile(os.path.join(result["export_dir"], "saved_model.pb")),
                        result["export_dir"])
    testutil.assert_no_leftover(marker=self.root)

  def test_cnn_export_scores_the_reported_accuracy(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    result = self._result("keras_cnn")
    with np.load(os.path.join(testutil.REPO_ROOT, "ps_trainer", "assets", "digits.npz")) as data:
      images, labels = data["x_test"], data["y_test"]
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      meta_graph = tf.compat.v1.saved_model.load(session, ["serve"], result["export_dir"])
      signature = meta_graph.signature_def["serving_default"]
      self.assertEqual(set(signature.inputs), {"features"})
      self.assertEqual(set(signature.outputs), {"classes", "probabilities"})
      classes = session.run(signature.outputs["classes"].name,
                            {signature.inputs["features"].name: images[..., np.newaxis]})
    self.assertEqual(classes.shape, labels.shape)
    self.assertAlmostEqual(float(np.mean(classes == labels)), result["accuracy"], places=4)


  def test_the_users_own_test_file_passes(self):
    # examples/test_my_model.py, as its user runs it: pytest on the file, ps_trainer.testing
    # inside (an in-process sync cluster and a placement).
    process = subprocess.run(
        [testutil.PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--rootdir", os.path.join(testutil.REPO_ROOT, "examples"),
         os.path.join(testutil.REPO_ROOT, "examples", "test_my_model.py")],
        capture_output=True, text=True, timeout=240, env=testutil.trainer_env(),
        cwd=testutil.REPO_ROOT)
    self.assertEqual(process.returncode, 0, process.stdout[-3000:] + process.stderr[-2000:])
    self.assertRegex(process.stdout, r"\b3 passed\b")


if __name__ == "__main__":
  absltest.main()
