"""Faults of sync runs beyond one task killed and restarted (test_faults.py): with 2 PS, one
killed and restarted (the survivor's sync tokens stand ahead of the restored checkpoint); a step
stuck in TF's repeat hang, which restarts its tasks; and a sync worker lost for good (the chief
names it; SIGTERM to the blocked chief ends its step and the run with a final checkpoint within
seconds, and a chief left alone gives up after --wait_timeout_secs with a last checkpoint).
"""

import os
import re
import signal
import time
from typing import Tuple

from absl.testing import absltest

from faulty_cluster import (CHECKPOINT_STEP, CHIEF, DOWN_SECS, KILL_AT_STEP, RUN_TIMEOUT_SECS,
                            START_TIMEOUT_SECS, WAIT_TIMEOUT_SECS, FaultyCluster,
                            newest_checkpoint_step)
import testutil
import watch


class TwoPsSyncTest(absltest.TestCase):
  """Sync with 2 PS, one killed and restarted: the other, which holds the global step and the
  token queues, keeps tokens ahead of the restored checkpoint; the chief must move the global step
  past them or no step completes (without it, on 2026-11-25, both workers waited until
  --wait_timeout_secs)."""

  def test_losing_one_of_two_ps_in_sync_mode(self):
    log_dir = testutil.make_tempdir(self)
    cluster = FaultyCluster(self, log_dir, [
        "--train_steps=700", "--log_every_steps=50", "--save_checkpoints_secs=1",
        "--sync_replicas", f"--wait_timeout_secs={WAIT_TIMEOUT_SECS}"], num_ps=2)
    run_deadline = time.monotonic() + RUN_TIMEOUT_SECS
    cluster.wait_until(lambda: ((cluster.last_step(CHIEF) or 0) >= KILL_AT_STEP
                                and (newest_checkpoint_step(log_dir) or 0) > 0),
                       f"chief at global step {KILL_AT_STEP} with a checkpoint past step 0",
                       START_TIMEOUT_SECS)
    cluster.kill("ps-1")
    time.sleep(DOWN_SECS)
    cluster.restart("ps-1")
    cluster.wait_all(max(1.0, run_deadline - time.monotonic()))
    result = testutil.read_result_json(log_dir)
    summary = cluster.report(f"result.json: {result}")
    self.assertEqual(result["global_step"], 700, summary)
    self.assertEqual(result["num_ps"], 2, summary)
    self.assertRegex(cluster.text_after_kill(CHIEF),
                     r"chief: restored the newest checkpoint \(global step \d+\) and moved the "
                     r"global step on to \d+", summary)
    testutil.assert_no_leftover(marker=log_dir)


class StuckStepTest(absltest.TestCase):
  """A step stuck while every peer answers (as TF's duplicated RunGraph leaves one after a PS
  restart): the task starts itself again rather than exit, and the job ends."""

  def test_a_stuck_sync_step_restarts_its_tasks_and_the_job_finishes(self):
    log_dir = testutil.make_tempdir(self)
    train_steps, timeout_secs = 600, 15
    cluster = FaultyCluster(self, log_dir, [
        f"--train_steps={train_steps}", "--log_every_steps=50", "--save_checkpoints_secs=1",
        "--sync_replicas", f"--wait_timeout_secs={timeout_secs}"])
    cluster.wait_until(lambda: (cluster.last_step(CHIEF) or 0) >= 100,
                       "chief progress line at global step 100 or later", START_TIMEOUT_SECS)
    # A stopped worker 1 sends no gradient, but the kernel still accepts connections on its
    # port: to the chief, its step hangs while every peer answers.
    worker_1 = cluster.procs["worker-1"]
    worker_1.signal_group(signal.SIGSTOP)
    cluster.note("worker-1 SIGSTOP")
    try:
      cluster.wait_until(lambda: "starting this task again" in cluster.text(CHIEF),
                         "the chief's restart", timeout_secs + 60)
      cluster.wait_until(lambda: cluster.text(CHIEF).count("ps_trainer: worker 0 of 2") == 2,
                         "the restarted chief's start", 60)
    finally:
      worker_1.signal_group(signal.SIGCONT)
    cluster.note("worker-1 SIGCONT")
    cluster.wait_all(RUN_TIMEOUT_SECS)
    _, summary = cluster.assert_finished(log_dir, train_steps, True, ps="ps-0")
    chief = cluster.text(CHIEF)
    self.assertRegex(chief, r"chief: a step waited \d+ s \(--wait_timeout_secs=15\) while every "
                     r"peer answers; starting this task again with the same command \(restart 1 "
                     r"of at most 3\)", summary)
    # Its last resort, then the model the PS still holds: the global step does not go back.
    self.assertIn("chief: wrote a last checkpoint", chief, summary)
    self.assertIn("chief: the PS tasks still hold the model at global step", chief, summary)
    self.assertNotIn("exiting now with status", chief, summary)
    self.assertNotIn("was never used", chief, summary)
    testutil.assert_no_leftover(marker=log_dir)


class LostSyncWorkerTest(absltest.TestCase):
  """A sync worker that dies for good: the chief names it, and still ends with a checkpoint,
  at once on SIGTERM, or after --wait_timeout_secs by itself."""

  def lose_worker_1(self, wait_timeout_secs: int) -> Tuple[FaultyCluster, str, int]:
    """Kills worker 1 once training runs; returns (cluster, log_dir, the chief's last step)
    when the chief's blocked step has named worker 1 as what it waits for."""
    log_dir = testutil.make_tempdir(self)
    cluster = FaultyCluster(self, log_dir, [
        "--train_steps=1000000", "--log_every_steps=50", "--save_checkpoints_secs=3600",
        "--sync_replicas", f"--wait_timeout_secs={wait_timeout_secs}"])
    cluster.wait_until(lambda: (cluster.last_step(CHIEF) or 0) >= 100,
                       "chief progress line at global step 100 or later", START_TIMEOUT_SECS)
    cluster.kill("worker-1")  # Not restarted: without a backup no step can complete.
    last_step = cluster.last_step(CHIEF)
    worker_hosts, = [a for a in cluster.common if a.startswith("--worker_hosts=")]
    address = worker_hosts.partition("=")[2].split(",")[1]
    named = re.compile(
        r"^chief: this step has waited \d+ s for the PS tasks and the other workers' gradients; "
        rf"not answering: worker 1 at {re.escape(address)}; giving up after {wait_timeout_secs} s$",
        re.MULTILINE)
    self.wait_for(cluster, "note naming worker 1",
                  lambda: named.search(cluster.text_after_kill(CHIEF)), 60)
    return cluster, log_dir, last_step

  def wait_for(self, cluster, what, ready, timeout):
    deadline = time.monotonic() + timeout
    while not ready():
      cluster.poll()
      if time.monotonic() >= deadline:
        cluster.fail(f"no {what} within {timeout:.0f} s")
      time.sleep(watch.POLL_SECS)

  def stop_the_ps(self, cluster):
    ps = cluster.procs["ps-0"]
    os.kill(ps.pid, signal.SIGTERM)  # No worker answers any more: it stops at once.
    self.wait_for(cluster, "PS exit after SIGTERM", lambda: ps.returncode is not None, 30)
    self.assertEqual(ps.returncode, 143, cluster.report("PS status"))
    self.assertIn("ps 0: stopped on SIGTERM with 1 of 2 worker(s) done", ps.read_log())
    testutil.assert_no_leftover(marker=cluster.log_dir)

  def test_sigterm_to_the_blocked_chief_ends_its_step_and_writes_a_final_checkpoint(self):
    cluster, log_dir, last_step = self.lose_worker_1(WAIT_TIMEOUT_SECS)
    chief = cluster.procs[CHIEF]
    os.kill(chief.pid, signal.SIGTERM)  # The chief is blocked inside its step.
    signalled = time.monotonic()
    self.wait_for(cluster, "chief exit after SIGTERM", lambda: chief.returncode is not None, 60)
    # A second for the step, a few for the checkpoint and for worker 1's silence: within the
    # 20 s grace period, which a stop that waited for worker 1 would have used up.
    self.assertLess(time.monotonic() - signalled, 20, cluster.report("slow stop"))
    self.assertEqual(chief.returncode, 143, cluster.report("chief status"))
    after = cluster.text_after_kill(CHIEF)
    self.assertIn("chief: stopping, but this step still waits for other workers' gradients; "
                  "ending it without them", after, cluster.report("step not ended"))
    final = re.search(r"chief: stopped on SIGTERM; final checkpoint (\S+);", after)
    self.assertIsNotNone(final, cluster.report("no final checkpoint"))
    self.assertEqual(newest_checkpoint_step(log_dir),
                     int(CHECKPOINT_STEP.search(final.group(1)).group(1)))
    self.assertGreaterEqual(newest_checkpoint_step(log_dir), last_step)
    self.stop_the_ps(cluster)

  def test_a_chief_that_gives_up_on_its_step_writes_a_last_checkpoint(self):
    # 30 s, not less: the flag also bounds the waits of a start on a busy machine.
    cluster, log_dir, last_step = self.lose_worker_1(wait_timeout_secs=30)
    chief = cluster.procs[CHIEF]
    self.wait_for(cluster, "chief exit after --wait_timeout_secs",
                  lambda: chief.returncode is not None, 90)
    self.assertEqual(chief.returncode, 1, cluster.report("chief status"))
    after = cluster.text_after_kill(CHIEF)
    self.assertRegex(after, r"chief: gave up after a step waited \d+ s for the PS tasks and the "
                     r"other workers' gradients.*\(--wait_timeout_secs=30\).*; exiting now with status 1",
                     cluster.report("no forced exit"))
    written = re.search(r"chief: wrote a last checkpoint (\S+)", after)
    self.assertIsNotNone(written, cluster.report("no last checkpoint"))
    self.assertEqual(newest_checkpoint_step(log_dir),
                     int(CHECKPOINT_STEP.search(written.group(1)).group(1)))
    self.assertGreaterEqual(newest_checkpoint_step(log_dir), last_step)
    self.stop_the_ps(cluster)



if __name__ == "__main__":
  absltest.main()
