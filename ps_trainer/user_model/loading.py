"""From flags to callables: `--model=PATH.py:FN` or `package.module:FN`,
`--input_fn=...` and `--params=JSON`.

`looks_like_function` and `parse_params` are pure and run before TensorFlow
loads, so a typo is one line in a blink; `load` imports the user's code.
"""

import dataclasses
import importlib
import importlib.util
import json
import os
import sys
import traceback
from typing import Callable, Optional

from ps_trainer.user_model import spec as spec_lib

MODEL_FN_ARGS = ("features", "labels", "mode", "params")
INPUT_FN_ARGS = ("mode", "input_context", "params")


@dataclasses.dataclass(frozen=True)
class UserModel:
  """A user's functions and params, resolved once per process.

  Attributes:
    model_fn: model_fn(features, labels, mode, params) -> ModelSpec.
    input_fn: input_fn(mode, input_context, params) -> tf.data.Dataset of
      (features, labels); None: --dataset supplies the input.
    params: the --params JSON as a string (each call gets a fresh dict).
    model_name: names the model_fn in messages and in result.json.
    input_flag: the flag that names the input in messages
      ("--input_fn=my.py:input_fn", "--dataset=digits"), or "".
  """
  model_fn: Callable
  input_fn: Optional[Callable]
  params: str = "{}"
  model_name: str = "model_fn"
  input_flag: str = ""

  def params_dict(self) -> dict:
    return json.loads(self.params)


def name_of(function: Optional[Callable]) -> str:
  """'model.py:model_fn': names a function given as a callable (ps_trainer.run,
  ps_trainer.testing) as --model would; "" for None."""
  if function is None:
    return ""
  import inspect  # pylint: disable=g-import-not-at-top
  try:
    path = os.path.relpath(inspect.getsourcefile(function) or "")
  except (TypeError, ValueError):
    path = getattr(function, "__module__", "") or "function"
  return f"{path}:{getattr(function, '__name__', 'function')}"


def is_function_spec(text: str) -> bool:
  """Whether a --model value names a function rather than a built-in."""
  return ":" in text


def parse_params(text: str) -> str:
  """--params as canonical JSON text of an object.

  Raises:
    ModelFnError: not JSON, or not an object.
  """
  try:
    value = json.loads(text or "{}")
  except ValueError as e:
    raise spec_lib.ModelFnError(
        f"--params={text}: not JSON ({e}); accepted: a JSON object, e.g. "
        "--params='{\"hidden_units\": [128, 64]}'") from None
  if not isinstance(value, dict):
    raise spec_lib.ModelFnError(
        f"--params={text}: a JSON {type(value).__name__}, not an object; "
        "accepted: a JSON object, e.g. --params='{\"units\": 64}'")
  return json.dumps(value, sort_keys=True)


def check_flags(model: str, input_fn: str) -> None:
  """The form of --model=PATH.py:FN and --input_fn, and that their files
  exist, without importing them.

  Raises:
    ModelFnError: one line naming the flag.
  """
  if input_fn and not is_function_spec(model):
    # A built-in model reads --dataset's features; an input_fn's are its own.
    raise spec_lib.ModelFnError(
        f"--input_fn={input_fn} needs your own model to read its features, "
        f"and --model={model} is built in; pass --model=PATH.py:FUNCTION too")
  if is_function_spec(model):
    check_spec_text(model, "model")
  if input_fn:
    check_spec_text(input_fn, "input_fn")


def check_spec_text(text: str, flag: str) -> None:
  """Checks the form of PATH.py:FN or package.module:FN without importing.

  Raises:
    ModelFnError: no function name, or a .py path that does not exist.
  """
  where, _, name = text.rpartition(":")
  if not where or not name:
    raise spec_lib.ModelFnError(
        f"--{flag}={text}: expected PATH.py:FUNCTION or "
        "package.module:FUNCTION")
  if where.endswith(".py") and not os.path.isfile(where):
    raise spec_lib.ModelFnError(
        f"--{flag}={text}: no such file {where} (relative to {os.getcwd()})")


def quiet_layer_deprecations() -> None:
  """tf.compat.v1.layers warns on every call that it is deprecated: lines
  that bury the progress in every task's log. Using them is this contract's
  point."""
  import warnings  # pylint: disable=g-import-not-at-top
  warnings.filterwarnings("ignore", category=UserWarning,
                          message=r"`tf\.layers\.\w+` is deprecated")


def load(text: str, flag: str) -> Callable:
  """The function that `text` (PATH.py:FN or package.module:FN) names.

  Raises:
    ModelFnError: a missing file or module, no such function, or code that
      fails as it is imported (its own error, with file and line).
  """
  check_spec_text(text, flag)
  where, _, name = text.rpartition(":")
  try:
    module = _import_file(where) if where.endswith(".py") else (
        importlib.import_module(where))
  except ModuleNotFoundError as e:
    if e.name and (where == e.name or where.startswith(e.name + ".")):
      raise spec_lib.ModelFnError(
          f"--{flag}={text}: no module named {e.name!r} on the Python path "
          "(give PATH.py:FUNCTION for a file)") from None
    raise spec_lib.ModelFnError(
        f"--{flag}={text}: importing it failed: {describe_exception(e)}"
    ) from None
  except spec_lib.ModelFnError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise spec_lib.ModelFnError(
        f"--{flag}={text}: importing it failed: {describe_exception(e)}"
    ) from None
  function = getattr(module, name, None)
  if not callable(function):
    raise spec_lib.ModelFnError(
        f"--{flag}={text}: {where} has no function {name!r}")
  return function


def _import_file(path: str):
  """Imports a .py file as a module named after it, with its directory on
  sys.path (so it imports its siblings, as `python PATH.py` would). Once:
  --model and --input_fn in one file share its module."""
  absolute = os.path.abspath(path)
  if absolute in _FILES:
    return _FILES[absolute]
  directory = os.path.dirname(absolute)
  if directory not in sys.path:
    sys.path.insert(0, directory)
  name = os.path.splitext(os.path.basename(path))[0]
  module_spec = importlib.util.spec_from_file_location(name, absolute)
  module = importlib.util.module_from_spec(module_spec)
  sys.modules.setdefault(name, module)
  module_spec.loader.exec_module(module)
  _FILES[absolute] = module
  return module


_FILES = {}  # Absolute path -> the module imported from it.


def describe_exception(error: BaseException) -> str:
  """'ValueError: bad units (model.py:12)': the error and the innermost
  frame of the user's code (not TensorFlow's, not ours)."""
  where = ""
  for frame in reversed(traceback.extract_tb(error.__traceback__)):
    if not _library_file(frame.filename):
      where = f" ({frame.filename}:{frame.lineno})"
      break
  text = " ".join(str(error).split()) or "no message"
  return f"{type(error).__name__}: {text}{where}"


def _library_file(filename: str) -> bool:
  package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return (os.path.abspath(filename).startswith(package_dir + os.sep)
          or "site-packages" in filename or filename.startswith("<frozen"))


def from_flags(model: str, input_fn: str, params: str) -> Optional[UserModel]:
  """The UserModel the flags name, or None for a built-in --model.

  Raises:
    ModelFnError: as load and parse_params.
  """
  check_flags(model, input_fn)
  if not is_function_spec(model):
    return None
  return from_functions(load(model, "model"),
                        load(input_fn, "input_fn") if input_fn else None,
                        params, model, input_fn)


def from_functions(model_fn: Callable, input_fn: Optional[Callable],
                   params: str, model_name: str, input_name: str) -> UserModel:
  """The UserModel of functions given as callables (ps_trainer.run,
  ps_trainer.testing) or loaded from flags."""
  quiet_layer_deprecations()
  return UserModel(model_fn=model_fn, input_fn=input_fn,
                   params=parse_params(params), model_name=model_name,
                   input_flag=f"--input_fn={input_name}" if input_name else "")
