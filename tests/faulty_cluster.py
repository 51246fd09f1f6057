"""A 1 PS + 2 worker job (or 2 PS + 2 workers) on 127.0.0.1 for the fault tests, each task started
as a user starts it (`python -m ps_trainer` with its role flags, in its own process group, logging
to <log_dir>/logs/<task>.log), killed or stopped and started again with the same command on demand,
and watched with a timeline (watch.py). The bounds every fault test waits within are here too.
"""

import os
import re
import signal
import subprocess
import time
from typing import Dict, List, Optional, Tuple

from absl.testing import absltest

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
