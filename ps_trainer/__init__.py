"""ps_trainer: TensorFlow 1 graph-mode parameter-server training."""

import signal as _signal
import sys as _sys


def _exit_on_interrupt(signum, frame):
  del signum, frame
  raise SystemExit(128 + _signal.SIGINT)  # As the programs' own stops exit.


# Started as a program (`python -m ps_trainer...`: sys.argv[0] is "-m" while
# the package is imported to find the module), a Ctrl-C that comes before the
# program takes SIGINT itself (stops.py, experiments/runs.py) ends it with
# status 130 and no traceback, its `finally` blocks run; KeyboardInterrupt
# would print Python's traceback of whatever import it cut. Imported as a
# library (a test, a notebook), the importer keeps its KeyboardInterrupt; an
# ignored SIGINT (a script's background job) stays ignored.
if (_sys.argv[:1] == ["-m"]
    and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler):
  _signal.signal(_signal.SIGINT, _exit_on_interrupt)
