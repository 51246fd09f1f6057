"""What every program of the package gets as it starts (as_program.py): a quiet Ctrl-C while
it loads, and output to a reader that has gone going nowhere. One child process each."""

import os
import subprocess
import sys

from absl.testing import absltest

import testutil

# An `absl` first on PYTHONPATH that presses Ctrl-C as a program loads it (every program here
# imports absl before it takes SIGINT itself), then waits for what the signal does.
_ABSL_THAT_INTERRUPTS = ("import os, signal, time\n"
                         "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\n")


def _run(argv, env, stdout=subprocess.PIPE):
  return subprocess.run(testutil.with_default_sigint(argv), env=env, stdout=stdout,
                        stderr=subprocess.PIPE, text=True, timeout=120, check=False)


class InterruptAtStartTest(absltest.TestCase):
  """Ctrl-C while a program is still loading ends it with status 130 and no traceback; once
  loaded, each program takes SIGINT itself (or keeps this)."""

  def test_each_program_ends_quietly_with_status_130(self):
    env = testutil.with_fake_package(self, testutil.trainer_env(), "absl", _ABSL_THAT_INTERRUPTS)
    for module in ("ps_trainer", "ps_trainer.experiments.bench", "ps_trainer.plan_main",
                   "ps_trainer.clicks"):
      with self.subTest(module=module):
        done = _run([sys.executable, "-m", module], env)
        self.assertEqual((done.returncode, done.stdout, done.stderr), (130, "", ""))

  def test_a_program_that_imports_the_package_keeps_its_keyboard_interrupt_and_streams(self):
    check = ("import signal, sys, ps_trainer; "
             "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, "
             "sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__)")
    done = _run([sys.executable, "-c", check], testutil.trainer_env())
    self.assertEqual((done.returncode, done.stdout), (0, "True True True\n"), done.stderr)


class ClosedOutputTest(absltest.TestCase):

  def test_a_program_whose_reader_has_gone_does_its_work_and_exits_0(self):
    # `./launch.sh clicks ... | head -1`, with head gone before the first line: the pipe's
    # read end is closed before the program starts, so every write to stdout fails.
    out_dir = os.path.join(testutil.make_tempdir(self), "clicks")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
      done = _run([sys.executable, "-m", "ps_trainer.clicks", f"--out_dir={out_dir}",
                   "--train_examples=40", "--test_examples=10", "--shards=1"],
                  testutil.trainer_env({"TF_CPP_MIN_LOG_LEVEL": "2"}), stdout=write_end)
    finally:
      os.close(write_end)
    self.assertEqual((done.returncode, done.stderr), (0, ""))
    self.assertEqual(sorted(os.listdir(out_dir)), ["test-00000-of-00001.tfrecord",
                                                   "train-00000-of-00001.tfrecord"])


if __name__ == "__main__":
  absltest.main()
