"""A wide & deep click model on tf.compat.v1.get_variable tables, with synthetic clicks.

  python -m ps_trainer --model=examples/wide_deep_clicks.py:model_fn \
      --input_fn=examples/wide_deep_clicks.py:input_fn --optimizer=adagrad --learning_rate=0.1

The model does not know the cluster: with more than one PS the trainer splits every
get_variable of at least twice --partition_min_bytes (4 MiB by default, so this 6.4 MB embedding
from --partition_min_bytes=3200000 down) over them, and the lookups below read either form.
"""

import numpy as np
import tensorflow as tf

import ps_trainer

VOCAB = 100_000  # Rows of each table; raw ids are hashed into them.
EMBEDDING_DIM = 16
IDS_PER_EXAMPLE = 6
DENSE_DIM = 4


def model_fn(features, labels, mode, params):
  vocab = params.get("vocab_size", VOCAB)
  ids = features["ids"]
  hashed = tf.SparseTensor(ids.indices, tf.math.floormod(ids.values, vocab), ids.dense_shape)
  wide_weights = tf.compat.v1.get_variable(
      "wide/weights", [vocab, 1], initializer=tf.compat.v1.zeros_initializer())
  embedding = tf.compat.v1.get_variable(
      "deep/embedding", [vocab, EMBEDDING_DIM],
      initializer=tf.compat.v1.truncated_normal_initializer(stddev=EMBEDDING_DIM ** -0.5))
  # The safe lookup gives an example without ids a zero row instead of dropping it.
  wide = tf.compat.v1.nn.safe_embedding_lookup_sparse(wide_weights, hashed, combiner="sum")
  net = tf.concat([
      tf.compat.v1.nn.safe_embedding_lookup_sparse(embedding, hashed, combiner="mean"),
      features["dense"]], axis=1)
  for units in params.get("hidden_units", [32, 16]):
    net = tf.compat.v1.layers.dense(net, units, activation=tf.nn.relu)
  logit = tf.squeeze(wide + tf.compat.v1.layers.dense(net, 1), axis=1)
  probability = tf.sigmoid(logit)
  classes = tf.cast(logit > 0, tf.int64)
  predictions = {"probabilities": probability, "classes": classes}
  if mode == ps_trainer.ModeKeys.PREDICT:
    return ps_trainer.ModelSpec(mode, predictions=predictions)
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
      labels=tf.cast(labels, tf.float32), logits=logit))
  return ps_trainer.ModelSpec(
      mode, loss=loss, predictions=predictions,
      eval_metric_ops={"accuracy": tf.compat.v1.metrics.accuracy(labels, classes)})


def synthetic_clicks(examples, seed):
  """(ids [examples, IDS_PER_EXAMPLE] int64 padded with -1, dense float32, labels int64).

  A click follows a hidden rule, so the model can learn it: each of 500 raw ids (spread over
  a range far larger than the tables) has a hidden weight, added to a linear score of the dense
  features. The rule is fixed (seed 0); `seed` draws the examples.
  """
  rule = np.random.default_rng(0)
  raw_ids = rule.choice(10**12, size=500, replace=False)
  id_weight = rule.normal(size=len(raw_ids))
  dense_weight = rule.normal(size=DENSE_DIM)
  rng = np.random.default_rng(seed)
  which = rng.integers(len(raw_ids), size=(examples, IDS_PER_EXAMPLE))
  present = np.arange(IDS_PER_EXAMPLE) < rng.integers(1, IDS_PER_EXAMPLE + 1, size=(examples, 1))
  ids = np.where(present, raw_ids[which], -1).astype(np.int64)
  dense = rng.normal(size=(examples, DENSE_DIM)).astype(np.float32)
  score = (id_weight[which] * present).sum(axis=1) + dense @ dense_weight
  return ids, dense, (score > 0).astype(np.int64)


def input_fn(mode, input_context, params):
  train = mode == ps_trainer.ModeKeys.TRAIN
  ids, dense, labels = synthetic_clicks(*((20_000, 1) if train else (4_000, 2)))
  dataset = tf.data.Dataset.from_tensor_slices(({"ids": ids, "dense": dense}, labels))
  dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  dataset = dataset.cache()
  if train:
    dataset = dataset.shuffle(20_000, seed=0)
  return dataset.batch(params.get("batch_size", 128)).map(_sparse_ids)


def _sparse_ids(features, labels):
  """Ids as a SparseTensor of the present (non-negative) ids: what the lookups read."""
  ids = features["ids"]
  present = tf.where(ids >= 0)
  sparse = tf.SparseTensor(present, tf.gather_nd(ids, present), tf.shape(ids, out_type=tf.int64))
  return dict(features, ids=sparse), labels
