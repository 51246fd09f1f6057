"""How every task imports TensorFlow (quiet_import.py): silently, and without Keras.

One child process, as a task starts: its stderr, and the modules it loaded.
"""

import json
import subprocess
import sys
import textwrap

from absl.testing import absltest

import testutil

_CHILD = textwrap.dedent("""
    import json, os, sys
    from ps_trainer.console import quiet_import
    tf = quiet_import.tensorflow()
    print("imported", file=sys.stderr, flush=True)  # What follows is not the import's.
    tf.compat.v1.disable_eager_execution()
    with tf.compat.v1.Session() as session:
        total = session.run(tf.reduce_sum(tf.constant([1.0, 2.0])))
    print(json.dumps({"sum": float(total),
                      "loaded": sorted(m for m in ("keras", "matplotlib") if m in sys.modules),
                      "switch": os.environ.get("TF_USE_LEGACY_KERAS")}))
    """)


def _run_child(extra_env):
  """Runs _CHILD as a task would start, whatever this process's own environment says."""
  env = testutil.trainer_env()
  env.pop("TF_USE_LEGACY_KERAS", None)
  env.update(extra_env)
  return subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                        timeout=120, check=False)


class QuietImportTest(absltest.TestCase):

  def test_tensorflow_loads_without_keras_or_its_notes(self):
    # Level 0 lets TF's native libraries print their start-up notes (the CUDA probe's among
    # them); the import must still leave stderr empty.
    done = _run_child({"TF_CPP_MIN_LOG_LEVEL": "0"})
    self.assertEqual(done.returncode, 0, done.stderr[-2000:])
    self.assertTrue(done.stderr.startswith("imported\n"), done.stderr[-2000:])
    # Keras 3 (and matplotlib, which it pulls in) cost ~0.6 s of CPU at every task's start.
    self.assertEqual(json.loads(done.stdout), {"sum": 3.0, "loaded": [], "switch": "1"})

  def test_a_users_own_keras_setting_is_kept(self):
    done = _run_child({"TF_USE_LEGACY_KERAS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"})
    self.assertEqual(done.returncode, 0, done.stderr[-2000:])
    result = json.loads(done.stdout)
    self.assertEqual(result["switch"], "0")
    self.assertIn("keras", result["loaded"])

  def test_the_notes_show_when_the_import_fails_and_not_when_ctrl_c_cuts_it(self):
    child = "from ps_trainer.console import quiet_import\nquiet_import.numpy()\n"
    # Ctrl-C is KeyboardInterrupt, or SystemExit in a program (as_program.py), which Python
    # ends on without a word.
    for error, stderr in (("ImportError('a broken numpy')", "a BLAS note\nTraceback"),
                          ("KeyboardInterrupt", "Traceback"), ("SystemExit(130)", "")):
      with self.subTest(error=error):
        # A numpy that writes a note to file descriptor 2, then fails.
        env = testutil.with_fake_package(
            self, testutil.trainer_env(), "numpy",
            f"import os\nos.write(2, b'a BLAS note\\n')\nraise {error}\n")
        done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        self.assertNotEqual(done.returncode, 0)
        self.assertTrue(done.stderr.startswith(stderr), done.stderr)
        self.assertEqual("a BLAS note" in done.stderr, stderr.startswith("a BLAS"), done.stderr)


if __name__ == "__main__":
  absltest.main()
