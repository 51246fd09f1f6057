"""Fault injection: kill -9 one task of a running job, restart it with the same command.

A 1 PS + 2 worker job on 127.0.0.1, each task started as a user starts it (`python -m ps_trainer`
with its role flags, in its own process group, logging to <log_dir>/logs/<task>.log). Once the
chief has logged global step KILL_AT_STEP and written a checkpoint past step 0, the test sends
SIGKILL to one task's process group, notes the newest checkpoint, waits DOWN_SECS and starts the
task again with exactly the same command (its log grows on). For each victim (worker 1, the chief,
the PS), async and sync:

- every task exits 0 in the end, and result.json reports at least --train_steps (exactly, in sync);
- the global step never goes back below the newest checkpoint at the kill: every step a worker
  prints after the kill is at or above it; after a worker or chief kill, each worker's printed
  steps never decrease over its whole log (restarts included); after a PS kill, they go back at
  most to that checkpoint and then never decrease again;
- the restart happened as the README promises: a restarted worker 1 starts at the job's global step
  (at or past where it stood, not at 0 or a checkpoint) while the chief goes on in the session it
  had; a restarted chief keeps the model the PS still holds, at or past where it stood; after a PS
  restart both workers say they lost their session and start new ones, the chief's at the newest
  checkpoint (restored, not fresh weights, not an older checkpoint).

In sync mode every step needs both workers and the PS, so the job stands still while the victim is
down; in async mode the surviving worker trains on, so --train_steps leaves it enough work to still
be training when the victim is back. After a chief kill in async mode worker 1 may finish the whole
job alone; the restarted chief must still exit 0 and write result.json.

And a sync worker 1 stopped with SIGTERM rather than killed: it says it is done as it leaves, and
once started again it must count as not done (the PS waits for it, and it tells the PS at its end).

The faults of sync runs beyond a kill and restart of one task are in test_sync_faults.py, and
the job, its tasks and their watch in faulty_cluster.py.

Every wait is bounded; a failure names each task's status (the killed run's too), a timeline of the
run and the tail of each log.
"""

import os
import signal
import time
from typing import Dict, Optional

from absl.testing import absltest
from absl.testing import parameterized

from faulty_cluster import (CHIEF, DOWN_SECS, KILL_AT_STEP, RUN_TIMEOUT_SECS, START_TIMEOUT_SECS,
                            WAIT_TIMEOUT_SECS, WORKERS, FaultyCluster, newest_checkpoint_step)
import testutil
import watch


# (name, victim, sync, --train_steps). Async rates are ~100-800 global steps/s per worker (the
# same code on the same 2 cores, on different days), sync ~30-80 global steps/s for the job. In
# async mode the survivor of a worker or chief kill trains on alone while the victim is down
# (DOWN_SECS plus its TF start-up, ~5-12 s: up to ~5,000 steps on a fast day, when 4,000 once
# ended before the chief was back), hence the long runs; in sync mode, and after a PS kill,
# nothing moves until the victim is back.
CASES = (
    ("worker1_async", "worker-1", False, 12000),
    ("chief_async", "worker-0", False, 12000),
    ("ps_async", "ps-0", False, 1200),
    ("worker1_sync", "worker-1", True, 600),
    ("chief_sync", "worker-0", True, 600),
    ("ps_sync", "ps-0", True, 600),
)


class FaultsTest(parameterized.TestCase):

  @parameterized.named_parameters(*CASES)
  def test_kill9_and_restart(self, victim: str, sync: bool, train_steps: int):
    self.kill_and_restart(victim, sync, train_steps, signal.SIGKILL)

  def test_a_sync_worker_stopped_and_started_again(self):
    """A stopped worker says it is done; started again it trains, so it is not done any more:
    the PS must wait for it, and it must be able to tell the PS when it finishes."""
    cluster = self.kill_and_restart("worker-1", True, 600, signal.SIGTERM)
    self.assertEqual(cluster.killed["worker-1"][1], 143, cluster.report("worker 1's stop"))
    ps_after = cluster.text_after_kill("ps-0")
    self.assertIn("ps 0: 1 of 2 worker(s) done; waiting for worker 0", ps_after,
                  cluster.report("the PS did not count the stopped worker 1 as done"))
    self.assertIn("ps 0: 0 of 2 worker(s) done; waiting for worker 0", ps_after,
                  cluster.report("the PS still counted the restarted worker 1 as done"))
    self.assertNotIn("could not tell", cluster.text_after_kill("worker-1"),
                     cluster.report("worker 1 could not say it was done at its end"))
    self.assertRegex(cluster.text("worker-1"), r"\nworker 1: stopped on SIGTERM at global step "
                     r"\d+; the same command rejoins the run\n",
                     cluster.report("worker 1 did not say it stopped"))

  def kill_and_restart(self, victim: str, sync: bool, train_steps: int,
                       sig: int) -> FaultyCluster:
    """Kills `victim` with `sig` mid-run, restarts it and checks the job."""
    log_dir = testutil.make_tempdir(self)
    flags = [f"--train_steps={train_steps}", "--log_every_steps=50",
             "--save_checkpoints_secs=1", f"--wait_timeout_secs={WAIT_TIMEOUT_SECS}"]
    flags += ["--sync_replicas"] if sync else []
    cluster = FaultyCluster(self, log_dir, flags)
    run_deadline = time.monotonic() + RUN_TIMEOUT_SECS

    def ready_to_kill():
      return ((cluster.last_step(CHIEF) or 0) >= KILL_AT_STEP
              and (newest_checkpoint_step(log_dir) or 0) > 0)

    cluster.wait_until(ready_to_kill, f"chief progress line at global step {KILL_AT_STEP} or "
                       "later with a checkpoint past step 0", START_TIMEOUT_SECS)
    last_before = {name: cluster.last_step(name) for name in WORKERS}
    cluster.kill(victim, sig)
    checkpoint_at_kill = newest_checkpoint_step(log_dir)
    cluster.note(f"newest checkpoint at the kill: step {checkpoint_at_kill}; last logged global "
                 f"steps: chief {last_before[CHIEF]}, worker 1 {last_before['worker-1']}")
    kill_end = time.monotonic() + DOWN_SECS
    while time.monotonic() < kill_end:
      cluster.poll()
      time.sleep(watch.POLL_SECS)
    checkpoint_at_restart = newest_checkpoint_step(log_dir)
    cluster.restart(victim)
    cluster.wait_all(max(1.0, run_deadline - time.monotonic()))

    if not os.path.exists(os.path.join(log_dir, "result.json")):
      cluster.fail(f"every task exited 0 but there is no result.json in {log_dir}: "
                   f"{sorted(os.listdir(log_dir))}")
    result, summary = cluster.assert_finished(log_dir, train_steps, sync, ps="ps-0")

    self.check_steps(cluster, victim, checkpoint_at_kill, checkpoint_at_restart, summary)
    self.check_restart(cluster, victim, sync, train_steps, last_before, checkpoint_at_kill,
                       checkpoint_at_restart, summary)
    testutil.assert_no_leftover(marker=log_dir)
    # Shown by `pytest -rP` and in Bazel's test.log: how long each phase took.
    print(f"{self.id()}: global step {result['global_step']}, test accuracy "
          f"{result['accuracy']:.4f}, checkpoint at the kill {checkpoint_at_kill}\n"
          f"{cluster.timeline()}")
    return cluster

  def check_steps(self, cluster: FaultyCluster, victim: str, checkpoint_at_kill: int,
                  checkpoint_at_restart: Optional[int], summary: str) -> None:
    """The global step never goes back below the newest checkpoint at the kill.

    A step in flight at the kill may be logged past the log's offset and still below that
    checkpoint, which is read once the victim is gone: a progress line names the global step
    its step read, before that step's update and the checkpoint its end may save (a CI run: the
    chief's "step 548" past the offset, checkpoint 549). A step behind by the updates of one
    step of each worker is that, not a rollback, which goes back a checkpoint (1 s of steps).
    """
    in_flight = len(WORKERS) + 1
    for name in WORKERS:
      lines = cluster.step_lines(name)
      after = [l for l in lines if l.offset >= cluster.kill_offsets[name]]
      below = [l for l in after if l.step < checkpoint_at_kill - in_flight]
      self.assertEmpty(below, f"{name} printed global steps below the newest checkpoint at the "
                       f"kill (step {checkpoint_at_kill}) after the kill: {below}\n{summary}")
      if victim == "ps-0":
        # The PS's restart loses the model; the chief restores the newest checkpoint, so the
        # step may go back where the new session starts. Not at the kill offset: the log sizes
        # are taken before the signal, and a step that finished in between is logged after it
        # (a CI run: "step 399" logged past the offset, then "starting at global step 182").
        restart = next((i for i, l in enumerate(lines)
                        if l.offset >= cluster.kill_offsets[name] and l.kind == "start"),
                       len(lines))
        pieces = [lines[:restart], lines[restart:]]
      else:
        pieces = [lines]
      for piece in pieces:
        back = [(a, b) for a, b in zip(piece, piece[1:]) if b.step < a.step]
        self.assertEmpty(back, f"{name}'s global step went back: {back}\n{summary}")
    if victim == "ps-0":
      self.assertGreaterEqual(checkpoint_at_restart, checkpoint_at_kill, summary)

  def check_restart(self, cluster: FaultyCluster, victim: str, sync: bool, train_steps: int,
                    last_before: Dict[str, Optional[int]], checkpoint_at_kill: int,
                    checkpoint_at_restart: int, summary: str) -> None:
    """How each task took up the job again, as the README promises."""
    after = {name: [l for l in cluster.step_lines(name) if l.offset >= cluster.kill_offsets[name]]
             for name in WORKERS}
    if victim == "worker-1":
      starts = [l for l in after["worker-1"] if l.kind == "start"]
      self.assertNotEmpty(starts, f"the restarted worker 1 never said at which global step it "
                          f"starts\n{summary}")
      # It joins the running job where it stands (at or past where it was), not at 0.
      self.assertGreaterEqual(starts[0].step, last_before["worker-1"] or 0, summary)
      self.assertLess(starts[0].step, train_steps, f"worker 1 came back after the job had "
                      f"ended: raise --train_steps above {train_steps} so the test covers a "
                      f"restart mid-run\n{summary}")
      self.assertTrue(any(l.kind == "progress" for l in after["worker-1"]),
                      f"the restarted worker 1 logged no progress\n{summary}")
      # The chief trained on (async) or waited (sync) in the session it had.
      self.assertEmpty([l for l in after[CHIEF] if l.kind != "progress"],
                       f"the chief started a new session when worker 1 died\n{summary}")
    elif victim == CHIEF:
      kept = [l for l in after[CHIEF] if l.kind == "kept"]
      self.assertNotEmpty(kept, f"the restarted chief did not say it keeps the model the PS "
                          f"still holds\n{summary}")
      self.assertGreaterEqual(kept[0].step, max(last_before[CHIEF], checkpoint_at_kill),
                              summary)
      self.assertLess(kept[0].step, train_steps, f"the chief came back after the job had "
                      f"ended: raise --train_steps above {train_steps} so the test covers a "
                      f"restart mid-run\n{summary}")
      self.assertTrue(any(l.kind == "start" for l in after[CHIEF]), summary)
      if sync:
        # Worker 1 stood still without the chief's tokens, and trained on once it was back.
        self.assertTrue(any(l.kind == "progress" and l.step > kept[0].step
                            for l in after["worker-1"]),
                        f"worker 1 logged no progress after the chief's restart\n{summary}")
    else:
      for name in WORKERS:
        self.assertIn("lost the session", cluster.text_after_kill(name),
                      f"{name} did not say it lost its session to the PS\n{summary}")
        starts = [l for l in after[name] if l.kind == "start"]
        self.assertNotEmpty(starts, f"{name} never started a new session after the PS's "
                            f"restart\n{summary}")
        self.assertGreater(starts[0].step, 0, summary)
      self.assertEmpty([l for l in after[CHIEF] if l.kind == "kept"],
                       f"the chief kept a model after the PS's restart\n{summary}")
      # It restored the newest checkpoint (worker 1 may have trained a few steps since).
      chief_start = next(l for l in after[CHIEF] if l.kind == "start")
      self.assertGreaterEqual(chief_start.step, checkpoint_at_restart, summary)
      self.assertEqual(cluster.procs["ps-0"].read_log().count("ps 0: serving on"), 2, summary)


if __name__ == "__main__":
  absltest.main()
