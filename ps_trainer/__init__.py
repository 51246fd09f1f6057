"""ps_trainer: TensorFlow 1 graph-mode parameter-server training.

For your own model: `ModelSpec`, `ModeKeys` and `run(model_fn, input_fn)`;
`ps_trainer.testing` for graph-mode unit tests (README: Your own model).
"""

import os as _os
import sys as _sys

# Keras 2 (tf_keras) builds TF1 graphs; Keras 3 cannot. Before TensorFlow
# loads, or tf.keras would be Keras 3; a value the user set is kept.
_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# TensorFlow's C++ start-up and session notes would drown the progress lines
# of a script that imports TensorFlow itself; errors still show.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position
from ps_trainer.user_model.spec import ModeKeys
from ps_trainer.user_model.spec import ModelSpec
# pylint: enable=g-import-not-at-top,wrong-import-position

__all__ = ["ModeKeys", "ModelSpec", "run"]


def run(model_fn, input_fn=None) -> None:
  """Runs this process's task with your model, as `python -m ps_trainer`
  does with --model=PATH.py:FUNCTION: the same flags, roles, TF_CONFIG,
  local mode. Exits the process with the task's status.

  Args:
    model_fn: model_fn(features, labels, mode, params) -> ModelSpec.
    input_fn: input_fn(mode, input_context, params) -> tf.data.Dataset of
      (features, labels); None: --dataset supplies the input.
  """
  import importlib  # pylint: disable=g-import-not-at-top
  from ps_trainer.console import as_program  # pylint: disable=g-import-not-at-top
  if not _started_as_program():
    as_program.prepare()
  # By name, not an import statement: main's Bazel target depends on this
  # package's, which cannot depend on it back (a Bazel user of run() depends
  # on //ps_trainer:main).
  importlib.import_module("ps_trainer.main").run(model_fn, input_fn)


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
  from ps_trainer.console import as_program as _as_program
  _as_program.prepare()
