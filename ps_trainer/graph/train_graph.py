"""The training graph of one task: variables under the device function, the
input pipeline, the model, its update, and what the session loop needs.

The same graph trains alone in one process (local mode, no device function)
or as one replica of a cluster; only the device function differs.
"""

import dataclasses
from typing import Callable, Optional

import tensorflow as tf

from ps_trainer.cluster import ps_flags
from ps_trainer.cluster import waits
from ps_trainer.datasets import data
from ps_trainer.graph import model_parts
from ps_trainer.graph import optimizers
from ps_trainer.graph import packing
from ps_trainer.graph import placement
from ps_trainer.graph import resume
from ps_trainer.graph import sync_replicas
from ps_trainer.settings import config as config_lib
from ps_trainer.settings import run_signature

# Names the check that stops a run whose loss is no longer a number.
LOSS_CHECK_NAME = "loss_is_finite"


@dataclasses.dataclass
class TrainGraph:
  """The ops a run needs, all in `graph`."""
  graph: tf.Graph
  global_step: tf.Variable
  global_step_read: tf.Tensor  # What every hook fetches: one read per step.
  # Async: the global step right after this step's own increment; else None.
  applied_step: Optional[tf.Tensor]
  loss: tf.Tensor
  train_op: tf.Operation
  train_input: data.Input
  # (session) -> {"loss", "accuracy", "examples", "metrics"} on the test split.
  evaluate: Callable
  saver: tf.compat.v1.train.Saver
  chief_start: resume.ChiefStart
  # Every global variable but the signature, and which of them lack a value.
  model_variables: list
  model_not_ready: tf.Tensor
  sync_optimizer: Optional[sync_replicas.SyncOptimizer]
  done_signals: Optional[ps_flags.DoneSignals]
  # The chief's run signature on the PS (see run_signature.py), whether it
  # is there yet, and this task's own.
  signature: tf.Variable
  signature_published: tf.Tensor
  own_signature: dict
  # A user's model_fn's own SessionRunHooks, for every replica.
  training_hooks: tuple = ()
  # Examples this worker's input yielded so far, this step's included, when
  # the batch size is the input's own (a user's input_fn); else None.
  examples_seen: Optional[tf.Tensor] = None


def build_graph(cfg: config_lib.Config, dataset: data.DataSet) -> TrainGraph:
  """Builds the training and evaluation graph for this task.

  Variables go to the PS tasks through the device function; in local mode
  there is none and everything stays in this process.
  """
  info = cfg.cluster
  graph = tf.Graph()
  with graph.as_default():
    # A user's input_fn that ignores its context still shuffles differently
    # on each worker: its ops' seeds derive from this one. Only the chief's
    # variable initializers run, so the model starts the same.
    tf.compat.v1.set_random_seed(cfg.train.seed + cfg.replica_index)
    device_fn = placement.device_function(info) if info else None
    with tf.compat.v1.device(device_fn):
      global_step = tf.compat.v1.train.get_or_create_global_step()
      model = model_parts.build(cfg, dataset, global_step)
      train_input, reads = model.train_input, model.reads
      global_step_read = _cache_global_step_read(
          graph, global_step, reads.global_step if reads else None)
      # The update depends on this check (and its gradient on the gradient's
      # own check), so a NaN or Inf loss stops the step before any variable
      # changes: the model and the checkpoints stay good.
      loss = tf.debugging.check_numerics(model.loss, "loss is NaN or Inf",
                                         name=LOSS_CHECK_NAME)
      train_op, applied_step, sync_optimizer = _update(
          cfg, loss, model.trainable, reads, global_step, model.optimizer)
      examples_seen = None
      if model.examples is not None:
        train_op, examples_seen = _count_examples(train_op, model.examples,
                                                  info)
      own_signature = run_signature.of(
          cfg, dataset.input_shape, dataset.num_classes,
          variables=model.trainable)
      signature, signature_published = _signature_variable(
          own_signature, on_ps=info is not None)
    tf.compat.v1.summary.scalar("loss", loss)
    model_variables = [v for v in tf.compat.v1.global_variables()
                       if v is not signature]
    with tf.compat.v1.device(info.task_device if info else None):
      model_not_ready = waits.report_uninitialized(model_variables)
      chief_start = resume.ChiefStart(model_variables, model_not_ready,
                                      global_step,
                                      sync=cfg.train.sync_replicas,
                                      last_step=cfg.train.train_steps,
                                      who=cfg.task_name)
      # Not sharded: the chief writes the whole checkpoint into its own
      # --log_dir, so bare hosts need no shared file system.
      saver = chief_start.saver(sharded=False, max_to_keep=5,
                                save_relative_paths=True)
    done_signals = ps_flags.DoneSignals(info) if info else None
  return TrainGraph(
      graph=graph, global_step=global_step, global_step_read=global_step_read,
      applied_step=applied_step, loss=loss, train_op=train_op,
      train_input=train_input, evaluate=model.evaluate,
      saver=saver, chief_start=chief_start, model_variables=model_variables,
      model_not_ready=model_not_ready, sync_optimizer=sync_optimizer,
      done_signals=done_signals,
      signature=signature, signature_published=signature_published,
      own_signature=own_signature, training_hooks=model.training_hooks,
      examples_seen=examples_seen)


def _wire_dtype(cfg: config_lib.Config):
  return packing.WIRE_DTYPES[cfg.train.wire_dtype]


def _count_examples(train_op, examples: tf.Tensor, info):
  """(the train op, which also adds the batch's examples to a local counter
  on this worker, the count after this step): no transfer, it stays beside
  the input. Fetching the count runs the step's own addition first."""
  with tf.compat.v1.device(info.task_device if info else None):
    counter = tf.compat.v1.get_local_variable(
        "ps_trainer/examples_seen", initializer=tf.constant(0, tf.int64),
        trainable=False)
    with tf.control_dependencies([train_op]):
      count = counter.assign_add(examples)
  return tf.group(train_op, count, name="train_and_count"), count


def _update(cfg: config_lib.Config, loss, trainable, reads, global_step,
            optimizer=None):
  """The step's update: (train op, the global step it applied or None, the
  sync optimizer or None). `reads` is None in local mode; `optimizer` is the
  model's own, else --optimizer's (with packed reads only its
  apply_gradients is used: gradients are taken through the packed values)."""
  if optimizer is None:
    optimizer = optimizers.make_optimizer(cfg.train.optimizer,
                                          cfg.train.learning_rate)
  sync_optimizer = None
  if cfg.train.sync_replicas:
    optimizer = sync_optimizer = sync_replicas.SyncOptimizer(
        optimizer, cfg.train.replicas_to_aggregate, cfg.num_workers,
        cfg.replica_index)
  if reads is None:
    grads_and_vars = optimizer.compute_gradients(loss)
  else:
    grads_and_vars = packing.pack_gradients(
        packing.gradients(loss, trainable, reads), _wire_dtype(cfg),
        factored=cfg.train.factored_gradients)
  if sync_optimizer is not None:
    # Sync keeps its own placement (its queues and local step).
    train_op = optimizer.apply_gradients(grads_and_vars,
                                         global_step=global_step)
    return train_op, None, sync_optimizer
  # The optimizer's constants (the learning rate) go where the updates run,
  # not to the worker, which would send them to the PS each step.
  with tf.device(global_step.device if reads else None):
    train_op, applied_step = _apply_and_count(
        optimizer, grads_and_vars, global_step)
  return train_op, applied_step, None


def _signature_variable(own_signature: dict, on_ps: bool):
  """The run signature's variable (on PS 0 if `on_ps`) and whether it is set.

  On PS 0, not where the byte balancer would put it: that depends on the
  model's variables, so a worker whose flags differ from the chief's would
  look for it on another PS and wait for it rather than name the difference.
  Not checkpointed: the chief sets it afresh each start (PublishHook).
  """
  with tf.compat.v1.device("/job:ps/task:0" if on_ps else None):
    signature = tf.compat.v1.get_variable(
        "ps_trainer/run_signature", trainable=False,
        initializer=tf.constant(run_signature.encode(own_signature)))
  published = tf.compat.v1.is_variable_initialized(signature)
  # Only non-chief workers run it; spare the others TF's "never used" dump.
  getattr(published, "mark_used", lambda: None)()
  return signature, published


def _apply_and_count(optimizer, grads_and_vars, global_step):
  """Applies the update, then adds 1 to the global step, as apply_gradients
  does; also returns the global step read right after this step's increment
  (step_record.py's staleness; another worker's increment may slip in)."""
  update = optimizer.apply_gradients(grads_and_vars)
  with tf.control_dependencies([update]), \
      tf.compat.v1.colocate_with(global_step):
    increment = global_step.assign_add(1, read_value=False)
    with tf.control_dependencies([increment]):
      applied_step = global_step.read_value()
  return increment, applied_step


# Where TF's hooks (checkpoints, summaries, StopAtStepHook) find the tensor
# they read the global step through (training_util.GLOBAL_STEP_READ_KEY).
_GLOBAL_STEP_READ_KEY = "global_step_read_op_cache"


def _cache_global_step_read(graph: tf.Graph, global_step,
                            packed: Optional[tf.Tensor]) -> tf.Tensor:
  """Gives the hooks one read of the global step, without a cond: the value
  packed with the variables (packing.py) when there is one, which costs the
  step no transfer of its own; else a read of the variable.

  Left to themselves they build a cond (initialized ? read : initial value)
  whose predicate, switch and branches sit on different tasks: three
  round trips between worker and PS on every step, on the step's critical
  path (seen in a --trace_steps trace). The model is initialized before any
  hook reads it, so the cond guards nothing here.
  """
  with tf.name_scope("global_step_read"):
    read = tf.identity(packed if packed is not None
                       else global_step.read_value())
  graph.add_to_collection(_GLOBAL_STEP_READ_KEY, read)
  return read
