"""The one shared helper for multi-process tests: free ports, processes, leftovers, results.

Every wait here is bounded and, on timeout, fails with what it waited for and the tail of the
process's log, after killing the process group it started (so a hung test leaves nothing behind).

Typical use::

    log_dir = testutil.make_tempdir(self)
    proc = testutil.start([testutil.LAUNCH_SH, "local", f"--log_dir={log_dir}"],
                          os.path.join(log_dir, "launch.log"))
    self.addCleanup(proc.kill_group)
    self.assertEqual(proc.wait(timeout=240), 0, proc.log_tail())
    testutil.assert_no_leftover(marker=log_dir)
    result = testutil.read_result_json(log_dir)
"""

import json
import os
import pathlib
import signal
import subprocess
import shutil
import sys
import tempfile
import time
from typing import Dict, Iterable, List, Optional, Sequence

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
PYTHON = sys.executable  # the interpreter running the tests: the project's .venv
LAUNCH_SH = str(REPO_ROOT / "launch.sh")


class ManualClock:
  """A monotonic clock (a callable returning seconds) that moves only when a test sets `now`."""

  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


def pick_free_ports(n: int) -> List[int]:
  """Returns n distinct ports that are free right now (host_ports.free_ports)."""
  from ps_trainer.settings import host_ports  # pylint: disable=g-import-not-at-top
  return host_ports.free_ports(n)


def cluster_hosts(num_ps: int, num_workers: int) -> Dict[str, str]:
  """Returns {"ps_hosts": ..., "worker_hosts": ...} on 127.0.0.1 with fresh distinct ports."""
  ports = pick_free_ports(num_ps + num_workers)
  hosts = [f"127.0.0.1:{p}" for p in ports]
  return {"ps_hosts": ",".join(hosts[:num_ps]), "worker_hosts": ",".join(hosts[num_ps:])}


def trainer_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
  """The environment for `python -m ps_trainer` from any directory: the checkout on PYTHONPATH.

  TF_CONFIG is removed so a test's flags alone define the cluster.
  """
  env = dict(os.environ)
  env.pop("TF_CONFIG", None)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  if extra:
    env.update(extra)
  return env


# The exit status of a process that imported tensorflow_blocked()'s tensorflow.
TENSORFLOW_IMPORTED = 99


def tensorflow_blocked(test, env: Dict[str, str]) -> Dict[str, str]:
  """env with a `tensorflow` first on PYTHONPATH whose import ends the process at once.

  For the promise that a mistake is named before TensorFlow loads: such a run then exits with
  TENSORFLOW_IMPORTED, not a line (the trainer hides what is printed while TensorFlow loads).
  """
  return with_fake_package(test, env, "tensorflow", f"import os\nos._exit({TENSORFLOW_IMPORTED})\n")


def with_fake_package(test, env: Dict[str, str], name: str, source: str) -> Dict[str, str]:
  """env with a package `name` first on PYTHONPATH, its __init__.py `source`."""
  package = os.path.join(make_tempdir(test), name)
  os.makedirs(package)
  with open(os.path.join(package, "__init__.py"), "w", encoding="utf-8") as f:
    f.write(source)
  paths = (os.path.dirname(package), env.get("PYTHONPATH"))
  return dict(env, PYTHONPATH=os.pathsep.join(p for p in paths if p))


def with_default_sigint(argv: Sequence[str]) -> List[str]:
  """argv run through a wrapper that gives it Python's default SIGINT (Ctrl-C ends it).

  The suite may itself run as a script's background job, which starts with SIGINT ignored, and
  an ignored signal stays ignored across exec: a Ctrl-C sent to such a child would do nothing.
  """
  reset = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
           "os.execv(sys.argv[1], sys.argv[1:])")
  return [PYTHON, "-c", reset, *argv]


def make_tempdir(test, prefix: str = "ps_trainer_test_") -> str:
  """A fresh directory removed when test ends (test.addCleanup).

  absltest's create_tempdir() needs parsed absl flags, which pytest does not provide; this works
  under pytest, Bazel (uses $TEST_TMPDIR) and plain `python tests/x_test.py` alike.
  """
  path = tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TEST_TMPDIR"))
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def read_text(path: str) -> str:
  """A log or text file's whole text (bytes that are not UTF-8 replaced)."""
  with open(path, encoding="utf-8", errors="replace") as f:
    return f.read()


def tail(path: str, lines: int) -> str:
  """The last `lines` lines of a log file, or why there is none."""
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 64 * 1024))
      text = f.read().decode("utf-8", "replace")
  except OSError as e:
    return f"<no log {path}: {e}>"
  return "\n".join(text.splitlines()[-lines:])


class Process:
  """A command started with its own process group and stdout+stderr in a log file.

  The log is truncated first, unless append is true (a task restarted with the same command
  then adds to the log of its previous run).
  """

  def __init__(self, args: Sequence[str], log_path: str, env=None, cwd=None, name=None,
               append: bool = False):
    self.args = [str(a) for a in args]
    self.log_path = str(log_path)
    self.name = name or os.path.basename(self.args[0])
    os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
    with open(self.log_path, "ab" if append else "wb") as log:
      # start_new_session: its own process group, which holds everything it starts (a launcher's
      # tasks too), so a timeout can end the whole tree and Ctrl-C in the test's terminal stays out.
      self.popen = subprocess.Popen(
          self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
          env=env if env is not None else trainer_env(), cwd=str(cwd or REPO_ROOT),
          start_new_session=True)
    self.pid = self.popen.pid

  @property
  def returncode(self) -> Optional[int]:
    return self.popen.poll()

  def log_tail(self, lines: int = 40) -> str:
    return f"--- last {lines} lines of {self.log_path} ---\n{tail(self.log_path, lines)}"

  def read_log(self) -> str:
    return read_text(self.log_path)

  def signal_group(self, sig: int) -> None:
    """Sends sig to the process group (as Ctrl-C in a terminal would); no-op once it is gone."""
    try:
      os.killpg(self.pid, sig)
    except ProcessLookupError:
      pass

  def kill_group(self, grace: float = 3.0) -> None:
    """SIGTERM the group, then SIGKILL after grace seconds. Safe to call twice (addCleanup)."""
    self.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while group_alive(self.pid) and time.monotonic() < deadline:
      self.popen.poll()
      time.sleep(0.1)
    self.signal_group(signal.SIGKILL)
    try:
      self.popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
      pass

  def wait(self, timeout: float) -> int:
    """Returns the exit code; on timeout kills the group and fails with the log tail."""
    try:
      return self.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.kill_group()
      raise AssertionError(
          f"{self.name} (pid {self.pid}) still running after {timeout:.0f} s; killed its group.\n"
          f"command: {' '.join(self.args)}\n{self.log_tail()}") from None


def start(args: Sequence[str], log_path: str, env=None, cwd=None, name=None,
          append: bool = False) -> Process:
  """Starts args in a new process group, output to log_path; env defaults to trainer_env().

  append: add to log_path instead of truncating it (a restarted task keeps its earlier log).
  """
  return Process(args, log_path, env=env, cwd=cwd, name=name, append=append)


def _proc_state(pid: int) -> Optional[str]:
  """The state letter of pid from /proc, or None if it is gone."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      stat = f.read().decode("utf-8", "replace")
  except OSError:
    return None
  return stat.rsplit(")", 1)[1].split()[0]


def is_alive(pid: int) -> bool:
  """True while pid runs; a zombie (exited, not yet reaped) counts as gone."""
  state = _proc_state(pid)
  return state is not None and state != "Z"


def group_alive(pgid: int) -> bool:
  try:
    os.killpg(pgid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return any(_pgid(pid) == pgid and is_alive(pid) for pid in _all_pids())


def _pgid(pid: int) -> Optional[int]:
  try:
    return os.getpgid(pid)
  except OSError:
    return None


def _all_pids() -> List[int]:
  return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def cmdline(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
  except OSError:
    return ""


def find_processes(marker: str) -> List[int]:
  """Live processes (not this one) whose command line contains marker, e.g. a test's log_dir."""
  me = os.getpid()
  return [pid for pid in _all_pids()
          if pid != me and marker in cmdline(pid) and is_alive(pid)]


def kill_processes(marker: str) -> None:
  """SIGKILL to every live process whose command line contains marker (a test's clean-up)."""
  _kill(find_processes(marker))


def _kill(pids: Iterable[int]) -> None:
  for pid in pids:
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass  # Ended meanwhile.


def assert_no_leftover(pids: Iterable[int] = (), marker: Optional[str] = None,
                       timeout: float = 10.0) -> None:
  """Fails if any of pids (or any process whose cmdline has marker) still runs after timeout.

  Processes can take a moment to die after their parent has exited, hence the bounded wait.
  Leftovers are SIGKILLed before failing, so one failing test does not poison the next ones.
  """
  pids = list(pids)
  deadline = time.monotonic() + timeout
  while True:
    alive = [p for p in pids if is_alive(p)]
    if marker:
      alive += [p for p in find_processes(marker) if p not in alive]
    if not alive or time.monotonic() >= deadline:
      break
    time.sleep(0.2)
  if alive:
    described = "\n".join(f"  pid {p}: {cmdline(p)}" for p in alive)
    _kill(alive)
    raise AssertionError(f"{len(alive)} process(es) still alive {timeout:.0f} s after the end "
                         f"(now killed):\n{described}")


def read_result_json(log_dir: str) -> dict:
  """Returns <log_dir>/result.json as a dict; fails with the directory listing if it is missing."""
  path = os.path.join(log_dir, "result.json")
  if not os.path.exists(path):
    listing = sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else "<no such directory>"
    raise AssertionError(f"no result.json in {log_dir}; it holds: {listing}")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def flag_values(*argv) -> dict:
  """Command-line flags parsed through the real flag definitions, as a dict."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ps_trainer.settings import flags as flags_lib  # pylint: disable=g-import-not-at-top
  values = flags.FlagValues()
  flags_lib.define_flags(values)
  values(["ps_trainer", *argv])
  return values.flag_values_dict()


def make_config(*argv, tf_config: str = ""):
  """A ps_trainer Config from command-line flags, through the real flag definitions."""
  from ps_trainer.settings import config as config_lib  # pylint: disable=g-import-not-at-top
  return config_lib.from_flag_values(flag_values(*argv), tf_config)


def planned_config(*argv, num_ps: int, num_workers: int, worker: int = 0):
  """The Config of worker `worker` in a cluster of this size whose hosts need not exist
  (config.planned_worker): for tests of the graph a worker builds, with no servers."""
  from ps_trainer.settings import config as config_lib  # pylint: disable=g-import-not-at-top
  return config_lib.from_flag_values(
      config_lib.planned_worker(flag_values(*argv), num_ps, num_workers, worker), "")


# Data files for tests that run the real binary on --dataset=mnist / npz. numpy only (imported
# here, not at the top), so a test process that writes them never loads TensorFlow.
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def idx_bytes(magic: int, dims: Sequence[int], payload: bytes) -> bytes:
  """An IDX file's content: the 4-byte magic, one 4-byte big-endian size per dim, the payload."""
  return magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims) + payload


def write_mnist(directory: str, n_train: int = 6, n_test: int = 4, rows: int = 4,
                cols: int = 3) -> Dict[str, str]:
  """Writes the four MNIST IDX files (plain, tiny, labels 0-2) into directory (made if needed).

  Returns:
    base name (one of MNIST_FILES) -> path, for a test to corrupt one of them.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  paths = {}
  for split, n in (("train", n_train), ("t10k", n_test)):
    images = np.arange(n * rows * cols, dtype=np.uint8).reshape(n, rows, cols)
    labels = (np.arange(n) % 3).astype(np.uint8)
    for kind, magic, dims, array in (("images-idx3-ubyte", 0x803, (n, rows, cols), images),
                                     ("labels-idx1-ubyte", 0x801, (n,), labels)):
      name = f"{split}-{kind}"
      paths[name] = os.path.join(directory, name)
      with open(paths[name], "wb") as f:
        f.write(idx_bytes(magic, dims, array.tobytes()))
  return paths


def write_npz(path: str, n_train: int = 3, n_test: int = 3, drop: Sequence[str] = (),
              **overrides) -> str:
  """Writes a keras-layout .npz (x_train [N, 2] float32, y_train, x_test, y_test) to path.

  drop leaves keys out; overrides replace arrays (e.g. y_train=np.arange(4)). Returns path.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  arrays = {"x_train": np.zeros((n_train, 2), np.float32), "y_train": np.arange(n_train) % 3,
            "x_test": np.zeros((n_test, 2), np.float32), "y_test": np.arange(n_test) % 3}
  arrays.update(overrides)
  for key in drop:
    del arrays[key]
  np.savez(path, **arrays)
  return path
