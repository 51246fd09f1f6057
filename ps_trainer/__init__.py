"""ps_trainer: TensorFlow 1 graph-mode parameter-server training."""

import os as _os
import sys as _sys


def _started_as_program() -> bool:
  """Whether this process is one of the package's programs: `python -m
  ps_trainer[.x]` (sys.argv[0] is "-m" while runpy imports the package to find
  the module, which sys.orig_argv names), or a file of the package run by its
  path (`bazel run //ps_trainer` runs __main__.py so)."""
  if _sys.argv[:1] == ["-m"]:
    args = getattr(_sys, "orig_argv", [])
    flag = next((i for i, a in enumerate(args) if a.startswith("-m")), None)
    if flag is None:
      return False
    module = args[flag][2:] or (args[flag + 1] if flag + 1 < len(args) else "")
    return module == __name__ or module.startswith(__name__ + ".")
  if not _sys.argv or not _sys.argv[0]:
    return False
  script_dir = _os.path.dirname(_os.path.realpath(_sys.argv[0]))
  package_dir = _os.path.dirname(_os.path.realpath(__file__))
  return (script_dir == package_dir or
          script_dir.startswith(package_dir + _os.sep))


# Before any of the program's own imports. Imported as a library (a test, a
# notebook, another package's program), the importer keeps Python's
# KeyboardInterrupt and its own streams.
if _started_as_program():
  from ps_trainer import as_program as _as_program
  _as_program.prepare()
