"""`./launch.sh bench` and `./launch.sh compare` as a user runs them (multi-process).

Short runs: the figures here are not the performance targets (those need
the full bench, docs/performance.md); these tests check that each command
runs every setup it promises and writes what it promises.
"""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from unittest import mock

from absl.testing import absltest

from ps_trainer.experiments import bench
from ps_trainer.experiments import runs
from ps_trainer.experiments import trainer_args
from ps_trainer.settings import host_ports
import testutil

RUN_TIMEOUT_SECS = 420


def _run(args, timeout=RUN_TIMEOUT_SECS):
  proc = subprocess.run(
      [testutil.LAUNCH_SH, *args], stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
      env=testutil.trainer_env(), cwd=str(testutil.REPO_ROOT), check=False)
  return (proc.returncode, proc.stdout.decode("utf-8", "replace"),
          proc.stderr.decode("utf-8", "replace"))


class BadInputTest(absltest.TestCase):

  def test_compare_needs_an_out_dir(self):
    code, _, err = _run(["compare", "--no_isolate", "--train_steps=10"], 60)
    self.assertEqual(code, 2)
    self.assertEqual(err.strip().splitlines(), [
        "compare: error: --out_dir is required: the directory for "
        "comparison.md/.json/.png and both runs"])

  def test_bench_refuses_what_is_not_a_trainer_flag_and_what_it_sets(self):
    for arg, says in (("--no_such_flag=1", "--no_such_flag=1: not a trainer "
                                           "flag (--name=value)"),
                      ("--sync_replicas", "--sync_replicas: set for each run "
                                          "by this command itself"),
                      ("--batch_size=0", "flag --batch_size=0: must be >= 1"),
                      ("--batch_size=abc", "flag --batch_size=abc: expected a whole number"),
                      # Found by the runs' launcher: one line, but after a cluster's start.
                      ("--dataset=mnist", "--data_dir is not set; --dataset=mnist needs"),
                      # absl's logging has a --log_dir too, which took it unsaid.
                      ("--log_dir=/tmp/elsewhere", "--log_dir=/tmp/elsewhere: set for each "
                                                   "run by this command itself")):
      code, _, err = _run(["bench", "--no_isolate", arg], 60)
      self.assertEqual(code, 2, err)
      lines = err.strip().splitlines()
      self.assertLen(lines, 1, err)
      self.assertStartsWith(lines[0], "bench: error: ")
      self.assertIn(says, lines[0])


  def test_their_own_flags_and_output_dirs_are_one_line_each(self):
    a_file = os.path.join(testutil.make_tempdir(self), "file")
    with open(a_file, "w") as f:
      f.write("not a directory\n")
    out = os.path.join(testutil.make_tempdir(self), "out")
    earlier = testutil.make_tempdir(self)  # Holds runs of an earlier bench and compare.
    for name in ("async", "local-0", "cluster-0", "notes"):
      os.mkdir(os.path.join(earlier, name))
    for args, says in (
        (["bench", f"--bench_dir={earlier}"],
         f"bench: error: --bench_dir={earlier}: holds the runs of an earlier one (cluster-0, "
         "local-0), which would be continued or reported again, not run afresh; pass a new "
         "--bench_dir, or remove them"),
        (["compare", f"--out_dir={earlier}"],
         f"compare: error: --out_dir={earlier}: holds the runs of an earlier one (async), "),
        (["bench", "--rounds=0"], "bench: error: flag --rounds=0: 0 is not a positive integer"),
        (["bench", "--rounds=abc"], "bench: error: flag --rounds=abc: expected a whole number"),
        (["bench", f"--bench_dir={a_file}"],
         f"bench: error: --bench_dir={a_file}: is a file, not a directory"),
        (["compare", f"--out_dir={out}", "--num_workers=0"],
         "compare: error: flag --num_workers=0: 0 is not a positive integer"),
        (["compare", f"--out_dir={out}", "--target_loss=abc"],
         "compare: error: flag --target_loss=abc: expected a number"),
        (["compare", f"--out_dir={out}", "--target_loss=-1"],
         "compare: error: flag --target_loss=-1.0: must be > 0"),
        (["compare", f"--out_dir={a_file}"],
         f"compare: error: --out_dir={a_file}: is a file, not a directory")):
      code, _, err = _run([args[0], "--no_isolate", *args[1:], "--train_steps=10"], 60)
      self.assertEqual(code, 2, (args, err))
      lines = err.strip().splitlines()
      self.assertLen(lines, 1, (args, err))
      self.assertStartsWith(lines[0], says)
    self.assertFalse(os.path.exists(out), "a refused compare started writing")

  def test_a_mistake_is_the_only_line_when_the_runs_are_isolated_too(self):
    # Isolated (the default), launch.sh leaves its note on the private network
    # namespace for the command to print after its checks.
    tmp = testutil.make_tempdir(self)
    out, bench_dir, missing = (os.path.join(tmp, name) for name in ("out", "bench", "no.npz"))
    for args, says in (
        (["bench", f"--bench_dir={bench_dir}", "--no_such_flag=1"],
         "bench: error: --no_such_flag=1: not a trainer flag"),
        (["compare", f"--out_dir={out}", "--batch_size=0"],
         "compare: error: flag --batch_size=0: must be >= 1"),
        # Read as the trainer reads it, before any run (whose check would name it too, but
        # after the command's first lines and with the run's directory made).
        (["bench", f"--bench_dir={bench_dir}", "--dataset=npz", f"--data_path={missing}"],
         f"bench: error: --data_path={missing}: no such file")):
      code, _, err = _run(args, 60)
      self.assertEqual(code, 2, (args, err))
      # Where namespaces cannot be made, launch.sh's warning about that comes first.
      lines = [line for line in err.strip().splitlines()
               if not line.startswith("launch.sh: cannot isolate")]
      self.assertLen(lines, 1, (args, err))
      self.assertStartsWith(lines[0], says)
      self.assertFalse(os.path.exists(bench_dir) or os.path.exists(out), args)


class LauncherNoteTest(absltest.TestCase):

  def test_it_is_said_once_and_not_passed_on_to_the_runs(self):
    with mock.patch.dict(os.environ, {runs.LAUNCHER_NOTE_ENV: "launch.sh: a note"}), \
        mock.patch("sys.stderr", new_callable=io.StringIO) as err:
      runs.say_launcher_note()
      runs.say_launcher_note()
      self.assertNotIn(runs.LAUNCHER_NOTE_ENV, os.environ)
    self.assertEqual(err.getvalue(), "launch.sh: a note\n")


class TrainerArgsTest(absltest.TestCase):

  def test_boolean_flags_take_the_forms_the_trainer_takes(self):
    values = trainer_args.parse(
        ["--nofactored_gradients", "--pin_cpus", "--record_steps=false",
         "--batch_size=32"], owned=set(), defaults={"batch_size": "64"})
    self.assertEqual(values, {"factored_gradients": "false",
                              "pin_cpus": "true", "record_steps": "false",
                              "batch_size": "32"})

  def test_no_before_a_flag_that_is_not_boolean_is_refused(self):
    with self.assertRaisesRegex(trainer_args.ArgsError,
                                "^--nobatch_size: not a trainer flag"):
      trainer_args.parse(["--nobatch_size"], owned=set(), defaults={})


class FinishedRunTest(absltest.TestCase):

  def test_a_run_whose_chief_timed_no_steps_fails_with_one_line(self):
    # Its chief started again as the others ended the run: a bench or compare has no speed
    # for it, and a median of such a 0 would lie.
    log_dir = testutil.make_tempdir(self)
    with open(os.path.join(log_dir, "result.json"), "w") as f:
      json.dump({"global_step": 100, "steps_per_sec": None}, f)
    log_path = os.path.join(log_dir, "launch.log")
    with open(log_path, "w") as f:
      f.write("chief: starting at global step 100 of 100\n")
    with self.assertRaises(runs.RunFailed) as failed:
      runs._finish("cluster", log_dir, log_path, 0, 0.0)  # pylint: disable=protected-access
    self.assertEqual(str(failed.exception),
                     "cluster: its chief timed fewer than two steps (a --train_steps too "
                     "small, or it was started again as the run ended), so the run has no "
                     f"speed; log {log_path}: chief: starting at global step 100 of 100")


def _wait_for_file(path, secs=60):
  deadline = time.monotonic() + secs
  while not os.path.exists(path):
    if time.monotonic() > deadline:
      raise AssertionError(f"{path} did not appear within {secs} s")
    time.sleep(0.1)


class StopTest(absltest.TestCase):
  """A stopped bench or compare stops the run it is on: the runs have sessions of their
  own, which a terminal's Ctrl-C does not reach, and the plain pattern's PS does not end by
  itself while the bench lives."""

  def _start(self, args, out_dir):
    proc = subprocess.Popen(
        testutil.with_default_sigint([testutil.LAUNCH_SH, *args]),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=testutil.trainer_env(), cwd=str(testutil.REPO_ROOT))
    self.addCleanup(testutil.kill_processes, out_dir)
    return proc

  def _assert_stopped(self, proc, signum, run_label, command, out_dir):
    _, err = proc.communicate(timeout=90)
    err = err.decode()
    name = signal.Signals(signum).name
    self.assertEqual(proc.returncode, 128 + signum, err)
    self.assertEqual(err.strip().splitlines()[-2:], [
        f"{run_label}: stopping it ({name})",
        f"{command}: stopped on {name}; the runs so far are in {out_dir}"])
    self.assertNotIn("Traceback", err)
    self.assertEqual(testutil.find_processes(out_dir), [])

  def test_a_compare_stopped_with_ctrl_c_ends_its_training_cluster(self):
    out_dir = os.path.join(testutil.make_tempdir(self), "compare")
    proc = self._start(["compare", "--no_isolate", f"--out_dir={out_dir}", "--num_workers=1",
                        "--dataset=synthetic", "--train_steps=1000000", "--log_every_steps=20"],
                       out_dir)
    chief_log = os.path.join(out_dir, "async", "logs", "worker-0.log")
    _wait_for_file(chief_log, secs=120)
    deadline = time.monotonic() + 120
    while "chief: step " not in open(chief_log, errors="replace").read():
      self.assertLess(time.monotonic(), deadline, "the chief never trained")
      time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    self._assert_stopped(proc, signal.SIGINT, "async", "compare", out_dir)

  def test_a_bench_stopped_with_sigterm_ends_its_run(self):
    bench_dir = os.path.join(testutil.make_tempdir(self), "bench")
    proc = self._start(["bench", "--rounds=1", "--no_isolate", "--train_steps=1000000",
                        f"--bench_dir={bench_dir}"], bench_dir)
    _wait_for_file(os.path.join(bench_dir, "local-0", "local.log"))
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    self._assert_stopped(proc, signal.SIGTERM, "local (1 process)", "bench", bench_dir)

  def test_a_stop_ends_the_plain_patterns_ps_and_worker(self):
    log_dir = testutil.make_tempdir(self)
    self.addCleanup(setattr, runs, "_stop_signal", None)
    self.addCleanup(testutil.kill_processes, log_dir)

    def stop_once_both_started():
      try:
        _wait_for_file(os.path.join(log_dir, "worker-0.log"))
        time.sleep(1)
      finally:  # Stop in any case: the run would go on for minutes.
        # What the signal handler of stop_on_signals does (tested through the commands above).
        runs._stop_signal = signal.SIGTERM  # pylint: disable=protected-access

    threading.Thread(target=stop_once_both_started, daemon=True).start()
    with self.assertRaises(runs.Stopped) as stopped:
      runs.run_plain_tf1_cluster(
          "plain", bench.plain_tf1_args(dict(bench.REFERENCE_WORK, train_steps=1000000)),
          log_dir)
    self.assertEqual(stopped.exception.signum, signal.SIGTERM)
    self.assertTrue(os.path.exists(os.path.join(log_dir, "worker-0.log")))
    self.assertEqual(testutil.find_processes(log_dir), [])

  def test_the_plain_patterns_ps_ends_once_what_started_it_is_gone(self):
    # A bench killed with SIGKILL cannot stop its runs. The trainer's end by themselves; the plain
    # pattern's PS would serve nobody forever.
    log_dir = testutil.make_tempdir(self)
    ps_port, starter = self._start_plain_ps(log_dir)
    deadline = time.monotonic() + 60
    while True:  # Until the PS serves.
      try:
        socket.create_connection(("127.0.0.1", ps_port), timeout=1).close()
        break
      except OSError:
        self.assertLess(time.monotonic(), deadline, "the plain PS did not start serving")
        time.sleep(0.2)
    self.assertLen([pid for pid in testutil.find_processes(log_dir) if pid != starter.pid], 1)
    starter.kill()
    starter.wait()
    testutil.assert_no_leftover(marker=log_dir, timeout=10)

  def test_the_plain_patterns_ps_ends_when_what_started_it_dies_as_it_starts(self):
    # Killed while the PS still imports TensorFlow: the PS must know its starter from before.
    log_dir = testutil.make_tempdir(self)
    _, starter = self._start_plain_ps(log_dir)
    time.sleep(1)  # Importing TensorFlow takes ~3 s.
    starter.kill()
    starter.wait()
    testutil.assert_no_leftover(marker=log_dir, timeout=60)

  def test_the_plain_patterns_ps_ends_when_what_named_itself_its_starter_was_gone_before(self):
    # The bench names itself (--started_by): a bench killed before the PS's interpreter ran its
    # first line, which no parent read at start can see, still ends it. Here the starter exits
    # as soon as it has forked the PS.
    log_dir = testutil.make_tempdir(self)
    for program in ("plain_tf1", "bare_step"):  # The bench's bare step shares the lifecycle.
      with self.subTest(program=program):
        program_dir = os.path.join(log_dir, program)
        os.makedirs(program_dir)
        _, starter = self._start_plain_ps(program_dir, then="exit 0",
                                          started_by="--started_by=$$", program=program)
        starter.wait()
        testutil.assert_no_leftover(marker=program_dir, timeout=60)
        with open(os.path.join(program_dir, "ps.log")) as f:
          self.assertRegex(f.read(), rf"{program}: ps 0: the process that started it \(pid "
                                     rf"{starter.pid}\) is gone; ending")

  def _start_plain_ps(self, log_dir, then='exec sleep 600', started_by="", program="plain_tf1"):
    """The plain pattern's PS (or the bare step's, whose lifecycle it is), started by a shell
    that then does `then` (by default, waits as sleep in its place); with `started_by`, the PS
    gets that flag (the shell's pid is $$). The PS's output goes to <log_dir>/ps.log; whatever
    names log_dir is killed as the test ends."""
    self.addCleanup(testutil.kill_processes, log_dir)
    ps_port, worker_port = host_ports.free_ports(2)
    with open(os.path.join(log_dir, "ps.log"), "w") as log:
      starter = subprocess.Popen(
          ["sh", "-c", f'"$@" {started_by} & {then}', "sh", sys.executable, "-m",
           f"ps_trainer.experiments.{program}", f"--ps_hosts=127.0.0.1:{ps_port}",
           f"--worker_hosts=127.0.0.1:{worker_port}", "--job_name=ps", "--task_index=0",
           f"--log_dir={log_dir}"],
          stdout=log, stderr=subprocess.STDOUT, env=testutil.trainer_env(),
          cwd=str(testutil.REPO_ROOT))
    return ps_port, starter


class BenchTest(absltest.TestCase):

  def test_one_round_runs_every_setup_and_reports_the_split(self):
    bench_dir = testutil.make_tempdir(self)
    code, out, err = _run(["bench", "--rounds=1", "--json",
                           f"--bench_dir={bench_dir}", "--train_steps=300"])
    self.assertEqual(code, 0, err[-3000:])
    self.assertLessEqual(err.count("private network namespace (loopback only)"), 1, err[-3000:])
    figures = json.loads(out)
    by_label = {run["label"]: run for run in figures["runs"]}
    self.assertEqual(set(by_label), {
        "local (1 process)", "1 PS + 1 worker", "plain TF1, 1 PS + 1 worker",
        "bare step, 1 PS + 1 worker", "bare step, local (1 process)", "1 PS + 2 workers, async",
        "1 PS + 2 workers, sync"})
    for run in figures["runs"]:
      self.assertGreater(run["steps_per_sec"], 0, run["label"])
      # Each run's window, the plain pattern's too: the short-window warning needs them.
      self.assertGreater(run["measured_secs_each"][0], 0, run["label"])
    self.assertEqual(by_label["local (1 process)"]["vs_local"], 1.0)
    self.assertGreater(figures["cluster_vs_local"], 0)
    self.assertGreater(figures["cluster_vs_plain_tf1"], 0)
    self.assertGreater(figures["cluster_vs_bare_step"], 0)
    self.assertGreater(figures["bare_step_vs_bare_local"], 0)
    # The reference MLP's variables cross in one packed tensor, its gradients in one more (the
    # two kernels' as factors), to the byte what `./launch.sh plan` says; a local step moves
    # nothing.
    split = by_label["1 PS + 1 worker"]["split"]
    self.assertEqual((split["bytes_to_worker"], split["bytes_to_ps"]), (1_077_376, 409_664))
    self.assertGreater(split["wall_ms"], split["total_ms"])
    self.assertEqual(by_label["local (1 process)"]["split"]["bytes_to_worker"],
                     0)
    with open(os.path.join(bench_dir, "bench.json")) as f:
      self.assertEqual(json.load(f), figures)
    for name in ("cluster-0", "local-0", "sync-2"):
      self.assertTrue(os.path.exists(os.path.join(bench_dir, name,
                                                  "result.json")), name)
    self.assertTrue(os.path.exists(os.path.join(bench_dir, "cluster-0",
                                                "traces", "chief.json")))
    # The plain pattern's one worker and the bare step's stop at --train_steps, and say so; each
    # directory holds the program its row names.
    for name, program in (("plain-0", "plain_tf1"), ("bare-0", "bare_step"),
                          ("bare-local-0", "bare_step")):
      with open(os.path.join(bench_dir, name, "result.json")) as f:
        result = json.load(f)
      self.assertEqual((result["program"], result["global_step"]), (program, 300), name)


class CompareTest(absltest.TestCase):

  def test_writes_the_table_the_curves_and_the_staleness(self):
    out_dir = testutil.make_tempdir(self)
    code, out, err = _run(["compare", f"--out_dir={out_dir}",
                           "--train_steps=300", "--log_every_steps=100"])
    self.assertEqual(code, 0, err[-3000:])
    with open(os.path.join(out_dir, "comparison.json")) as f:
      figures = json.load(f)
    modes = {m["mode"]: m for m in figures["modes"]}
    self.assertEqual(set(modes), {"async", "sync"})
    for mode in modes.values():
      self.assertGreaterEqual(mode["global_step"], 300)
      self.assertGreater(mode["test_accuracy"], 0.8)
      self.assertEqual(mode["test_examples"], 360)
      self.assertIsNotNone(mode["to_target"])  # Both reach the default target.
    # Both workers record every step of theirs: together at least 300.
    stale = modes["async"]["staleness"]
    self.assertGreaterEqual(stale["steps"], 300)
    self.assertEqual(sum(stale["counts"].values()), stale["steps"])
    self.assertIsNone(modes["sync"]["staleness"])
    with open(os.path.join(out_dir, "comparison.md")) as f:
      text = f.read()
    self.assertIn("| async |", text)
    self.assertIn("| sync |", text)
    self.assertIn("## Gradient staleness (async)", text)
    self.assertIn("Test accuracy: async and sync differ by", text)
    self.assertIn(text.strip().splitlines()[0], out)
    with open(os.path.join(out_dir, "comparison.png"), "rb") as f:
      self.assertEqual(f.read(4), b"\x89PNG")


if __name__ == "__main__":
  absltest.main()
