"""A multilayer perceptron with tf.compat.v1.layers on the bundled digits.

  python -m ps_trainer --model=examples/layers_mlp.py:model_fn \
      --input_fn=examples/layers_mlp.py:input_fn --params='{"hidden_units": [128, 64]}'
"""

import tensorflow as tf

import ps_trainer
from digits_input import input_fn  # pylint: disable=unused-import  (--input_fn=layers_mlp.py:input_fn)


def model_fn(features, labels, mode, params):
  net = tf.compat.v1.layers.flatten(features)
  for units in params.get("hidden_units", [128, 64]):
    net = tf.compat.v1.layers.dense(net, units, activation=tf.nn.relu)
  logits = tf.compat.v1.layers.dense(net, 10)
  classes = tf.argmax(logits, axis=1)
  predictions = {"classes": classes, "probabilities": tf.nn.softmax(logits)}
  if mode == ps_trainer.ModeKeys.PREDICT:
    return ps_trainer.ModelSpec(mode, predictions=predictions)
  loss = tf.reduce_mean(
      tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
  return ps_trainer.ModelSpec(
      mode, loss=loss, predictions=predictions,
      eval_metric_ops={"accuracy": tf.compat.v1.metrics.accuracy(labels, classes)})
