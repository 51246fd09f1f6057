"""The CNN of TensorFlow's multi-worker Keras tutorial, as a ps_trainer model_fn.

  python -m ps_trainer --model=examples/keras_cnn.py:model_fn \
      --input_fn=examples/keras_cnn.py:input_fn --train_steps=300
"""

import tensorflow as tf

import ps_trainer
from digits_input import input_fn  # pylint: disable=unused-import  (--input_fn=keras_cnn.py:input_fn)


def model_fn(features, labels, mode):
  # New layers on every call: the trainer calls model_fn once per graph (train, eval, serving).
  logits = tf.keras.Sequential([
      tf.keras.layers.Conv2D(32, 3, activation="relu"),
      tf.keras.layers.MaxPooling2D(),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(64, activation="relu"),
      tf.keras.layers.Dense(10),
  ])(features)
  classes = tf.argmax(logits, axis=1)
  predictions = {"classes": classes, "probabilities": tf.nn.softmax(logits)}
  if mode == ps_trainer.ModeKeys.PREDICT:
    return ps_trainer.ModelSpec(mode, predictions=predictions)
  loss = tf.reduce_mean(
      tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
  return ps_trainer.ModelSpec(
      mode, loss=loss, predictions=predictions,
      eval_metric_ops={"accuracy": tf.compat.v1.metrics.accuracy(labels, classes)})
