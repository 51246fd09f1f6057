"""What every program of the package (`python -m ps_trainer...`) needs before
its own code runs; ps_trainer/__init__.py calls prepare() when started so.

- Ctrl-C before the program takes SIGINT itself (stops.py for a task,
  experiments/runs.py for bench and compare; plan and clicks never do) ends
  it with status 130 and nothing printed, its `finally` blocks run, where
  KeyboardInterrupt would print Python's traceback of whatever import it cut.
- Lines to a reader that has gone (`./launch.sh compare ... | head`) go
  nowhere, where BrokenPipeError would end the program with a traceback: a
  comparison whose two runs had trained then wrote no report, and its
  --out_dir, holding those runs, refused the same command again.
"""

import os
import signal
import sys


def prepare() -> None:
  # An ignored SIGINT (a script's background job) stays ignored.
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _exit_on_interrupt)
  sys.stdout = _outliving_its_reader(sys.stdout)
  sys.stderr = _outliving_its_reader(sys.stderr)


def _exit_on_interrupt(signum, frame):
  del signum, frame
  raise SystemExit(128 + signal.SIGINT)  # As the programs' own stops exit.


def _outliving_its_reader(stream):
  return None if stream is None else _OutlivesItsReader(stream)


class _OutlivesItsReader:
  """A text stream whose writes, once its reader has gone, go to /dev/null
  instead of raising BrokenPipeError."""

  def __init__(self, stream):
    self._stream = stream

  def write(self, text: str) -> int:
    try:
      return self._stream.write(text)
    except BrokenPipeError:
      self._to_devnull()
      return len(text)

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
