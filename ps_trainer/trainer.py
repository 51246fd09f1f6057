"""Builds the training graph under the device function and runs the session loop.

The same graph trains alone in one process (local mode, no device function)
or as one replica of a cluster; only the device function, the session target
and the end-of-run signals differ.
"""

import dataclasses
import os
from typing import Callable, Optional

import tensorflow as tf

from ps_trainer import config as config_lib
from ps_trainer import data
from ps_trainer import hooks as hooks_lib
from ps_trainer import models
from ps_trainer import packing
from ps_trainer import peers
from ps_trainer import placement
from ps_trainer import resume
from ps_trainer import run_signature
from ps_trainer import server as server_lib
from ps_trainer import session as session_lib
from ps_trainer import step_record
from ps_trainer import stops
from ps_trainer import sync
from ps_trainer import tracing
from ps_trainer import waits

EVAL_BATCH_SIZE = 1000
SUMMARY_STEPS = 100
# Names the check that stops a run whose loss is no longer a number.
LOSS_CHECK_NAME = "loss_is_finite"


class Diverged(RuntimeError):
  """The loss became NaN or Inf. The message is one line."""


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
  evaluate: Callable  # (session) -> {"loss", "accuracy"} on the test split.
  saver: tf.compat.v1.train.Saver
  chief_start: resume.ChiefStart
  # Every global variable but the signature, and which of them lack a value.
  model_variables: list
  model_not_ready: tf.Tensor
  sync_optimizer: Optional[tf.compat.v1.train.SyncReplicasOptimizer]
  done_signals: Optional[server_lib.DoneSignals]
  # The chief's run signature on the PS (see run_signature.py), whether it
  # is there yet, and this task's own.
  signature: tf.Variable
  signature_published: tf.Tensor
  own_signature: dict


def examples_per_global_step(cfg: config_lib.Config) -> int:
  """Examples one global step consumes: one batch, or one per aggregated replica."""
  replicas = cfg.train.replicas_to_aggregate if cfg.train.sync_replicas else 1
  return cfg.data.batch_size * replicas


def build_graph(cfg: config_lib.Config, dataset: data.DataSet) -> TrainGraph:
  """Builds the training and evaluation graph for this task.

  Variables go to the PS tasks through the device function; in local mode
  there is none and everything stays in this process.
  """
  info = cfg.cluster
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(cfg.train.seed)
    device_fn = placement.device_function(info) if info else None
    with tf.compat.v1.device(device_fn):
      global_step = tf.compat.v1.train.get_or_create_global_step()
      global_step_read = _cache_global_step_read(graph, global_step)
      train_input = data.train_input(
          dataset, cfg.data.batch_size, num_shards=cfg.num_workers,
          shard_index=cfg.replica_index, seed=cfg.train.seed)
      # The evaluation graph first: it creates the variables, which the
      # packed reads of the training graph need (packing.py).
      test_input = data.test_input(dataset, EVAL_BATCH_SIZE)
      eval_sums = models.eval_sums(
          _logits(cfg, dataset, test_input.features), test_input.labels)
      trainable = tf.compat.v1.trainable_variables()
      wire_dtype = packing.WIRE_DTYPES[cfg.train.wire_dtype]
      reads = packing.PackedReads(trainable, wire_dtype) if info else None
      with tf.compat.v1.variable_scope(
          tf.compat.v1.get_variable_scope(),
          custom_getter=reads.variable_getter() if reads else None):
        logits = _logits(cfg, dataset, train_input.features)
      loss, accuracy = models.loss_and_accuracy(logits, train_input.labels)
      # The update depends on this check (and its gradient on the gradient's
      # own check), so a NaN or Inf loss stops the step before any variable
      # changes: the model and the checkpoints stay good.
      loss = tf.debugging.check_numerics(loss, "loss is NaN or Inf",
                                         name=LOSS_CHECK_NAME)
      optimizer = sync.make_optimizer(cfg.train.optimizer,
                                      cfg.train.learning_rate)
      sync_optimizer = None
      if cfg.train.sync_replicas:
        optimizer = sync_optimizer = sync.wrap_sync(
            optimizer, cfg.train.replicas_to_aggregate, cfg.num_workers)
      if reads is None:
        grads_and_vars = optimizer.compute_gradients(loss)
      else:
        grads_and_vars = packing.pack_gradients(
            packing.gradients(loss, trainable, reads), wire_dtype)
      applied_step = None
      if sync_optimizer is not None:
        # Sync keeps its own placement (its queues and local step).
        train_op = optimizer.apply_gradients(grads_and_vars,
                                             global_step=global_step)
      else:
        # The optimizer's constants (the learning rate) go where the updates
        # run, not to the worker, which would send them to the PS each step.
        with tf.device(global_step.device if reads else None):
          train_op, applied_step = _apply_and_count(
              optimizer, grads_and_vars, global_step)
      own_signature = run_signature.of(cfg, dataset.input_shape,
                                       dataset.num_classes)
      # Not checkpointed: the chief sets it afresh each start (PublishHook).
      signature = tf.compat.v1.get_variable(
          "ps_trainer/run_signature", trainable=False,
          initializer=tf.constant(run_signature.encode(own_signature)))
      signature_published = tf.compat.v1.is_variable_initialized(signature)
      # Only non-chief workers run it; spare the others TF's "never used" dump.
      getattr(signature_published, "mark_used", lambda: None)()
    tf.compat.v1.summary.scalar("loss", loss)
    tf.compat.v1.summary.scalar("train_accuracy", accuracy)
    model_variables = [v for v in tf.compat.v1.global_variables()
                       if v is not signature]
    with tf.compat.v1.device(info.task_device if info else None):
      model_not_ready = waits.report_uninitialized(model_variables)
      chief_start = resume.ChiefStart(model_variables, model_not_ready,
                                      global_step,
                                      sync=cfg.train.sync_replicas)
      # Not sharded: the chief writes the whole checkpoint into its own
      # --log_dir, so bare hosts need no shared file system.
      saver = chief_start.saver(sharded=False, max_to_keep=5)
    done_signals = server_lib.DoneSignals(info) if info else None
  return TrainGraph(
      graph=graph, global_step=global_step, global_step_read=global_step_read,
      applied_step=applied_step, loss=loss, train_op=train_op,
      train_input=train_input, evaluate=_evaluator(test_input, eval_sums),
      saver=saver, chief_start=chief_start, model_variables=model_variables,
      model_not_ready=model_not_ready, sync_optimizer=sync_optimizer,
      done_signals=done_signals,
      signature=signature, signature_published=signature_published,
      own_signature=own_signature)


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


def _cache_global_step_read(graph: tf.Graph, global_step) -> tf.Tensor:
  """Gives the hooks a plain read of the global step.

  Left to themselves they build a cond (initialized ? read : initial value)
  whose predicate, switch and branches sit on different tasks: three
  round trips between worker and PS on every step, on the step's critical
  path (seen in a --trace_steps trace). The model is initialized before any
  hook reads it, so the cond guards nothing here.
  """
  with tf.name_scope("global_step_read"):
    read = tf.identity(global_step.read_value())
  graph.add_to_collection(_GLOBAL_STEP_READ_KEY, read)
  return read


def _logits(cfg, dataset, features):
  return models.build_logits(cfg.model.model, features, dataset.input_shape,
                             dataset.num_classes, cfg.model.hidden_units)


def _evaluator(test_input: data.Input, sums):
  """Returns (session) -> exact test-set loss and accuracy."""
  def evaluate(session):
    session.run(test_input.initializer, feed_dict=test_input.feed_dict)
    loss_sum = correct = count = 0
    while True:
      try:
        batch_loss, batch_correct, batch_count = session.run(sums)
      except tf.errors.OutOfRangeError:
        break
      loss_sum += float(batch_loss)
      correct += float(batch_correct)
      count += int(batch_count)
    return {"loss": loss_sum / max(count, 1),
            "accuracy": correct / max(count, 1)}
  return evaluate


@dataclasses.dataclass
class _Hooks:
  every_replica: list
  chief_only: list
  progress: hooks_lib.ProgressHook
  result: Optional[hooks_lib.ResultHook]  # The chief's.


def train(cfg: config_lib.Config, dataset: data.DataSet, target: str = "",
          stop: Optional[stops.StopRequest] = None) -> Optional[dict]:
  """Trains to --train_steps, or until `stop` is requested.

  Args:
    cfg: the run's configuration.
    dataset: the loaded data set.
    target: this task's server target; "" in local mode.
    stop: this task's StopRequest (signals); None: nobody can ask.

  Returns:
    The result.json dict on the chief (and in local mode) when the run is
    finished, else None.

  Raises:
    Diverged: the loss became NaN or Inf.
    waits.WaitTimeout: a PS or the chief did not answer in time.
    waits.Stopped: a stop was requested while waiting for them.
  """
  stop = stop or stops.StopRequest(cfg.task_name)
  tg = build_graph(cfg, dataset)
  session_config = (server_lib.session_config(cfg.cluster) if cfg.cluster
                    else None)
  others = peers.Peers(cfg, tg, target, session_config, stop)
  hooks = _hooks(cfg, tg, target, session_config, stop, others)
  # During one of the chief's steps the others may complete a few more.
  tg.chief_start.remember_steps(lambda: hooks.progress.last_global_step,
                                margin=cfg.num_workers + 1)
  others.add_last_resorts()
  try:
    _run_session(cfg, tg, target, session_config, hooks, others, stop)
  except (Diverged, waits.Stopped):
    others.leave()
    raise
  others.leave()
  if stop.requested and cfg.is_chief:
    print(f"{cfg.task_name}: stopped on {stop.signal_name}; final checkpoint "
          f"{tf.train.latest_checkpoint(cfg.train.log_dir)}; the same command "
          "continues from it", flush=True)
  return hooks.result.result if hooks.result else None


def _run_session(cfg, tg: TrainGraph, target: str, session_config,
                 hooks: _Hooks, others: peers.Peers,
                 stop: stops.StopRequest) -> None:
  """The session loop: train until a hook says stop."""
  with tg.graph.as_default():
    session = session_lib.monitored_session(
        who=cfg.task_name, is_chief=cfg.is_chief, target=target,
        config=session_config, scaffold=_scaffold(tg),
        hooks=hooks.every_replica, chief_hooks=hooks.chief_only,
        log_dir=cfg.train.log_dir if cfg.is_chief else None,
        save_checkpoint_secs=cfg.train.save_checkpoints_secs,
        save_checkpoint_steps=cfg.train.save_checkpoints_steps,
        save_summaries_steps=SUMMARY_STEPS,
        before_session=others.wait,
        stopping=lambda: stop.requested)
    try:
      with session:
        while not session.should_stop():
          session.run(tg.train_op)
    except tf.errors.InvalidArgumentError as e:
      # Compiled runs (session.py) raise without `op`; the message names it.
      if (LOSS_CHECK_NAME not in (e.op.name if e.op is not None else "") and
          f"{{{{node {LOSS_CHECK_NAME}}}}}" not in (e.message or "")):
        raise
      raise Diverged(_diverged_message(cfg, hooks.progress)) from None


def _diverged_message(cfg, progress: hooks_lib.ProgressHook) -> str:
  where = (f"at global step {progress.last_global_step + 1}"
           if progress.last_global_step is not None else "at the first step")
  message = (f"the training loss became NaN or Inf {where}; training stopped "
             "before that step changed any variable. Lower --learning_rate "
             f"(now {cfg.train.learning_rate:g})")
  if cfg.is_chief and cfg.train.log_dir:
    newest = tf.train.latest_checkpoint(cfg.train.log_dir)
    message += (f"; the last good checkpoint is {newest}" if newest
                else "; no checkpoint was written")
  return message


def _hooks(cfg, tg: TrainGraph, target: str, session_config,
           stop: stops.StopRequest, others: peers.Peers) -> _Hooks:
  per_step = examples_per_global_step(cfg)
  throughput = hooks_lib.Throughput(cfg.train.train_steps)
  progress = hooks_lib.ProgressHook(
      cfg.task_name, tg.loss, tg.global_step_read, cfg.train.train_steps,
      per_step,
      cfg.train.log_every_steps, throughput)
  every_replica = [
      hooks_lib.StopOnRequestHook(stop),
      hooks_lib.InputInitHook(tg.train_input.initializer,
                              tg.train_input.feed_dict),
      hooks_lib.StopAtStepHook(cfg.train.train_steps), progress]
  if cfg.cluster:
    every_replica.append(hooks_lib.StallWatchHook(
        stop, others.stall_reason, cfg.train.wait_timeout_secs))
  if cfg.train.trace_steps:
    every_replica.append(tracing.TraceHook(
        cfg.train.trace_steps, os.path.join(cfg.train.log_dir, "traces"),
        _file_stem(cfg), cfg.task_name))
  if cfg.train.record_steps:
    every_replica.append(step_record.StepRecordHook(
        os.path.join(cfg.train.log_dir, "steps", f"{_file_stem(cfg)}.jsonl"),
        tg.loss, tg.global_step_read, tg.applied_step))
  if tg.sync_optimizer is not None:
    every_replica.append(
        _sync_hook(cfg, tg, target, session_config, stop, others))
  if not cfg.is_chief:
    return _Hooks(every_replica, [], progress, None)
  chief_only = [hooks_lib.PublishHook(
      tg.signature, run_signature.encode(tg.own_signature))]
  result = hooks_lib.ResultHook(
      tg.evaluate, tg.global_step, throughput, per_step, _result_fields(cfg),
      os.path.join(cfg.train.log_dir, "result.json"), progress)
  every_replica.append(result)  # Last: after the final checkpoint and release.
  return _Hooks(every_replica, chief_only, progress, result)


def _file_stem(cfg: config_lib.Config) -> str:
  """"local", "chief", "worker-1": names this task's files."""
  return cfg.task_name.replace(" ", "-")


def _scaffold(tg: TrainGraph) -> tf.compat.v1.train.Scaffold:
  """The chief keeps a model the PS holds (resume.py); the signature is set
  by the chief's PublishHook, so readiness does not wait for it."""
  with tg.graph.as_default():
    ready = waits.report_uninitialized(
        tg.model_variables + tf.compat.v1.local_variables())
    return tf.compat.v1.train.Scaffold(
        init_op=tf.no_op(name="init_in_init_fn"),
        init_fn=tg.chief_start.init_fn, saver=tg.saver, ready_op=ready,
        ready_for_local_init_op=tg.model_not_ready)


def _sync_hook(cfg, tg: TrainGraph, target: str, session_config,
               stop: stops.StopRequest, others: peers.Peers):
  def new_session():
    return tf.compat.v1.Session(target, graph=tg.graph, config=session_config)
  workers_done = None
  if tg.done_signals is not None and cfg.num_workers > 1:
    others_done = tg.done_signals.others_done
    workers_done = lambda session: int(session.run(others_done))
  return sync.SyncReplicasHook(
      tg.sync_optimizer, cfg.is_chief, cfg.num_workers,
      session_factory=new_session if cfg.cluster else None,
      workers_done=workers_done, stop=stop,
      others_gone=others.others_gone if cfg.cluster else None,
      restarted=lambda: tg.chief_start.resumed_mid_run)


def _result_fields(cfg: config_lib.Config) -> dict:
  return dict(
      sync_replicas=cfg.train.sync_replicas,
      replicas_to_aggregate=cfg.train.replicas_to_aggregate,
      num_workers=cfg.num_workers, num_ps=cfg.num_ps,
      mode="cluster" if cfg.cluster else "local",
      model=cfg.model.model, dataset=cfg.data.dataset,
      batch_size=cfg.data.batch_size, optimizer=cfg.train.optimizer,
      learning_rate=cfg.train.learning_rate,
      train_steps=cfg.train.train_steps)
