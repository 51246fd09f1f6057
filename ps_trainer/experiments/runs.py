"""Runs training jobs as a user would, for the bench and compare: each in fresh
processes, each into a log directory of its own, read back from result.json.

No TensorFlow here: the runs import it, this module only starts and watches
them.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import List, Optional

from ps_trainer.faults import stops
from ps_trainer.settings import host_ports
from ps_trainer.training import run_result

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
LAUNCHER = os.path.join(REPO, "launch.sh")
# A run slower than this is stuck; the bench says so rather than waiting on.
RUN_TIMEOUT_SECS = 900


# launch.sh's line on where the runs' clusters live (a private network
# namespace), left for the command to print once its flags are checked.
LAUNCHER_NOTE_ENV = "PS_TRAINER_LAUNCHER_NOTE"


def say_launcher_note() -> None:
  """Prints launch.sh's note, if it left one, to stderr, once: the runs
  this command starts (launch.sh local among them) do not inherit it."""
  note = os.environ.pop(LAUNCHER_NOTE_ENV, None)
  if note:
    print(note, file=sys.stderr, flush=True)


class RunFailed(RuntimeError):
  """A run exited badly or wrote no result. The message is one line."""


class Stopped(Exception):
  """The command was asked to stop, and the run in progress was stopped."""

  def __init__(self, signum: int):
    super().__init__(f"stopped on {signal.Signals(signum).name}")
    self.signum = signum


# The first SIGINT or SIGTERM the command received, once stop_on_signals()
# is in force. The runs' processes have sessions of their own, so a terminal's
# Ctrl-C never reaches them: only the command can stop them, and it must
# not exit while they train on.
_stop_signal: Optional[int] = None


def stop_on_signals() -> None:
  """From now on SIGINT, SIGTERM and SIGHUP (a closed terminal) stop the run
  in progress (its processes get SIGTERM, as from a user) and raise Stopped;
  no run starts after them.

  Later signals count as the same request: a second Ctrl-C must not end the
  command while its run is still stopping. A SIGINT ignored at the start (a
  background job of a script) stays ignored, as does a SIGHUP under nohup.
  """

  def request(signum, frame):
    del frame
    global _stop_signal
    if _stop_signal is None:
      _stop_signal = signum

  for signum in (signal.SIGINT, signal.SIGHUP):
    if signal.getsignal(signum) is not signal.SIG_IGN:
      signal.signal(signum, request)
  signal.signal(signal.SIGTERM, request)


def raise_if_stopped() -> None:
  """Raises Stopped if a stop was asked for: a stop that comes after the last
  run still ends the command, as one during a run would."""
  if _stop_signal is not None:
    raise Stopped(_stop_signal)


def _stop_if_asked(process: subprocess.Popen, label: str) -> None:
  if _stop_signal is not None:
    print(f"{label}: stopping it ({signal.Signals(_stop_signal).name})",
          file=sys.stderr, flush=True)
    _stop_group(process)
    raise Stopped(_stop_signal)


@dataclasses.dataclass
class Run:
  """One finished run: what it was and what it wrote."""
  label: str
  log_dir: str
  result: dict
  process_secs: float  # Start of the processes to their end, start-up included.

  def read(self, relative_path: str) -> Optional[dict]:
    """A JSON file the run wrote under its log dir, or None."""
    path = os.path.join(self.log_dir, relative_path)
    if not os.path.exists(path):
      return None
    with open(path) as f:
      return json.load(f)


def _env() -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"]
                              if env.get("PYTHONPATH") else "")
  env.pop("TF_CONFIG", None)
  return env


def _last_lines(path: str, count: int = 3) -> str:
  try:
    with open(path, errors="replace") as f:
      lines = [line.strip() for line in f if line.strip()]
  except OSError:
    return "(no log)"
  return " | ".join(lines[-count:])


def _finish(label: str, log_dir: str, log_path: str, status: int,
            started: float) -> Run:
  result_path = run_result.path(log_dir)
  if status != 0 or not os.path.exists(result_path):
    raise RunFailed(f"{label}: exited with status {status} and "
                    f"{'a' if os.path.exists(result_path) else 'no'} "
                    f"result.json; log {log_path}: {_last_lines(log_path)}")
  with open(result_path) as f:
    result = json.load(f)
  if result.get("steps_per_sec") is None:
    raise RunFailed(f"{label}: its chief timed fewer than two steps (a "
                    "--train_steps too small, or it was started again as the "
                    "run ended), so the run has no speed; log "
                    f"{log_path}: {_last_lines(log_path)}")
  return Run(label, log_dir, result, time.monotonic() - started)


def _wait(process: subprocess.Popen, label: str, log_path: str) -> int:
  deadline = time.monotonic() + RUN_TIMEOUT_SECS
  while True:
    _stop_if_asked(process, label)
    try:
      # Short waits: a stop request is seen within one of them.
      return process.wait(timeout=0.2)
    except subprocess.TimeoutExpired:
      pass
    if time.monotonic() > deadline:
      _stop_group(process)
      raise RunFailed(f"{label}: still running after {RUN_TIMEOUT_SECS} s; "
                      f"stopped it; log {log_path}: {_last_lines(log_path)}")


def _stop_group(process: subprocess.Popen,
                grace_secs: float = stops.SUPERVISOR_KILL_SECS) -> None:
  """SIGTERM to the process group, SIGKILL if it is still there after grace."""
  if process.poll() is not None:
    return
  try:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=grace_secs)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
  except ProcessLookupError:
    pass


def _start(command: List[str], log_path: str) -> subprocess.Popen:
  raise_if_stopped()
  with open(log_path, "w") as log:
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                            env=_env(), start_new_session=True)


def run_local_process(label: str, flags: List[str], log_dir: str) -> Run:
  """ps_trainer alone in one process (local mode)."""
  return _run_one_process(label, "ps_trainer", flags, log_dir)


def _run_one_process(label: str, module: str, flags: List[str],
                     log_dir: str) -> Run:
  os.makedirs(log_dir, exist_ok=True)
  log_path = os.path.join(log_dir, "local.log")
  started = time.monotonic()
  process = _start([sys.executable, "-m", module, *flags,
                    f"--log_dir={log_dir}"], log_path)
  return _finish(label, log_dir, log_path,
                 _wait(process, label, log_path), started)


def run_local_cluster(label: str, num_ps: int, num_workers: int,
                      flags: List[str], log_dir: str,
                      isolate: bool = False) -> Run:
  """ps_trainer on a cluster of this machine, through `launch.sh local`.

  `isolate`: give the cluster a private network namespace of its own; the
  bench and compare run inside one already.
  """
  os.makedirs(log_dir, exist_ok=True)
  log_path = os.path.join(log_dir, "launch.log")
  command = [LAUNCHER, "local", f"--num_ps={num_ps}",
             f"--num_workers={num_workers}", *flags, f"--log_dir={log_dir}"]
  if not isolate:
    command.insert(2, "--no_isolate")
  started = time.monotonic()
  process = _start(command, log_path)
  return _finish(label, log_dir, log_path, _wait(process, label, log_path),
                 started)


def run_plain_tf1_local(label: str, flags: List[str], log_dir: str,
                        program: str) -> Run:
  """A program of run_plain_tf1_cluster's (plain_tf1 or bare_step) in one
  process of its own: without --job_name, each trains alone."""
  return _run_one_process(label, f"ps_trainer.experiments.{program}", flags,
                          log_dir)


def run_plain_tf1_cluster(label: str, flags: List[str], log_dir: str,
                          program: str = "plain_tf1") -> Run:
  """The plain TF1 pattern (plain_tf1.py) on 1 PS + 1 worker of this machine,
  or with `program="bare_step"` the trainer's bare step (bare_step.py), which
  takes the same flags.

  Its PS does not exit by itself while this process lives: it is stopped once
  the worker is done.
  """
  os.makedirs(log_dir, exist_ok=True)
  ps_port, worker_port = host_ports.free_ports(2)
  common = [sys.executable, "-m", f"ps_trainer.experiments.{program}",
            f"--ps_hosts=127.0.0.1:{ps_port}",
            f"--worker_hosts=127.0.0.1:{worker_port}", *flags,
            f"--log_dir={log_dir}"]
  ps_log = os.path.join(log_dir, "ps-0.log")
  worker_log = os.path.join(log_dir, "worker-0.log")
  started = time.monotonic()
  # Named, not inferred: a bench killed before the PS's interpreter ran its
  # first line would otherwise leave it serving forever (plain_tf1.py).
  ps = _start(common + ["--job_name=ps", "--task_index=0",
                        f"--started_by={os.getpid()}"], ps_log)
  try:
    worker = _start(common + ["--job_name=worker", "--task_index=0"],
                    worker_log)
    status = _wait(worker, label, worker_log)
  finally:
    _stop_group(ps, grace_secs=5)
  return _finish(label, log_dir, worker_log, status, started)
