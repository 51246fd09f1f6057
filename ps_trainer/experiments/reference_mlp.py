"""The bench's reference MLP written as a user writes a model:
`./launch.sh bench --model=ps_trainer/experiments/reference_mlp.py:model_fn`.

The built-in `--model=mlp --hidden_units=256,256` on the same data, with
tf.compat.v1.layers instead of the built-in's own get_variable code: the
bench's figure for it says what the model contract costs a user's model.
"""

import tensorflow as tf

import ps_trainer


def model_fn(features, labels, mode, params):
  net = tf.compat.v1.layers.flatten(features)
  for units in params.get("hidden_units", [256, 256]):
    net = tf.compat.v1.layers.dense(net, units, activation=tf.nn.relu)
  logits = tf.compat.v1.layers.dense(net, 10)
  classes = tf.argmax(logits, axis=1)
  predictions = {"classes": classes, "probabilities": tf.nn.softmax(logits)}
  if mode == ps_trainer.ModeKeys.PREDICT:
    return ps_trainer.ModelSpec(mode, predictions=predictions)
  loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits))
  return ps_trainer.ModelSpec(
      mode, loss=loss, predictions=predictions,
      eval_metric_ops={
          "accuracy": tf.compat.v1.metrics.accuracy(labels, classes)})
