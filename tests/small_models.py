"""Small user models for the contract's tests: a tf.compat.v1.layers MLP and
a Keras 2 model on a learnable synthetic set, and models that break the
contract in one way each."""

import numpy as np
import tensorflow as tf

import ps_trainer

EXAMPLES = 400


def _arrays():
  rng = np.random.RandomState(0)
  x = rng.rand(EXAMPLES, 6).astype(np.float32)
  y = (x[:, 0] + x[:, 1] > 1.0).astype(np.int64)  # Learnable by a line.
  return x, y


def input_fn(mode, input_context, params):
  x, y = _arrays()
  dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, y))
  dataset = dataset.shard(input_context.num_input_pipelines,
                          input_context.input_pipeline_id)
  if mode == ps_trainer.ModeKeys.TRAIN:
    dataset = dataset.shuffle(EXAMPLES)
  return dataset.batch(params.get("batch", 20))


def _spec(mode, logits, labels):
  classes = tf.argmax(logits, axis=1)
  predictions = {"classes": classes, "probabilities": tf.nn.softmax(logits)}
  if mode == ps_trainer.ModeKeys.PREDICT:
    return ps_trainer.ModelSpec(mode, predictions=predictions)
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  return ps_trainer.ModelSpec(
      mode, loss=loss, predictions=predictions,
      eval_metric_ops={
          "accuracy": tf.compat.v1.metrics.accuracy(labels, classes)})


def layers_model_fn(features, labels, mode, params):
  net = tf.compat.v1.layers.dense(features["x"], params.get("units", 16),
                                  activation=tf.nn.relu)
  return _spec(mode, tf.compat.v1.layers.dense(net, 2), labels)


def keras_model_fn(features, labels, mode):
  net = tf.keras.layers.Dense(16, activation="relu")(features["x"])
  return _spec(mode, tf.keras.layers.Dense(2)(net), labels)


def returns_a_dict(features, labels, mode):
  del labels, mode
  return {"loss": tf.reduce_sum(features["x"])}


def vector_loss(features, labels, mode):
  del labels
  weight = tf.compat.v1.get_variable("w", [6])
  return ps_trainer.ModelSpec(mode, loss=features["x"] * weight)


def raises(features, labels, mode):
  del features, labels, mode
  raise ValueError("units must be positive")


def unknown_argument(features, config):
  del features, config


def not_a_dataset(mode):
  del mode
  return [1, 2, 3]


def not_pairs(mode):
  del mode
  return tf.data.Dataset.from_tensor_slices(np.zeros([4, 2], np.float32))


def unequal_input_fn(mode, input_context):
  """Worker 1 holds a tenth of worker 0's examples: its epochs end sooner."""
  dataset = input_fn(mode, input_context, {"batch": 10})
  if mode == ps_trainer.ModeKeys.TRAIN and input_context.input_pipeline_id == 1:
    return dataset.take(2)
  return dataset


def unsharded_input_fn(mode):
  """Ignores its context: every worker reads every example, shuffled."""
  x, y = _arrays()
  del mode
  return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).shuffle(EXAMPLES).batch(20)


def keras3_model_fn(features, labels, mode):
  import keras  # pylint: disable=g-import-not-at-top  # Keras 3: no TF1 graphs.
  logits = keras.layers.Dense(2)(features["x"])
  return _spec(mode, logits, labels)


def batch_norm_model_fn(features, labels, mode):
  net = tf.compat.v1.layers.batch_normalization(
      features["x"], training=mode == ps_trainer.ModeKeys.TRAIN)
  return _spec(mode, tf.compat.v1.layers.dense(net, 2), labels)


def endless_eval_input_fn(mode, input_context):
  return input_fn(mode, input_context, {}).repeat()


def keras_optimizer_model_fn(features, labels, mode):
  spec = layers_model_fn(features, labels, mode, {})
  return ps_trainer.ModelSpec(mode, loss=spec.loss, optimizer=object())
