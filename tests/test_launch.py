"""Tests of launch.sh: input checks, help, the .venv bootstrap, and its grace for a stopped task.
Whole local clusters: test_launch_local.py.
"""

import os
import re
import shutil
import subprocess
import time

from absl.testing import absltest

from ps_trainer.faults import stops
import testutil

# A generous bound for a loaded 2-core machine.
INPUT_TIMEOUT_SECS = 30


def _run(args, timeout=INPUT_TIMEOUT_SECS, env=None, cwd=None):
  """Runs a command that must end quickly; returns (exit code, combined output)."""
  proc = subprocess.run(
      [str(a) for a in args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, timeout=timeout, env=env or testutil.trainer_env(),
      cwd=str(cwd or testutil.REPO_ROOT), check=False)
  return proc.returncode, proc.stdout.decode("utf-8", "replace")


class StopGraceTest(absltest.TestCase):

  def test_the_launcher_kills_a_stopped_task_only_after_its_own_forced_exit(self):
    # A PS's is the latest (stops.PS_GRACE_SECS); SIGKILL before it would cost a blocked chief its
    # last checkpoint.
    self.assertGreater(stops.SUPERVISOR_KILL_SECS, stops.PS_GRACE_SECS + 2)
    grace = re.search(r"^STOP_GRACE_SECS=(\d+)$", testutil.read_text(testutil.LAUNCH_SH),
                      re.MULTILINE)
    self.assertIsNotNone(grace)
    self.assertEqual(int(grace.group(1)), stops.SUPERVISOR_KILL_SECS)

  def test_every_pod_of_the_tfjob_gets_the_same_grace(self):
    manifest = (testutil.REPO_ROOT / "deploy" / "kubernetes" / "tfjob.yaml").read_text(
        encoding="utf-8")
    graces = re.findall(r"terminationGracePeriodSeconds: (\d+)", manifest)
    self.assertLen(graces, 4)  # Chief, PS, Worker, Evaluator.
    self.assertEqual(set(map(int, graces)), {stops.SUPERVISOR_KILL_SECS})


class LaunchInputTest(absltest.TestCase):
  """Bad invocations fail at once with one line naming the flag; no TensorFlow is started."""

  def test_bad_num_workers(self):
    for value in ("0", "-1", "two"):
      with self.subTest(value=value):
        code, out = _run([testutil.LAUNCH_SH, "local", f"--num_workers={value}"])
        self.assertEqual(code, 2, out)
        self.assertEqual(len(out.strip().splitlines()), 1, out)
        self.assertIn("--num_workers", out)
        self.assertNotIn("Traceback", out)

  def test_bad_num_ps(self):
    code, out = _run([testutil.LAUNCH_SH, "local", "--num_ps", "0"])
    self.assertEqual(code, 2, out)
    self.assertRegex(out.strip(), r"^launch\.sh: --num_ps must be an integer >= 1")

  def test_cluster_flags_refused_in_local(self):
    for flag in ("--ps_hosts=127.0.0.1:1", "--job_name=ps", "--task_index", "--worker_hosts=a:1"):
      with self.subTest(flag=flag):
        code, out = _run([testutil.LAUNCH_SH, "local", flag])
        self.assertEqual(code, 2, out)
        self.assertEqual(len(out.strip().splitlines()), 1, out)
        self.assertIn(flag.split("=")[0], out)

  def test_a_launcher_switch_given_a_value_is_named_as_such(self):
    # Passed on, the trainer would call it an unknown flag, which it is not.
    for flag in ("--evaluator=yes", "--no_isolate=1"):
      with self.subTest(flag=flag):
        code, out = _run([testutil.LAUNCH_SH, "local", flag])
        self.assertEqual(code, 2, out)
        self.assertEqual(out.strip(), f"launch.sh: {flag.split('=')[0]} takes no value (got "
                         f"{flag}): pass {flag.split('=')[0]} to turn it on, nothing to leave it off")

  def test_a_bad_trainer_flag_or_data_file_is_the_trainers_one_line_before_any_task_starts(self):
    cwd = testutil.make_tempdir(self)  # where the default runs/local-<time> would go
    for flags, says in (
        (["--train_steps=0"], "ps_trainer: error: flag --train_steps=0: must be >= 1"),
        (["--sync_replicas", "--replicas_to_aggregate=3"],
         "ps_trainer: error: --replicas_to_aggregate=3 exceeds the 2 worker(s)"),
        # Before, a cluster started, its workers failed, and its PS waited 10 s to be stopped.
        (["--dataset=npz", f"--data_path={cwd}/absent.npz"],
         f"ps_trainer: error: --data_path={cwd}/absent.npz: no such file")):
      with self.subTest(flags=flags):
        code, out = _run([testutil.LAUNCH_SH, "local", "--no_isolate", *flags], cwd=cwd)
        self.assertEqual(code, 2, out)
        lines = [l for l in out.strip().splitlines() if "private network namespace" not in l]
        self.assertLen(lines, 1, out)  # Before, one more line per task, and the cluster started.
        self.assertStartsWith(lines[0], says)
        runs = os.path.join(cwd, "runs")
        self.assertEqual(os.listdir(runs) if os.path.isdir(runs) else [], [], out)

  def test_an_unknown_command_is_one_line_not_the_trainers_help(self):
    code, out = _run([testutil.LAUNCH_SH, "lcoal", "--train_steps=5"])
    self.assertEqual(code, 2, out)
    self.assertEqual(out, "launch.sh: unknown command 'lcoal': the commands are local, bench, "
                     "compare, plan, clicks, test and help; for one task, pass only trainer "
                     "--flags (./launch.sh --help)\n")

  def test_help(self):
    code, out = _run([testutil.LAUNCH_SH, "--help"])
    self.assertEqual(code, 0, out)
    for text in ("./launch.sh local", "./launch.sh test", "--helpfull"):
      self.assertIn(text, out)

  def test_every_commands_help_exits_0(self):
    # absl's help flags exit 1, which a script or a CI step reads as a failure; clicks, with
    # flag values of its own, had none.
    for args, says in ((["--helpfull"], "--wait_timeout_secs"),
                       (["--helpshort"], "python -m ps_trainer"),
                       (["plan", "--help"], "--format"),
                       (["plan", "--help"], "--num_workers: Workers of the planned cluster"),
                       (["bench", "--helpshort"], "--rounds"),
                       (["compare", "-?"], "--out_dir"),
                       # Each command's own help, not launch.sh's usage of every command.
                       (["bench", "-h"], "--[no]json: Print the figures as JSON"),
                       (["compare", "--help"], "--target_loss: Training loss"),
                       (["clicks", "--help"], "--train_examples")):
      with self.subTest(args=args):
        code, out = _run([testutil.LAUNCH_SH, *args])
        self.assertEqual(code, 0, out)
        self.assertIn(says, out)

  def test_locals_help_is_its_own_paragraph(self):
    code, out = _run([testutil.LAUNCH_SH, "local", "-h"])
    self.assertEqual(code, 0, out)
    self.assertIn("--num_workers=M", out)
    self.assertIn("--helpfull", out)
    self.assertNotIn("./launch.sh bench", out)


class TestCommandTest(absltest.TestCase):
  """`./launch.sh test`'s pytest command line, from a stand-in Python that prints it."""

  def setUp(self):
    super().setUp()
    self.python = os.path.join(testutil.make_tempdir(self), "python")
    with open(self.python, "w", encoding="utf-8") as f:
      # `-c 'import xdist'` is launch.sh asking whether pytest-xdist is there.
      f.write('#!/bin/sh\n[ "$1" = -c ] && exit "${NO_XDIST:-0}"\necho "$@"\n')
    os.chmod(self.python, 0o755)

  def pytest_args(self, *args, no_xdist=False):
    code, out = _run([testutil.LAUNCH_SH, "test", *args], env=testutil.trainer_env(
        {"PS_TRAINER_PYTHON": self.python, "NO_XDIST": "1" if no_xdist else "0"}))
    self.assertEqual(code, 0, out)
    return out.split()

  def test_two_workers_where_there_are_two_cores(self):
    workers = ["-n", "2", "--dist", "loadgroup"] if len(os.sched_getaffinity(0)) >= 2 else []
    self.assertEqual(self.pytest_args(), ["-m", "pytest", *workers, "-q"])
    self.assertEqual(self.pytest_args("tests/test_config.py", "-k", "defaults"),
                     ["-m", "pytest", *workers, "tests/test_config.py", "-k", "defaults"])

  def test_one_process_for_a_first_failure_stop_a_debugger_live_output_or_no_xdist(self):
    for args in (["-x"], ["--maxfail=3"], ["--pdb"], ["--trace"], ["-s"], ["--capture=no"],
                 ["-p", "no:xdist"], ["-n", "0"], ["-n4"], ["--dist=load"]):
      with self.subTest(args=args):
        self.assertEqual(self.pytest_args(*args, "tests/test_config.py"),
                         ["-m", "pytest", *args, "tests/test_config.py"])
    self.assertEqual(self.pytest_args(no_xdist=True), ["-m", "pytest", "-q"])


class BootstrapTest(absltest.TestCase):
  """The .venv bootstrap, on a scratch checkout whose requirements install nothing (offline, ~5 s).

  The scratch checkout has the real launch.sh and tools/ and a stub ps_trainer that reports which
  interpreter runs it, so the locking and stamp logic are tested exactly as shipped.
  """

  def setUp(self):
    super().setUp()
    self.repo = os.path.join(testutil.make_tempdir(self), "repo")
    for rel in ("launch.sh", os.path.join("tools", "launch_lib.sh")):
      os.makedirs(os.path.dirname(os.path.join(self.repo, rel)), exist_ok=True)
      shutil.copy2(testutil.REPO_ROOT / rel, os.path.join(self.repo, rel))
    self._write("requirements.txt", "# nothing to install\n")
    self._write("requirements-dev.txt", "-r requirements.txt\n")
    self._write(os.path.join("ps_trainer", "__main__.py"),
                "import os, sys\nprint('stub', os.getpid(), sys.prefix, sys.argv[1:])\n")
    self.env = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONPATH", "PS_TRAINER_PYTHON", "VIRTUAL_ENV")}

  def _write(self, rel, text):
    path = os.path.join(self.repo, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)

  def _launch(self, *args):
    return testutil.start([os.path.join(self.repo, "launch.sh"), *args],
                          os.path.join(self.repo, f"out-{time.monotonic_ns()}.log"),
                          env=self.env, cwd=self.repo)

  def test_concurrent_first_runs_install_once_then_track_requirements(self):
    procs = [self._launch("--task", str(i)) for i in range(3)]
    for p in procs:
      self.addCleanup(p.kill_group)
    outs = []
    for p in procs:
      self.assertEqual(p.wait(timeout=180), 0, p.log_tail())
      outs.append(p.read_log())
    joined = "\n".join(outs)
    self.assertEqual(joined.count("launch.sh: setting up .venv (first run"), 1, joined)
    venv = os.path.join(self.repo, ".venv")
    for p, out in zip(procs, outs):
      # exec: the trainer runs under the launcher's own PID, inside the new .venv.
      self.assertIn(f"stub {p.pid} {venv} ", out)
    self.assertTrue(os.path.exists(os.path.join(venv, ".ps_trainer-stamp")))

    # Up to date: silent. Requirements changed: one line, and the new stamp.
    code, out = _run([os.path.join(self.repo, "launch.sh")], env=self.env, cwd=self.repo)
    self.assertEqual(code, 0, out)
    self.assertRegex(out, r"^stub \d+ [^\n]*\n$")
    self._write("requirements.txt", "# nothing to install, still\n")
    code, out = _run([os.path.join(self.repo, "launch.sh")], env=self.env, cwd=self.repo)
    self.assertEqual(code, 0, out)
    self.assertRegex(out, r"^launch\.sh: updating \.venv to requirements\.txt")

    # A venv without a stamp (as after a killed install) is not trusted: it is built anew.
    os.remove(os.path.join(venv, ".ps_trainer-stamp"))
    code, out = _run([os.path.join(self.repo, "launch.sh")], timeout=180, env=self.env,
                     cwd=self.repo)
    self.assertEqual(code, 0, out)
    self.assertRegex(out, r"^launch\.sh: rebuilding \.venv \(an earlier set-up did not finish")
    self.assertTrue(os.path.exists(os.path.join(venv, ".ps_trainer-stamp")))


if __name__ == "__main__":
  absltest.main()
