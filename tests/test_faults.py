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

And more: sync with 2 PS, one of them killed and restarted (the survivor's sync tokens stand ahead
of the restored checkpoint); and a sync worker lost for good (the chief names it; SIGTERM to the
blocked chief ends its step and the run with a final checkpoint within seconds, and a chief left
alone gives up after --wait_timeout_secs with a last checkpoint).

Every wait is bounded; a failure names each task's status (the killed run's too), a timeline of the
run and the tail of each log.
"""

import os
import re
import signal
import subprocess
import time
from typing import Dict, List, Optional, Tuple

from absl.testing import absltest
from absl.testing import parameterized

import testutil
import watch



def tasks(num_ps: int = 1) -> Dict[str, Tuple[str, str]]:
  """{task name: its role flags} of a job with num_ps PS tasks and 2 workers (worker 0: chief)."""
  named = {f"ps-{i}": ("--job_name=ps", f"--task_index={i}") for i in range(num_ps)}
  named.update({f"worker-{i}": ("--job_name=worker", f"--task_index={i}") for i in range(2)})
  return named


CHIEF = "worker-0"
WORKERS = ("worker-0", "worker-1")
# The chief's logged global step at which the victim is killed: past start-up, in steady training.
KILL_AT_STEP = 300
# Between the SIGKILL and the restart.
DOWN_SECS = 2.0
# The whole run, start to the last exit; TF start-up is 3-10 s per process on 2 cores.
RUN_TIMEOUT_SECS = 240
# --wait_timeout_secs of every task: well above the longest wait a restart causes (a step blocked
# from the kill until the victim is back, ~10-30 s), well below RUN_TIMEOUT_SECS, so a job that
# never resumes ends by itself, its tasks saying what they waited for.
WAIT_TIMEOUT_SECS = 90
# From the start to the kill (three TF start-ups and KILL_AT_STEP steps).
START_TIMEOUT_SECS = 120
# TF's benign warnings at each step's clean-up: noise in timelines and tails.
NOISE = ("local_rendezvous.cc",)
# A line naming the global step a worker stands at: progress, a session's start, the chief keeping
# the PS's model.
STEP_LINE = re.compile(
    r"^(?:(?:chief|worker \d+): step (?P<progress>\d+)/\d+"
    r"|(?:chief|worker \d+): starting at global step (?P<start>\d+) of \d+"
    r"|chief: the PS tasks still hold the model at global step (?P<kept>\d+); keeping it)")
CHECKPOINT_PATH = re.compile(r'^model_checkpoint_path:\s*"(?P<path>[^"]*)"', re.MULTILINE)
CHECKPOINT_STEP = re.compile(r"model\.ckpt-(\d+)$")


def newest_checkpoint_step(log_dir: str) -> Optional[int]:
  """The step of <log_dir>/checkpoint's model_checkpoint_path, or None without one."""
  try:
    with open(os.path.join(log_dir, "checkpoint"), encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return None
  path = CHECKPOINT_PATH.search(text)
  step = CHECKPOINT_STEP.search(path.group("path")) if path else None
  return int(step.group(1)) if step else None


class StepLine:
  """A log line naming a global step, where it is in the log."""

  def __init__(self, offset: int, line: str, kind: str, step: int):
    self.offset, self.line, self.kind, self.step = offset, line, kind, step

  def __repr__(self):
    return f"{self.line!r} (byte {self.offset})"


class FaultyCluster(watch.TaskWatch):
  """The tasks of one job, killed and restarted on demand, watched with a timeline."""

  def __init__(self, test: absltest.TestCase, log_dir: str, flags: List[str], num_ps: int = 1):
    super().__init__(test)
    self.log_dir, self.flags = log_dir, list(flags)
    self.tasks = tasks(num_ps)
    hosts = testutil.cluster_hosts(num_ps=num_ps, num_workers=2)
    self.common = [testutil.PYTHON, "-m", "ps_trainer", f"--ps_hosts={hosts['ps_hosts']}",
                   f"--worker_hosts={hosts['worker_hosts']}", f"--log_dir={log_dir}",
                   *self.flags]
    # Runs that were killed: name -> (process, exit status).
    self.killed: Dict[str, Tuple[testutil.Process, Optional[int]]] = {}
    # Each log's size just before the kill: what follows was printed after it.
    self.kill_offsets: Dict[str, int] = {}
    for name in self.tasks:
      self.start(name)
    self.note(f"started {', '.join(self.procs)} with {' '.join(self.flags)}")

  def argv(self, name: str) -> List[str]:
    return self.common + list(self.tasks[name])

  def log_path(self, name: str) -> str:
    return os.path.join(self.log_dir, "logs", f"{name}.log")

  def start(self, name: str, append: bool = False) -> None:
    proc = testutil.start(self.argv(name), self.log_path(name), name=name, append=append)
    self.test.addCleanup(proc.kill_group)
    self.procs[name] = proc

  def raw(self, name: str) -> bytes:
    """name's whole log (every run of it), up to its last complete line."""
    try:
      with open(self.log_path(name), "rb") as f:
        data = f.read()
    except OSError:
      return b""
    return data[:data.rfind(b"\n") + 1]

  def text(self, name: str) -> str:
    return self.raw(name).decode("utf-8", "replace")

  def text_after_kill(self, name: str) -> str:
    """What name's log gained after the kill (the restarted run's, for the victim)."""
    return self.raw(name)[self.kill_offsets[name]:].decode("utf-8", "replace")

  def lines(self, name: str) -> List[str]:
    """name's log without TF's clean-up noise."""
    return [l for l in self.text(name).splitlines() if not any(n in l for n in NOISE)]

  def step_lines(self, name: str) -> List[StepLine]:
    """Every line of name's log that names a global step, in order."""
    out, offset = [], 0
    for raw_line in self.raw(name).splitlines(keepends=True):
      line = raw_line.decode("utf-8", "replace").rstrip("\n")
      match = STEP_LINE.match(line)
      if match:
        kind = next(k for k, v in match.groupdict().items() if v is not None)
        out.append(StepLine(offset, line, kind, int(match.group(kind))))
      offset += len(raw_line)
    return out

  def last_step(self, name: str) -> Optional[int]:
    steps = self.step_lines(name)
    return steps[-1].step if steps else None

  def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
    """`sig` to name's process group; waits (bounded) until it is gone."""
    self.poll()
    proc = self.procs[name]
    # Before the signal: a fast survivor may print its reaction ("lost the session") while the
    # victim is still being reaped (a CI run lost that line when the sizes were taken after).
    for other in self.tasks:
      try:
        self.kill_offsets[other] = os.path.getsize(self.log_path(other))
      except OSError:
        self.kill_offsets[other] = 0
    proc.signal_group(sig)
    # A stopped task may take its grace: 20 s, a PS's 35 (stops.PS_GRACE_SECS).
    bound_secs = 10 if sig == signal.SIGKILL else 40
    deadline = time.monotonic() + bound_secs
    while testutil.group_alive(proc.pid) and time.monotonic() < deadline:
      time.sleep(0.05)
    try:
      status = proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      status = None
    self.killed[name] = (proc, status)
    sig_name = signal.Signals(sig).name
    self.note(f"{name} KILLED ({sig_name} to its process group; exit status {status})")
    if status is None:
      self.fail(f"{name} still runs {bound_secs} s after {sig_name}")

  def restart(self, name: str) -> None:
    """Starts name again with the same command, its output appended to its log."""
    with open(self.log_path(name), "ab") as log:
      # A run killed mid-line must not glue its last words to the new run's first.
      log.write(b"\n")
    self._lines_seen[name] = len(self.lines(name))
    self.exit_secs.pop(name, None)
    self.start(name, append=True)
    self.note(f"{name} RESTARTED with the same command")

  def report(self, headline: str, tail_lines: int = 30) -> str:
    """headline, each task's state, the timeline, and the tail of each log."""
    self.poll()
    out = [headline, "tasks:"]
    for name, (proc, status) in self.killed.items():
      out.append(f"  {name} (first run, pid {proc.pid}): killed, exit status {status}")
    for name, proc in self.procs.items():
      rc = proc.returncode
      state = (f"exited {rc} at {self.exit_secs.get(name, self.secs()):.1f} s" if rc is not None
               else f"STILL RUNNING at {self.secs():.1f} s")
      run = "restarted run" if name in self.killed else "run"
      out.append(f"  {name} ({run}, pid {proc.pid}): {state}")
    out.append(f"newest checkpoint now: step {newest_checkpoint_step(self.log_dir)}")
    out.append(self.timeline())
    for name in self.procs if tail_lines > 0 else ():
      lines = self.lines(name)[-tail_lines:]
      out.append(f"--- last {len(lines)} lines of {self.log_path(name)} (without {NOISE} "
                 "noise) ---")
      out += [f"  {l}" for l in lines]
    return "\n".join(out)

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
