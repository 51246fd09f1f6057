"""What the training graph needs of a model: its input, loss and scorer.

train_graph.py builds the cluster's side (global step, update, signature).
Every model is a model_fn here, a built-in one (models/) or a user's, and is
built through the same calls (user_model/graphs.py), so nothing past this
module asks where a model came from.
"""

import dataclasses
from typing import Callable, Optional

import tensorflow as tf

from ps_trainer import models
from ps_trainer.datasets import data
from ps_trainer.graph import packing
from ps_trainer.graph import placement
from ps_trainer.settings import config as config_lib
from ps_trainer.user_model import graphs
from ps_trainer.user_model import loading
from ps_trainer.user_model.spec import ModeKeys


@dataclasses.dataclass
class ModelParts:
  """A model built into the training graph.

  Attributes:
    train_input: this worker's training input.
    loss: the training loss (a scalar).
    evaluate: (training session) -> {"loss", "accuracy", "examples",
      "metrics"}: the held-out split's exact scores ("metrics" by name).
    trainable: the variables the update changes.
    reads: packed reads (packing.py), or None.
    optimizer: the model's own optimizer, or None for --optimizer's.
    training_hooks: the model's own SessionRunHooks.
    examples: the batch's example count, when the input decides it; else
      None (--batch_size).
  """
  train_input: data.Input
  loss: tf.Tensor
  evaluate: Callable
  trainable: list
  reads: Optional[packing.PackedReads] = None
  optimizer: object = None
  training_hooks: tuple = ()
  examples: Optional[tf.Tensor] = None


def model_of(cfg: config_lib.Config, dataset: data.DataSet,
             whole_tables: bool = False) -> loading.UserModel:
  """The run's model and input as functions on the contract: the user's
  model_fn or the built-in --model's, and the user's input_fn or
  --dataset's reader. `whole_tables` keeps a built-in's tables in one part
  (a graph that only restores checkpoints: a restore assembles the parts).

  Raises:
    ModelError: no built-in model is named so.
  """
  user = cfg.model.user
  if user is None:
    user = models.built_in(cfg.model.model, models.params_for(
        cfg.model.model, dataset.input_shape, dataset.num_classes,
        cfg.model.hidden_units, cfg.model.vocab_size, cfg.model.embedding_dim,
        table_parts=None if whole_tables else max(cfg.num_ps, 1)))
  if user.input_fn is None:
    user = dataclasses.replace(
        user, input_fn=models.input_fn(dataset, cfg.data.batch_size,
                                       cfg.train.seed),
        input_flag=f"--dataset={dataset.name}")
  return user


def build(cfg: config_lib.Config, dataset: data.DataSet,
          global_step: tf.Variable) -> ModelParts:
  """The run's model_fn on its input_fn, in the default
  graph under the caller's device function. Large variables are split over
  the PS tasks (--partition_min_bytes); in a cluster, each PS's variables
  that the model reads whole cross in one packed read.

  Raises:
    ModelFnError: a function broke the contract (ModelError: a built-in
      model cannot read this data).
  """
  user = model_of(cfg, dataset)
  partitioning = placement.size_partitioning_getter(
      cfg.num_ps, cfg.model.partition_min_bytes)
  train_input = graphs.train_input(user, cfg.num_workers, cfg.replica_index)
  # A user's input_fn batches by itself: count what it yields. --dataset's
  # batches are --batch_size.
  examples = (graphs.batch_size_of(train_input.features)
              if cfg.model.input_fn else None)
  graph = tf.compat.v1.get_default_graph()
  updates_before = set(graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))
  with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                   custom_getter=partitioning):
    spec = graphs.call_model_fn(user, train_input.features,
                                train_input.labels, ModeKeys.TRAIN)
  # Batch normalization's moving statistics, as Estimator users made their
  # train op wait for them: here the trainer builds the train op, so the loss
  # it minimizes waits for them instead.
  updates = [op for op in graph.get_collection(
      tf.compat.v1.GraphKeys.UPDATE_OPS) if op not in updates_before]
  loss = spec.loss
  if updates:
    with tf.control_dependencies(updates):
      loss = tf.identity(loss, name="loss_after_updates")
  trainable = tf.compat.v1.trainable_variables()
  reads = None
  if cfg.cluster is not None:
    # Once the model has made them: only then are their reads known.
    reads = packing.PackedReads(
        packing.densely_read(trainable),
        packing.WIRE_DTYPES[cfg.train.wire_dtype], global_step)
    packing.reroute_reads(trainable, reads)
  trained = graphs.model_variables(tf.compat.v1.get_default_graph())
  evaluation = graphs.Evaluation(
      user, lambda: graphs.eval_input(user), partitioning)
  return ModelParts(
      train_input=train_input, loss=loss,
      evaluate=evaluation.scorer(trained),
      trainable=trainable, reads=reads, optimizer=spec.optimizer,
      training_hooks=tuple(spec.training_hooks), examples=examples)
