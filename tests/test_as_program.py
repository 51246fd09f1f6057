"""What every program of the package gets as it starts (as_program.py): a quiet Ctrl-C while
it loads, and output to a reader that has gone going nowhere. One child process each."""

import os
import signal
import subprocess
import sys

from absl.testing import absltest

import testutil

# An `absl` first on PYTHONPATH that presses Ctrl-C as a program loads it (every program here
# imports absl before it takes SIGINT itself), then waits for what the signal does.
_ABSL_THAT_INTERRUPTS = ("import os, signal, time\n"
                         "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\n")
# Whether this process has Python's own SIGINT handler and streams, printed by an importer.
_KEEPS_ITS_OWN = ("import signal, sys\n"
                  "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, "
                  "sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__)\n")


def _run(argv, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE):
  return subprocess.run(testutil.with_default_sigint(argv), env=env, stdout=stdout,
                        stderr=stderr, text=True, timeout=120, check=False)


class InterruptAtStartTest(absltest.TestCase):
  """Ctrl-C while a program is still loading ends it by SIGINT, as Python ends on
  KeyboardInterrupt (so a calling script stops too), but with no traceback."""

  def test_each_program_ends_quietly_by_sigint(self):
    env = testutil.with_fake_package(self, testutil.trainer_env(), "absl", _ABSL_THAT_INTERRUPTS)
    main_file = os.path.join(testutil.REPO_ROOT, "ps_trainer", "__main__.py")
    for argv in (["-m", "ps_trainer"], ["-m", "ps_trainer.experiments.bench"],
                 ["-m", "ps_trainer.plan_main"], ["-m", "ps_trainer.datasets.clicks"],
                 [main_file]):  # By its path, as `bazel run //ps_trainer` starts it.
      with self.subTest(argv=argv):
        done = _run([sys.executable, *argv], env)
        self.assertEqual((done.returncode, done.stdout, done.stderr), (-signal.SIGINT, "", ""))

  def test_a_program_that_imports_the_package_keeps_its_own_handler_and_streams(self):
    # A guard on the gate: only the package's own programs are set up.
    env = testutil.with_fake_package(self, testutil.trainer_env(), "otherpkg",
                                     "import ps_trainer\n")
    with open(os.path.join(env["PYTHONPATH"].split(os.pathsep)[0], "otherpkg", "__main__.py"),
              "w", encoding="utf-8") as f:
      f.write(_KEEPS_ITS_OWN)
    for argv in (["-c", "import ps_trainer\n" + _KEEPS_ITS_OWN], ["-m", "otherpkg"]):
      with self.subTest(argv=argv[:2]):
        done = _run([sys.executable, *argv], env)
        self.assertEqual((done.returncode, done.stdout), (0, "True True True\n"), done.stderr)


class ClosedOutputTest(absltest.TestCase):
  """`./launch.sh ... | head -1`, with head gone before the first line: the pipe's read end
  is closed before the program starts, so every write to it fails."""

  def _closed_pipe(self):
    read_end, write_end = os.pipe()
    os.close(read_end)
    self.addCleanup(os.close, write_end)
    return write_end

  def test_a_program_whose_reader_has_gone_does_its_work_and_exits_0(self):
    out_dir = os.path.join(testutil.make_tempdir(self), "clicks")
    done = _run([sys.executable, "-m", "ps_trainer.datasets.clicks", f"--out_dir={out_dir}",
                 "--train_examples=40", "--test_examples=10", "--shards=1"],
                testutil.trainer_env({"TF_CPP_MIN_LOG_LEVEL": "2"}), stdout=self._closed_pipe())
    self.assertEqual((done.returncode, done.stderr), (0, ""))
    self.assertEqual(sorted(os.listdir(out_dir)), ["test-00000-of-00001.tfrecord",
                                                   "train-00000-of-00001.tfrecord"])

  def test_a_line_before_the_work_to_a_closed_pipe_does_not_end_it(self):
    # As `compare ... | head -2` lost its report: the trainer says what it trains first.
    log_dir = os.path.join(testutil.make_tempdir(self), "run")
    closed = self._closed_pipe()
    done = _run([sys.executable, "-m", "ps_trainer", "--train_steps=5", f"--log_dir={log_dir}"],
                testutil.trainer_env(), stdout=closed, stderr=closed)
    self.assertEqual(done.returncode, 0)
    self.assertEqual(testutil.read_result_json(log_dir)["global_step"], 5)


if __name__ == "__main__":
  absltest.main()
