"""`python -m ps_trainer` with bad input, as a user would run it: one clear line, exit 2.

A catalogue of the mistakes a user makes with flags, TF_CONFIG, data files, ports and the log
directory (bad_input_cases.py). Each case runs the real binary in a subprocess (cwd: a fresh temp
dir, so a local run's default runs/ directory lands there) and asserts:
  * exit status 2 (a user error), within a timeout, so a hang fails instead of blocking;
  * no "Traceback" anywhere;
  * stdout and stderr together hold exactly ONE line, on stderr, starting with
    "ps_trainer: error: " (TensorFlow's start-up noise is hidden by the trainer);
  * that line holds the case's key words: the flag, file or TF_CONFIG field, what was wrong and
    what is accepted.

Cases that fail on flags, TF_CONFIG, the log directory or a data file read whole (digits, mnist,
npz) answer before TensorFlow loads (~0.2 s), and are run so that an import of TensorFlow fails
them; TFRecord files, ports and another model's checkpoints are checked after it loads (~3 s
each). Cases that get that far run with --train_steps=2 in case a regression lets them train.
"""

import os
import signal
import subprocess
import time

from absl.testing import absltest
from absl.testing import parameterized

from bad_input_cases import AFTER_TENSORFLOW, CASES, SHORT, click_dir
import testutil

_TIMEOUT_SECS = 120  # TF cases take ~3 s; this only turns a hang into a failure.
_PREFIX = "ps_trainer: error: "


def _user_env(extra):
  """The environment of a user's shell: the checkout importable, no test-only settings.

  testutil.trainer_env() pins TF_CPP_MIN_LOG_LEVEL for the cluster tests; a user has no such
  setting, so the trainer's own default applies here. PS_TRAINER_TRACEBACK would show tracebacks.
  """
  env = testutil.trainer_env()
  for name in ("TF_CPP_MIN_LOG_LEVEL", "PS_TRAINER_TRACEBACK"):
    env.pop(name, None)
  env.update(extra)
  return env


class BadInputTest(parameterized.TestCase):
  """Each bad input: exit 2, no traceback, one `ps_trainer: error:` line with its key words."""

  def _run(self, argv, env, cwd):
    """Runs `python -m ps_trainer argv`; returns (code, stdout, stderr, secs). Fails on a hang."""
    args = [testutil.PYTHON, "-m", "ps_trainer", *argv]
    start = time.monotonic()
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
      stdout, stderr = proc.communicate(timeout=_TIMEOUT_SECS)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      stdout, stderr = proc.communicate()
      self.fail(f"still running after {_TIMEOUT_SECS} s (killed): {' '.join(args)}\n"
                f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}")
    return proc.returncode, stdout, stderr, time.monotonic() - start

  @parameterized.named_parameters(*((case[0],) + case for case in CASES))
  def test_one_clear_line(self, name, setup, argv, extra_env, words):
    tmp = testutil.make_tempdir(self)
    values = {"tmp": tmp}
    if setup is not None:
      values.update(setup(self, tmp))
    argv = [a.format(**values) for a in argv]
    env = _user_env(extra_env)
    if name not in AFTER_TENSORFLOW:
      env = testutil.tensorflow_blocked(self, env)
    code, stdout, stderr, secs = self._run(argv, env, cwd=tmp)
    where = (f"\ncommand: python -m ps_trainer {' '.join(argv)}  env: {extra_env}  ({secs:.1f} s)"
             f"\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}")
    self.assertNotIn("Traceback", stdout + stderr, where)
    self.assertNotEqual(code, testutil.TENSORFLOW_IMPORTED,
                        f"TensorFlow loaded before the error{where}")
    self.assertEqual(code, 2, f"exit status {code}, expected 2 (a user error){where}")
    self.assertEqual(stdout, "", f"expected nothing on stdout{where}")
    lines = stderr.splitlines()
    self.assertLen(lines, 1, f"expected exactly one line on stderr{where}")
    line = lines[0]
    self.assertTrue(line.startswith(_PREFIX), f"the line does not start with {_PREFIX!r}{where}")
    for word in words:
      self.assertIn(word.format(**values), line, where)
    # A local run that failed leaves no empty runs/local-<time> behind.
    self.assertFalse(os.path.exists(os.path.join(tmp, "runs")), where)

  def test_the_blocked_tensorflow_ends_a_run_that_loads_it(self):
    # What the cases run with testutil.tensorflow_blocked rely on: it is the one a run imports.
    tmp = testutil.make_tempdir(self)
    env = testutil.tensorflow_blocked(self, _user_env({}))
    code, stdout, stderr, _ = self._run(["--dataset=synthetic", SHORT, f"--log_dir={tmp}/run"],
                                        env, cwd=tmp)
    self.assertEqual(code, testutil.TENSORFLOW_IMPORTED, stdout + stderr)

  def test_a_corrupt_record_met_while_training_is_named(self):
    # Past the records checked at start-up: found by the pipeline, then
    # named by a scan of the files (TF's own message names no file).
    tmp = testutil.make_tempdir(self)
    click_dir(self, tmp)
    from ps_trainer.datasets import record_checks  # pylint: disable=g-import-not-at-top
    path = os.path.join(tmp, "clicks", "train-00001-of-00002.tfrecord")
    with open(path, "rb") as f:
      raw = bytearray(f.read())
    at = 0
    for _ in range(150):  # Skip 150 records: length (8), CRC (4), payload, CRC (4).
      at += 16 + int.from_bytes(raw[at:at + 8], "little")
    raw[at + 15] ^= 0xFF  # A payload byte of record 150.
    with open(path, "wb") as f:
      f.write(bytes(raw))
    record_checks.inspect(os.path.join(tmp, "clicks"))  # Start-up sees only 100: no error.
    argv = ["--model=wide_deep", "--dataset=tfrecord", f"--data_dir={tmp}/clicks",
            "--vocab_size=100", "--train_steps=20", f"--log_dir={tmp}/run"]
    code, stdout, stderr, secs = self._run(argv, _user_env({}), cwd=tmp)
    where = f"\n({secs:.1f} s)\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}"
    self.assertNotIn("Traceback", stdout + stderr, where)
    self.assertEqual(code, 2, where)
    lines = stderr.splitlines()
    self.assertLen(lines, 1, where)
    self.assertTrue(lines[0].startswith(_PREFIX), where)
    self.assertIn(path, lines[0], where)
    self.assertIn("record 150", lines[0], where)

  def test_a_full_log_dir_is_named_a_full_disk_not_a_large_model(self):
    # TF reports "No space left on device" as ResourceExhaustedError, its out-of-memory error.
    tmp = testutil.make_tempdir(self)
    full = os.path.join(tmp, "full")
    os.makedirs(full)
    argv = [testutil.PYTHON, "-m", "ps_trainer", "--dataset=synthetic", SHORT,
            f"--log_dir={full}/run"]
    # A 96 KiB file system of its own, in a mount namespace of its own; exit 99: none here.
    script = f"mount -t tmpfs -o size=96k tmpfs {full} || exit 99; exec {' '.join(argv)}"
    try:
      probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True,
                             timeout=30, check=False)
    except FileNotFoundError:
      self.skipTest("no unshare here")
    if probe.returncode != 0:  # Not root, or a sandbox (Bazel's) that allows no namespace.
      self.skipTest(f"no mount namespace here: {probe.stderr.strip()}")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=tmp,
                          env=_user_env({}), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=_TIMEOUT_SECS, check=False)
    if proc.returncode == 99:
      self.skipTest(f"cannot mount a small file system here: {proc.stderr.strip()}")
    where = f"\n--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}"
    self.assertNotIn("Traceback", proc.stdout + proc.stderr, where)
    self.assertEqual(proc.returncode, 1, where)
    last = proc.stderr.splitlines()[-1]
    self.assertTrue(last.startswith(_PREFIX + "a file system is full ("), where)
    self.assertIn("No space left on device", last, where)
    self.assertIn("run the same command again", last, where)

  def _python_write_fails(self, error: str):
    """Runs a short local job whose result.json write raises OSError(`error`).

    Returns:
      (stderr's last line, the log dir).
    """
    tmp = testutil.make_tempdir(self)
    script = (
        "import errno, os, runpy, sys\n"
        "from ps_trainer.console import output_dir\n"
        "write_json = output_dir.write_json\n"
        "def fails(path, value):\n"
        "  if not path.endswith('result.json'):\n"
        "    return write_json(path, value)\n"
        f"  raise OSError(errno.{error}, os.strerror(errno.{error}), path)\n"
        "output_dir.write_json = fails\n"
        f"sys.argv = ['ps_trainer', '--dataset=synthetic', '{SHORT}', '--log_dir={tmp}/run']\n"
        "runpy.run_module('ps_trainer', run_name='__main__')\n")
    proc = subprocess.run([testutil.PYTHON, "-c", script], cwd=tmp, env=_user_env({}),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=_TIMEOUT_SECS, check=False)
    where = f"\n--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}"
    self.assertNotIn("Traceback", proc.stdout + proc.stderr, where)
    self.assertEqual(proc.returncode, 1, where)
    return proc.stderr.splitlines()[-1], f"{tmp}/run"

  def test_a_full_disk_met_by_a_python_write_is_the_same_one_line(self):
    # result.json is written by Python, whose full disk is an OSError, not TF's error.
    last, log_dir = self._python_write_fails("ENOSPC")
    self.assertEqual(last, (
        f"{_PREFIX}a file system is full (No space left on device: {log_dir}/result.json); "
        "free space there (--log_dir holds the checkpoints, summaries and export) and run the "
        "same command again: it continues from the newest checkpoint"))

  def test_any_other_failed_python_write_is_one_line_naming_the_file(self):
    last, log_dir = self._python_write_fails("EIO")
    self.assertEqual(last, (
        f"{_PREFIX}the run stopped on a file error: {log_dir}/result.json: Input/output "
        "error (PS_TRAINER_TRACEBACK=1 shows the traceback)"))


if __name__ == "__main__":
  absltest.main()
