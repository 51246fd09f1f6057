"""The public contract of a model function: ModeKeys and ModelSpec.

No TensorFlow import here: `ps_trainer.ModelSpec` is importable in a blink, and
the checks take the tensors' own attributes.
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence


class ModeKeys:
  """The mode a model_fn is called in (Estimator's values)."""
  TRAIN = "train"
  EVAL = "eval"
  PREDICT = "infer"


MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)


class ModelFnError(ValueError):
  """A model_fn or input_fn broke the contract. The message is one line."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """What a model_fn returns.

  Attributes:
    mode: the mode it was called in.
    loss: a scalar float tensor; required in TRAIN and EVAL.
    predictions: a tensor or a dict of tensors; required in PREDICT (the
      export's outputs).
    eval_metric_ops: name -> (value, update_op), as tf.compat.v1.metrics.*
      return them; scored over the whole held-out split.
    optimizer: a tf.compat.v1.train.Optimizer; None leaves it to
      --optimizer and --learning_rate.
    training_hooks: SessionRunHooks every worker runs while training.
  """
  mode: str
  loss: Any = None
  predictions: Any = None
  eval_metric_ops: Optional[Mapping[str, Any]] = None
  optimizer: Any = None
  training_hooks: Sequence[Any] = ()


def check(spec: Any, mode: str, where: str) -> ModelSpec:
  """Returns `spec` if it keeps the contract for `mode`.

  Args:
    spec: what the model_fn returned.
    mode: the mode it was called in.
    where: names the function in messages, e.g. "--model=my.py:model_fn".

  Raises:
    ModelFnError: one line saying what is wrong and what is accepted.
  """
  if not isinstance(spec, ModelSpec):
    raise ModelFnError(
        f"{where} returned {type(spec).__name__}, not a ps_trainer.ModelSpec; "
        "return ps_trainer.ModelSpec(mode, loss=..., predictions=...)")
  if mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
    _check_loss(spec.loss, mode, where)
  if mode == ModeKeys.PREDICT and spec.predictions is None:
    raise ModelFnError(
        f"{where} returned no predictions in mode {mode!r}; the export serves "
        "them: pass ModelSpec(mode, predictions=tensor or dict of tensors)")
  optimizer = spec.optimizer
  if optimizer is not None and not all(
      callable(getattr(optimizer, method, None))
      for method in ("compute_gradients", "apply_gradients")):
    raise ModelFnError(
        f"{where}: optimizer is a {type(optimizer).__name__}, not a TF1 "
        "optimizer; pass a tf.compat.v1.train.*Optimizer (a Keras optimizer "
        "builds no TF1 update), or leave it to --optimizer")
  hooks = spec.training_hooks
  if not isinstance(hooks, (list, tuple)) or not all(
      callable(getattr(hook, "before_run", None)) for hook in hooks):
    raise ModelFnError(
        f"{where}: training_hooks must be a list of "
        "tf.compat.v1.train.SessionRunHook")
  for name, pair in (spec.eval_metric_ops or {}).items():
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
      raise ModelFnError(
          f"{where}: eval_metric_ops[{name!r}] is not a (value, update_op) "
          "pair; use what tf.compat.v1.metrics.* returns")
  return spec


def _check_loss(loss: Any, mode: str, where: str) -> None:
  if loss is None:
    raise ModelFnError(
        f"{where} returned no loss in mode {mode!r}; pass ModelSpec(mode, "
        "loss=a scalar tensor)")
  shape = getattr(loss, "shape", None)
  dtype = getattr(loss, "dtype", None)
  if shape is None or dtype is None:
    raise ModelFnError(f"{where}: loss is a {type(loss).__name__}, not a "
                       "tensor; pass a scalar float tensor")
  if shape.rank != 0:
    raise ModelFnError(
        f"{where}: loss has shape {shape}, not a scalar; reduce it, e.g. "
        "tf.reduce_mean(...)")
  if not dtype.is_floating:
    raise ModelFnError(f"{where}: loss is {dtype.name}, not a float tensor")


def call_with_named_args(function: Callable, available: Mapping[str, Any],
                         accepted: Sequence[str], where: str) -> Any:
  """Calls `function` with the arguments it names among `available`.

  Raises:
    ModelFnError: it names an argument outside `accepted`.
  """
  return function(**{name: available[name]
                     for name in named_args(function, accepted, where)})


def named_args(function: Callable, accepted: Sequence[str],
               where: str) -> list:
  """The names `function` takes, all of them in `accepted`.

  Raises:
    ModelFnError: an unknown or positional-only argument.
  """
  import inspect  # pylint: disable=g-import-not-at-top
  try:
    parameters = inspect.signature(function).parameters.values()
  except (TypeError, ValueError):
    raise ModelFnError(f"{where} is not a function") from None
  names = []
  for parameter in parameters:
    if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
      continue
    if parameter.name not in accepted:
      if parameter.default is not parameter.empty:
        continue  # Its own default stands.
      raise ModelFnError(
          f"{where} takes an argument {parameter.name!r}; accepted names: "
          f"{', '.join(accepted)}")
    if parameter.kind == parameter.POSITIONAL_ONLY:
      raise ModelFnError(f"{where}: argument {parameter.name!r} is "
                         "positional-only; the trainer passes them by name")
    names.append(parameter.name)
  return names
