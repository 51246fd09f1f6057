"""An output directory, checked before any work starts.

A run that finds at its end that it cannot write its results has wasted the
run; a command that crashes on a path that is a file prints a traceback. The
trainer's --log_dir, bench's --bench_dir and compare's --out_dir all go
through here, so each says what was wrong in one line, naming its flag.
"""

import errno
import fcntl
import fnmatch
import json
import os
import socket
import tempfile
from typing import List, Sequence


class OutputDirError(ValueError):
  """The directory cannot be used. The message is one line, naming the flag."""


def prepare(path: str, flag: str) -> List[str]:
  """Creates `path` if it is missing and checks that this user can write there.

  Returns:
    The directories it created, deepest first, so that a run which ends
    before writing anything can remove them (`remove_if_empty`).

  Raises:
    OutputDirError: `path` is a file, or cannot be created or written.
  """
  if os.path.exists(path) and not os.path.isdir(path):
    raise OutputDirError(f"{flag}={path}: is a file, not a directory; pass a "
                         "directory (it is created if missing)")
  created = []
  parent = os.path.abspath(path)
  while not os.path.exists(parent):
    created.append(parent)
    parent = os.path.dirname(parent)
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as e:
    raise OutputDirError(f"{flag}={path}: cannot write there ({e.strerror}); "
                         "pass a directory this user can create and write") from None
  return created


# Held by the chief that trains into a --log_dir (claim).
CLAIM_FILE = ".chief.lock"


def claim(path: str, flag: str):
  """Makes this process the one that trains into `path`; returns the open
  claim, which holds while this process lives (the OS drops it at any exit,
  kill -9 included, and at an execv: no claim is ever left stale).

  Two chiefs writing into one directory (the same command started twice, two
  `launch.sh local` clusters given one --log_dir) would overwrite each
  other's checkpoints and result.json. A file system without locks (some
  network mounts) leaves the directory unclaimed rather than fail the run.

  Raises:
    OutputDirError: another live process holds the claim.
  """
  claim_path = os.path.join(path, CLAIM_FILE)
  try:
    f = open(claim_path, "a+")  # pylint: disable=consider-using-with
  except OSError:  # Another user's claim file, say: unclaimed, as above.
    return None
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
      f.close()
      return None
    f.seek(0)
    holder = f.read().strip() or "another process"
    f.close()
    raise OutputDirError(
        f"{flag}={path}: a chief trains into it now ({holder}); two would "
        "overwrite each other's checkpoints: stop that one, or pass another "
        f"{flag}") from None
  f.truncate(0)
  f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
  f.flush()
  return f


def drop_claim(claim_file) -> None:
  """Removes the file of claim()'s claim, so that a directory the run
  created and left empty can go too (remove_if_empty)."""
  try:
    os.remove(claim_file.name)
  except OSError:
    pass


def refuse_earlier_runs(path: str, flag: str, patterns: Sequence[str]) -> None:
  """bench and compare run afresh: a run directory of theirs already in `path`
  would be continued (or, if finished, reported again) by `launch.sh local`.

  Raises:
    OutputDirError: `path` holds entries matching `patterns`.
  """
  if not os.path.isdir(path):
    return
  found = sorted(name for name in os.listdir(path)
                 if any(fnmatch.fnmatch(name, p) for p in patterns))
  if found:
    raise OutputDirError(
        f"{flag}={path}: holds the runs of an earlier one ({', '.join(found)}), "
        "which would be continued or reported again, not run afresh; pass a "
        f"new {flag}, or remove them")


def remove_if_empty(directories: List[str]) -> None:
  """Removes the directories `prepare` created, unless something was written."""
  for directory in directories:
    try:
      os.rmdir(directory)
    except OSError:
      return  # Not empty: it holds the run's files (and so do its parents).


def write_json(path: str, value) -> None:
  """Writes JSON atomically: readers never see a half-written file."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = f"{path}.tmp.{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(value, f, indent=2, sort_keys=True, allow_nan=False)
    f.write("\n")
  os.replace(tmp, path)
