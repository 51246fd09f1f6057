"""The built-in models as model_fns on the user's contract.

`linear`, `mlp`, `cnn` and `wide_deep` take (features, labels, mode, params)
and return a ModelSpec, as a user's model_fn does; the trainer builds them
through the same calls. They are the proof that the contract carries
everything the trainer does: packed reads, partitioned tables, exact
evaluation and a serving signature.

Params (`params_for` makes them from the flags and the data set):
  input_shape: one example's shape; num_classes: output classes.
  hidden_units: layer sizes of mlp and of wide_deep's deep part.
  vocab_size, embedding_dim: wide_deep's tables.
  table_parts: how many parts wide_deep splits each table into; None keeps
    it whole. The trainer gives one per PS task: equal parts of contiguous
    rows (what the lookups' "div" strategy expects), which the balancer
    spreads one to a PS, so every PS serves a share of the lookups.
"""

import json
from typing import Callable, Optional

import tensorflow as tf

from ps_trainer.models import networks
from ps_trainer.user_model import loading
from ps_trainer.user_model.spec import ModeKeys
from ps_trainer.user_model.spec import ModelSpec


def params_for(model: str, input_shape: tuple, num_classes: int,
               hidden_units: tuple = (), vocab_size: int = 0,
               embedding_dim: int = 0,
               table_parts: Optional[int] = None) -> dict:
  """The params a built-in model_fn reads (JSON values only)."""
  params = {"input_shape": list(input_shape), "num_classes": num_classes}
  if model in ("mlp", "wide_deep"):
    params["hidden_units"] = list(hidden_units)
  if model == "wide_deep":
    params.update(vocab_size=vocab_size, embedding_dim=embedding_dim,
                  table_parts=table_parts)
  return params


def built_in(model: str, params: dict) -> loading.UserModel:
  """The built-in `model` as the trainer takes a user's model.

  Raises:
    ModelError: no built-in model is named so.
  """
  networks.check_known(model)
  return loading.UserModel(model_fn=_MODEL_FNS[model], input_fn=None,
                           params=json.dumps(params, sort_keys=True),
                           model_name=model)


def _model_fn(name: str) -> Callable:
  def model_fn(features, labels, mode, params):
    partitioner = None
    if params.get("table_parts"):
      partitioner = tf.compat.v1.fixed_size_partitioner(params["table_parts"])
    logits = networks.build_logits(
        name, features, tuple(params["input_shape"]), params["num_classes"],
        tuple(params.get("hidden_units", ())),
        vocab_size=params.get("vocab_size", 0),
        embedding_dim=params.get("embedding_dim", 0), partitioner=partitioner)
    return classifier_spec(logits, labels, mode)
  model_fn.__name__ = model_fn.__qualname__ = name
  model_fn.__doc__ = f"The built-in {name} model (see networks.py)."
  return model_fn


def classifier_spec(logits: tf.Tensor, labels, mode: str) -> ModelSpec:
  """A classifier's spec: softmax cross-entropy, accuracy, and the
  probabilities and classes it serves."""
  predictions = {
      "probabilities": tf.nn.softmax(logits, name="probabilities"),
      "classes": tf.argmax(logits, axis=1, output_type=tf.int64,
                           name="classes")}
  if mode == ModeKeys.PREDICT:
    return ModelSpec(mode, predictions=predictions)
  loss, accuracy = networks.loss_and_accuracy(logits, labels)
  if mode == ModeKeys.TRAIN:
    tf.compat.v1.summary.scalar("train_accuracy", accuracy)
    return ModelSpec(mode, loss=loss, predictions=predictions)
  # Only here: a metric's counters are variables, of no use to training.
  return ModelSpec(mode, loss=loss, predictions=predictions,
                   eval_metric_ops={"accuracy": tf.compat.v1.metrics.accuracy(
                       labels, tf.cast(predictions["classes"], labels.dtype))})


_MODEL_FNS = {name: _model_fn(name) for name in networks.MODELS}
linear, mlp, cnn, wide_deep = (_MODEL_FNS[name] for name in networks.MODELS)
