"""ps_trainer: TensorFlow 1 graph-mode parameter-server training."""

import sys as _sys

# Started as a program (`python -m ps_trainer...`: sys.argv[0] is "-m" while
# the package is imported to find the module), before any of its imports.
# Imported as a library (a test, a notebook), the importer keeps Python's
# KeyboardInterrupt and its own streams.
if _sys.argv[:1] == ["-m"]:
  from ps_trainer import as_program as _as_program
  _as_program.prepare()
