"""The built-in networks: features -> logits, from get_variable and tf.nn ops.

Plain `get_variable` keeps every variable visible to the device function and
to partitioners. Networks know nothing of clusters: wide_deep is handed a
partitioner for its tables and does not ask how many parts there are or
where they go. Variables live under the "model" scope with AUTO_REUSE.
"""

import numpy as np
import tensorflow as tf

from ps_trainer.user_model import spec as spec_lib

MODELS = ("linear", "mlp", "cnn", "wide_deep")
# Every model variable is under it (checkpoints.py tells models apart by it).
SCOPE = "model"


class ModelError(spec_lib.ModelFnError):
  """A model that cannot be built for this data. The message is one line.

  A ModelFnError, so the contract's calls pass it on as it is: a built-in
  model's message names the flags, not a file and line of the package."""


def build_logits(model: str, features, input_shape: tuple,
                 num_classes: int, hidden_units: tuple = (),
                 vocab_size: int = 0, embedding_dim: int = 0,
                 partitioner=None) -> tf.Tensor:
  """Builds the model on `features` and returns its logits.

  Args:
    model: one of MODELS.
    features: float32 [batch, *input_shape]; for "wide_deep" a dict of
      "ids" (int64 SparseTensor [batch, None]) and "dense" (float32
      [batch, D]).
    input_shape: one example's shape: (H, W, C) images or (D,) vectors
      (the dense features of "wide_deep").
    num_classes: output classes (2 for "wide_deep").
    hidden_units: layer sizes for "mlp" and the deep part of "wide_deep".
    vocab_size, embedding_dim: the tables of "wide_deep".
    partitioner: splits the tables of "wide_deep" (a get_variable
      partitioner), or None.

  Returns:
    float32 logits [batch, num_classes].

  Raises:
    ModelError: unknown model, or a model that cannot read this data.
  """
  check_known(model)
  with tf.compat.v1.variable_scope(SCOPE, reuse=tf.compat.v1.AUTO_REUSE):
    if model == "linear":
      return _dense(_flatten(features, input_shape), num_classes, "logits")
    if model == "mlp":
      net = _flatten(features, input_shape)
      for i, units in enumerate(hidden_units):
        net = tf.nn.relu(_dense(net, units, f"hidden{i}"))
      return _dense(net, num_classes, "logits")
    if model == "cnn":
      return _cnn(features, input_shape, num_classes)
    # wide_deep, the last of MODELS.
    if not isinstance(features, dict) or num_classes != 2:
      raise ModelError("--model=wide_deep predicts clicks from sparse ids: "
                       "it needs --dataset=tfrecord")
    return _wide_deep(features, vocab_size, embedding_dim, hidden_units,
                      partitioner)


def check_known(model: str) -> None:
  """Raises ModelError unless `model` names one of MODELS."""
  if model not in MODELS:
    raise ModelError(f"--model={model!r} is unknown; accepted: "
                     f"{', '.join(MODELS)}")


def _flatten(features: tf.Tensor, input_shape: tuple) -> tf.Tensor:
  return tf.reshape(features, [-1, int(np.prod(input_shape))])


def _dense(inputs: tf.Tensor, units: int, name: str) -> tf.Tensor:
  fan_in = int(inputs.shape[-1])
  with tf.compat.v1.variable_scope(name):
    kernel = tf.compat.v1.get_variable(
        "kernel", [fan_in, units],
        initializer=tf.compat.v1.glorot_uniform_initializer())
    bias = tf.compat.v1.get_variable(
        "bias", [units], initializer=tf.compat.v1.zeros_initializer())
  return tf.nn.bias_add(tf.linalg.matmul(inputs, kernel), bias)


def _cnn(features: tf.Tensor, input_shape: tuple, num_classes: int):
  """Conv 32x3x3, max-pool 2x2, dense 64, dense classes (TF's PS tutorial)."""
  if len(input_shape) != 3 or min(input_shape[:2]) < 4:
    raise ModelError(
        f"--model=cnn needs images of at least 4x4 (H, W, C); this data set's "
        f"examples have shape {tuple(input_shape)}; use --model=mlp or linear")
  with tf.compat.v1.variable_scope("conv"):
    kernel = tf.compat.v1.get_variable(
        "kernel", [3, 3, input_shape[2], 32],
        initializer=tf.compat.v1.glorot_uniform_initializer())
    bias = tf.compat.v1.get_variable(
        "bias", [32], initializer=tf.compat.v1.zeros_initializer())
  net = tf.nn.relu(tf.nn.bias_add(
      tf.nn.conv2d(features, kernel, strides=1, padding="VALID"), bias))
  net = tf.nn.max_pool2d(net, ksize=2, strides=2, padding="VALID")
  net = tf.reshape(net, [-1, int(np.prod(net.shape[1:]))])
  net = tf.nn.relu(_dense(net, 64, "dense"))
  return _dense(net, num_classes, "logits")


def _wide_deep(features: dict, vocab_size: int, embedding_dim: int,
               hidden_units: tuple, partitioner):
  """Wide (linear over ids) plus deep (mean id embedding and dense -> MLP).

  Both tables are read with sparse lookups, so their gradients are
  IndexedSlices of the rows a batch touched, and an optimizer with a sparse
  apply (sgd, momentum, adagrad) changes only those rows on the PS.

  Returns [batch, 2] logits [0, z]: softmax over them is the sigmoid of z,
  so the click model shares the classifiers' loss, accuracy and evaluation.
  """
  ids = features["ids"]
  hashed = tf.SparseTensor(ids.indices,
                           tf.math.floormod(ids.values, vocab_size),
                           ids.dense_shape)
  with tf.compat.v1.variable_scope("wide"):
    wide_weights = tf.compat.v1.get_variable(
        "weights", [vocab_size, 1], partitioner=partitioner,
        initializer=tf.compat.v1.zeros_initializer())
    wide_bias = tf.compat.v1.get_variable(
        "bias", [1], initializer=tf.compat.v1.zeros_initializer())
  # The safe lookup gives an example without ids a zero row instead of
  # dropping it (and with it the batch's shape).
  wide = tf.compat.v1.nn.safe_embedding_lookup_sparse(
      wide_weights, hashed, combiner="sum") + wide_bias
  with tf.compat.v1.variable_scope("deep"):
    embedding = tf.compat.v1.get_variable(
        "embedding", [vocab_size, embedding_dim], partitioner=partitioner,
        initializer=tf.compat.v1.truncated_normal_initializer(
            stddev=1.0 / np.sqrt(embedding_dim)))
  dense = features.get("dense")
  if dense is None:  # Served without dense features: an empty row each.
    dense = tf.zeros(tf.stack([tf.cast(ids.dense_shape[0], tf.int32), 0]))
  net = tf.concat([tf.compat.v1.nn.safe_embedding_lookup_sparse(
      embedding, hashed, combiner="mean"), dense], axis=1)
  for i, units in enumerate(hidden_units):
    net = tf.nn.relu(_dense(net, units, f"hidden{i}"))
  click_logit = wide + _dense(net, 1, "deep_logit")
  return tf.concat([tf.zeros_like(click_logit), click_logit], axis=1)


def loss_and_accuracy(logits: tf.Tensor, labels: tf.Tensor):
  """Mean softmax cross-entropy and accuracy of a batch."""
  loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits))
  return loss, tf.reduce_mean(_correct(logits, labels))


def _correct(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
  predicted = tf.argmax(logits, axis=1, output_type=labels.dtype)
  return tf.cast(tf.equal(predicted, labels), tf.float32)
