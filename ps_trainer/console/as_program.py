"""What every program of the package (`python -m ps_trainer...`) needs before
its own code runs; ps_trainer/__init__.py calls prepare() when started so.

- Ctrl-C before the program takes SIGINT itself (stops.py for a task,
  experiments/runs.py for bench and compare; plan and clicks never do) ends
  it with nothing printed, where KeyboardInterrupt would print Python's
  traceback of whatever import it cut. Its `finally` blocks run, then it dies
  by SIGINT, as Python ends on KeyboardInterrupt: a shell script that ran it
  stops too (one that sees status 130 from a normal exit runs on).
- Lines to a reader that has gone (`./launch.sh compare ... | head`) go
  nowhere, where BrokenPipeError would end the program with a traceback: a
  comparison whose two runs had trained then wrote no report, and its
  --out_dir, holding those runs, refused the same command again.
"""

import atexit
import os
import signal
import sys

_interrupted = False


def prepare() -> None:
  # An ignored SIGINT (a script's background job) stays ignored.
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _exit_on_interrupt)
    atexit.register(_die_by_sigint_if_interrupted)
  sys.stdout = _outliving_its_reader(sys.stdout)
  sys.stderr = _outliving_its_reader(sys.stderr)


def _exit_on_interrupt(signum, frame):
  del frame
  global _interrupted
  _interrupted = True
  raise SystemExit(128 + signum)


def _die_by_sigint_if_interrupted() -> None:
  """Last of all (atexit): the status a shell reads as Ctrl-C's."""
  if not _interrupted:
    return
  for stream in (sys.stdout, sys.stderr):
    if stream is not None:
      stream.flush()
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  os.kill(os.getpid(), signal.SIGINT)


def _outliving_its_reader(stream):
  return None if stream is None else _OutlivesItsReader(stream)


class _OutlivesItsReader:
  """A text stream whose writes, once its reader has gone, go to /dev/null
  instead of raising BrokenPipeError. Bytes written to its .buffer bypass it
  (nothing here writes so)."""

  def __init__(self, stream):
    self._stream = stream

  def write(self, text: str) -> int:
    try:
      return self._stream.write(text)
    except BrokenPipeError:
      self._to_devnull()
      return len(text)

  def writelines(self, lines) -> None:
    for line in lines:
      self.write(line)

  def flush(self) -> None:
    try:
      self._stream.flush()
    except BrokenPipeError:
      self._to_devnull()

  def _to_devnull(self) -> None:
    # The file descriptor itself: what is still buffered, the interpreter's
    # last flush, child processes and native code's writes go there too.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, self._stream.fileno())
    os.close(devnull)

  def __getattr__(self, name):
    return getattr(self._stream, name)
