"""`launch.sh local`: whole clusters on this machine, stopped at their end, by Ctrl-C or SIGTERM.

These start real processes (a launcher, 1 PS and 2 workers, ~10 s of TensorFlow start-up each
run), so there are few of them, each bounded. Every task of a run has the run's own log_dir in its
command line, which is how leftovers are found.
"""

import json
import os
import re
import signal
import time

from absl.testing import absltest

import bad_input_cases
import testutil

# A generous bound for a loaded 2-core machine: TF start-up alone is ~3 s of CPU per process.
CLUSTER_TIMEOUT_SECS = 300


class LaunchLocalTest(absltest.TestCase):
  """Whole clusters on this machine: 1 PS + 2 workers on the bundled digits data."""

  def _start_local(self, *flags):
    log_dir = testutil.make_tempdir(self)
    proc = testutil.start([testutil.LAUNCH_SH, "local", f"--log_dir={log_dir}", *flags],
                          os.path.join(log_dir, "launch.out"), name="launch.sh local")
    self.addCleanup(proc.kill_group)
    return proc, log_dir

  def _check_finished_run(self, proc, log_dir, sync):
    self.assertEqual(proc.wait(timeout=CLUSTER_TIMEOUT_SECS), 0, proc.log_tail(60))
    testutil.assert_no_leftover(marker=log_dir)
    for name in ("ps-0", "worker-0", "worker-1"):
      self.assertTrue(os.path.exists(os.path.join(log_dir, "logs", f"{name}.log")), name)
    result = testutil.read_result_json(log_dir)
    self.assertEqual(result["sync_replicas"], sync, result)
    self.assertEqual(result["num_workers"], 2, result)
    self.assertEqual(result["num_ps"], 1, result)
    return result

  def test_local_async_runs_isolated_and_a_stop_as_it_ends_leaves_it_finished(self):
    proc, log_dir = self._start_local("--train_steps=200")
    # SIGTERM as soon as the chief says it is done, while it exports: the run is finished, and
    # the launcher's status is the chief's 0, not 143.
    chief_log = os.path.join(log_dir, "logs", "worker-0.log")
    deadline = time.monotonic() + CLUSTER_TIMEOUT_SECS
    while time.monotonic() < deadline and proc.returncode is None:
      if os.path.exists(chief_log) and "done: step " in testutil.read_text(chief_log):
        os.kill(proc.pid, signal.SIGTERM)
        break
      time.sleep(0.05)
    result = self._check_finished_run(proc, log_dir, sync=False)
    self.assertGreaterEqual(result["global_step"], 200, result)
    launcher_out = proc.read_log()
    self.assertIn("launch.sh: got SIGTERM: stopping", launcher_out)
    self.assertIn(f"chief finished; result: {log_dir}/result.json", launcher_out)
    self.assertTrue(os.path.isdir(os.path.join(log_dir, "export")), os.listdir(log_dir))
    self.assertIn("the tasks run in a private network namespace (loopback only)", launcher_out)
    # A task warns about exposure unless loopback is its only interface.
    for name in ("ps-0", "worker-0", "worker-1"):
      self.assertNotIn("warning:", testutil.read_text(os.path.join(log_dir, "logs", f"{name}.log")))

  def test_local_sync_ends_and_its_evaluator_scores_the_final_checkpoint(self):
    # The classic failure: the chief stops and the other replica blocks forever on the token queue.
    proc, log_dir = self._start_local("--train_steps=200", "--sync_replicas", "--evaluator")
    result = self._check_finished_run(proc, log_dir, sync=True)
    self.assertEqual(result["global_step"], 200, result)
    # The evaluator exited by itself (no leftover) after scoring the final checkpoint.
    with open(os.path.join(log_dir, "eval.json"), encoding="utf-8") as f:
      scores = json.load(f)
    self.assertEqual(scores[-1]["global_step"], 200, scores)
    self.assertAlmostEqual(scores[-1]["accuracy"], result["accuracy"], places=6)
    self.assertIn("evaluator: scored the final checkpoint",
                  testutil.read_text(os.path.join(log_dir, "logs", "evaluator-0.log")))

  def test_a_chief_that_refuses_its_log_dir_ends_the_cluster_at_once(self):
    # Found once the chief's graph is built, with the other tasks started: the run never began,
    # so they are stopped now, not after the 10 s given to those of a chief that failed.
    tmp = testutil.make_tempdir(self)
    bad_input_cases.run_of_another_model(self, tmp)  # {tmp}/run: an mlp 8,8's checkpoints.
    log_dir = os.path.join(tmp, "run")
    proc = testutil.start([testutil.LAUNCH_SH, "local", f"--log_dir={log_dir}",
                           "--hidden_units=8,4"], os.path.join(tmp, "launch.out"),
                          name="launch.sh local")
    self.addCleanup(proc.kill_group)
    self.assertEqual(proc.wait(timeout=CLUSTER_TIMEOUT_SECS), 2, proc.log_tail(60))
    out = proc.read_log()
    self.assertIn(f"--log_dir={log_dir} holds checkpoints of another model", out)
    self.assertIn("launch.sh: stopping ps-0 worker-1: the chief ended on bad input (status 2)", out)
    self.assertNotIn("waiting up to", out)
    testutil.assert_no_leftover(marker=log_dir)

  def test_without_namespaces_says_so_in_one_line_and_runs(self):
    fake_bin = testutil.make_tempdir(self)
    with open(os.path.join(fake_bin, "unshare"), "w") as f:
      f.write("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    os.chmod(os.path.join(fake_bin, "unshare"), 0o755)
    log_dir = testutil.make_tempdir(self)
    env = testutil.trainer_env({"PATH": f"{fake_bin}:{os.environ['PATH']}"})
    proc = testutil.start([testutil.LAUNCH_SH, "local", f"--log_dir={log_dir}",
                           "--train_steps=50"], os.path.join(log_dir, "launch.out"), env=env)
    self.addCleanup(proc.kill_group)
    self._check_finished_run(proc, log_dir, sync=False)
    notes = [line for line in proc.read_log().splitlines()
             if "private network namespace" in line]
    self.assertEqual(notes, [
        "launch.sh: cannot isolate the tasks in a private network namespace (unshare: unshare "
        "failed: Operation not permitted); their servers listen on every interface of this "
        "machine without authentication (README: Security; --no_isolate hides this line)"])
    for name in ("ps-0", "worker-0", "worker-1"):
      log = testutil.read_text(os.path.join(log_dir, "logs", f"{name}.log"))
      warnings = [line for line in log.splitlines() if line.startswith("ps_trainer: warning:")]
      self.assertLen(warnings, 1, name)
      self.assertRegex(warnings[0], r"listens on port \d+ of every network interface, without "
                       r"authentication.*trusted network \(README: Security\)")

  def _stop_mid_run(self, send_stop, *flags, made_log_dir=False):
    """Starts a long run, sends a stop once the chief trains; returns (proc, log_dir, tasks).

    made_log_dir: no --log_dir, so the launcher makes runs/local-<time> in a scratch working
    directory (log_dir is then that directory's absolute path).
    """
    flags = ("--train_steps=100000000", "--log_every_steps=20", "--save_checkpoints_steps=100",
             *flags)
    if made_log_dir:
      cwd = testutil.make_tempdir(self)
      proc = testutil.start([testutil.LAUNCH_SH, "local", *flags],
                            os.path.join(cwd, "launch.out"), cwd=cwd, name="launch.sh local")
      self.addCleanup(proc.kill_group)
      runs = os.path.join(cwd, "runs")
      deadline = time.monotonic() + 60
      while not (os.path.isdir(runs) and os.listdir(runs)):
        self.assertLess(time.monotonic(), deadline, f"no runs/local-*\n{proc.log_tail()}")
        time.sleep(0.1)
      log_dir = os.path.join(runs, os.listdir(runs)[0])
      marker = os.path.relpath(log_dir, cwd)  # As the tasks' command lines name it.
    else:
      proc, log_dir = self._start_local(*flags)
      marker = log_dir
    chief_log = os.path.join(log_dir, "logs", "worker-0.log")
    deadline = time.monotonic() + CLUSTER_TIMEOUT_SECS
    while time.monotonic() < deadline and proc.returncode is None:
      if os.path.exists(chief_log) and "chief: step 1" in testutil.read_text(chief_log):
        break
      time.sleep(0.5)
    else:
      self.fail(f"training never reached step 100 ({chief_log})\n{proc.log_tail()}")
    time.sleep(1)  # Past a periodic checkpoint or two.
    tasks = [p for p in testutil.find_processes(marker) if "-m ps_trainer" in testutil.cmdline(p)]
    self.assertLen(tasks, 3)
    namespaces = {os.readlink(f"/proc/{pid}/ns/net") for pid in tasks}
    send_stop(proc)
    start = time.monotonic()
    status = proc.wait(timeout=60)
    # Each task's own last lines too: a slow stop is one task's wait.
    self.assertLess(time.monotonic() - start, 30, "\n".join(
        [proc.log_tail()] + [f"--- {name} ---\n" + testutil.tail(
            os.path.join(log_dir, "logs", f"{name}.log"), 15)
                             for name in ("ps-0", "worker-0", "worker-1")]))
    testutil.assert_no_leftover(tasks, marker=marker, timeout=5)
    return status, log_dir, namespaces, proc

  def _assert_final_checkpoint(self, log_dir, signal_name, shown_dir=None):
    """The chief's last checkpoint is newer than every periodic one (every 100 steps); the chief
    names it in `shown_dir` (default: log_dir), as its --log_dir was given."""
    with open(os.path.join(log_dir, "checkpoint")) as f:
      steps = [int(s) for s in re.findall(r"model\.ckpt-(\d+)", f.read())]
    final = steps[0]  # model_checkpoint_path comes first
    periodic = [s for s in steps[1:] if s != final]
    self.assertTrue(periodic, steps)
    self.assertGreater(final, max(periodic), steps)
    self.assertIn(f"chief: stopped on {signal_name}; final checkpoint "
                  f"{os.path.join(shown_dir or log_dir, f'model.ckpt-{final}')}",
                  testutil.read_text(os.path.join(log_dir, "logs", "worker-0.log")))
    self.assertFalse(os.path.exists(os.path.join(log_dir, "result.json")))  # Not finished.

  def test_ctrl_c_stops_every_task_after_a_final_checkpoint(self):
    # What Ctrl-C in a terminal does: SIGINT to the launcher and every task.
    status, log_dir, namespaces, proc = self._stop_mid_run(
        lambda proc: proc.signal_group(signal.SIGINT), made_log_dir=True)
    self.assertEqual(status, 130)
    made = os.path.join("runs", os.path.basename(log_dir))  # As the launcher names it.
    self._assert_final_checkpoint(log_dir, "SIGINT", shown_dir=made)
    # The chief's lines to its end, where to continue from said once, and the Ctrl-C that reached
    # the tasks twice (from the terminal, then the launcher) taken as one.
    launcher_out = proc.read_log()
    self.assertEqual(launcher_out.count("the same command continues from it"), 1, launcher_out)
    # That command would start a new run in a new runs/local-<time>: the launcher says how not to.
    self.assertIn(
        "launch.sh: to continue this run: ./launch.sh local --train_steps=100000000 "
        f"--log_every_steps=20 --save_checkpoints_steps=100 --log_dir={made} (the same command "
        "without --log_dir starts a new run)\n", launcher_out)
    self.assertIn("chief: got SIGINT: stopping after the current step", launcher_out)
    # A PS stays to serve the last checkpoint of a chief that can only force its exit (20 s, then
    # 10 for its last resorts), and leaves as soon as the workers have.
    self.assertIn("ps 0: got SIGINT: stopping once the workers are done (at most 35 s)",
                  testutil.read_text(os.path.join(log_dir, "logs", "ps-0.log")))
    self.assertNotIn("already stopping", launcher_out)
    self.assertNotIn(os.readlink("/proc/self/ns/net"), namespaces)
    self.assertLen(namespaces, 1)  # One private namespace shared by the tasks.

  def test_sigterm_to_the_launcher_alone_stops_every_task(self):
    # A scheduler stopping the job; here without isolation, as on a machine without namespaces.
    status, log_dir, namespaces, _ = self._stop_mid_run(
        lambda proc: os.kill(proc.pid, signal.SIGTERM), "--sync_replicas", "--no_isolate")
    self.assertEqual(status, 143)
    self._assert_final_checkpoint(log_dir, "SIGTERM")
    self.assertEqual(namespaces, {os.readlink("/proc/self/ns/net")})
    # The tail showing the chief's log ran to the chief's end: where to continue from is said
    # last, and once.
    launcher_lines = testutil.read_text(os.path.join(log_dir, "launch.out")).splitlines()
    self.assertRegex(launcher_lines[-1], r"^chief: stopped on SIGTERM; final checkpoint \S+; the "
                     "same command continues from it$")
    self.assertEqual(sum("continues from it" in line for line in launcher_lines), 1,
                     launcher_lines[-5:])

    # The same log dir again: each task's log keeps the stopped run's lines above the new ones,
    # and the launcher shows only the new run's.
    again = testutil.start([testutil.LAUNCH_SH, "local", f"--log_dir={log_dir}",
                            "--train_steps=1", "--sync_replicas", "--no_isolate"],
                           os.path.join(log_dir, "launch-again.out"), name="launch.sh again")
    self.addCleanup(again.kill_group)
    self.assertEqual(again.wait(timeout=CLUSTER_TIMEOUT_SECS), 0, again.log_tail(60))
    chief_log = testutil.read_text(os.path.join(log_dir, "logs", "worker-0.log"))
    stopped = chief_log.index("chief: stopped on SIGTERM")
    restarted = chief_log.index("----- launch.sh: worker-0 started again, ")
    self.assertLess(stopped, restarted)
    self.assertIn("chief: starting at global step ", chief_log[restarted:])
    self.assertNotIn("stopped on SIGTERM", again.read_log())
    self.assertIn("chief: starting at global step ", again.read_log())


if __name__ == "__main__":
  absltest.main()
