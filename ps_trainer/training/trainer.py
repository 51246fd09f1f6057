"""Runs the session loop of one training task: hooks, session, end of run.

train_graph.py builds the graph; here it is trained, alone (local mode) or as
one replica of a cluster, where the session target and the end-of-run
signals differ.
"""

import dataclasses
import os
from typing import Optional

import tensorflow as tf

from ps_trainer.cluster import host_cores
from ps_trainer.cluster import repeats
from ps_trainer.cluster import server as server_lib
from ps_trainer.cluster import waits
from ps_trainer.console import errors
from ps_trainer.datasets import data
from ps_trainer.faults import hang_vote as hang_vote_lib
from ps_trainer.faults import hung_step
from ps_trainer.faults import peers
from ps_trainer.faults import ps_runs
from ps_trainer.faults import stall_watch as stall_watch_lib
from ps_trainer.faults import stops
from ps_trainer.graph import train_graph
from ps_trainer.settings import config as config_lib
from ps_trainer.settings import run_config
from ps_trainer.settings import run_signature
from ps_trainer.training import checkpoints
from ps_trainer.training import hooks as hooks_lib
from ps_trainer.training import session as session_lib
from ps_trainer.training import step_record
from ps_trainer.training import sync
from ps_trainer.training import tracing

SUMMARY_STEPS = 100


class Diverged(RuntimeError):
  """The loss became NaN or Inf. The message is one line."""


# What a finished run still does; a signal from then on stops no training.
CLOSING = "closing the finished run's session, then exporting it"
FINISHING = "exporting the finished run"


def replicas_per_global_step(cfg: config_lib.Config) -> int:
  """Worker steps one global step takes: one async, or the aggregated
  replicas' in sync."""
  return cfg.train.replicas_to_aggregate if cfg.train.sync_replicas else 1


def examples_per_global_step(cfg: config_lib.Config) -> int:
  """Examples one global step consumes: one batch, or one per aggregated replica."""
  return cfg.data.batch_size * replicas_per_global_step(cfg)


@dataclasses.dataclass
class _Hooks:
  every_replica: list
  chief_only: list
  progress: hooks_lib.ProgressHook
  result: Optional[hooks_lib.ResultHook]  # The chief's.
  stall_watch: Optional[stall_watch_lib.StallWatchHook]  # A cluster task's.


def train(cfg: config_lib.Config, dataset: data.DataSet, target: str = "",
          stop: Optional[stops.StopRequest] = None) -> Optional[dict]:
  """build() then run(): trains to --train_steps, or until `stop` is requested."""
  return run(cfg, build(cfg, dataset), target, stop)


def build(cfg: config_lib.Config,
          dataset: data.DataSet) -> train_graph.TrainGraph:
  """This task's training graph. On the chief it also readies --log_dir:
  a checkpoint file that names another directory's checkpoints (the directory
  was moved or copied) is rewritten to name its own, which must fit this
  model.

  Raises:
    checkpoints.ForeignCheckpointError: the chief's --log_dir holds
      checkpoints of another model.
    checkpoints.MissingCheckpointError: its newest checkpoint is elsewhere,
      or some of its files are gone.
  """
  tg = train_graph.build_graph(cfg, dataset)
  if cfg.is_chief:  # Only the chief restores and saves.
    moved_from = checkpoints.relocate(cfg.train.log_dir)
    if moved_from:
      errors.say(f"{cfg.task_name}: the checkpoint file of --log_dir named "
                 f"{moved_from} (the directory was moved or copied); it now "
                 f"names the checkpoints in {cfg.train.log_dir}")
    checkpoints.check_log_dir(cfg.train.log_dir, tg.model_variables)
  return tg


def run(cfg: config_lib.Config, tg: train_graph.TrainGraph, target: str = "",
        stop: Optional[stops.StopRequest] = None) -> Optional[dict]:
  """Trains the graph of build() to --train_steps, or until `stop` is requested.

  Args:
    cfg: the run's configuration.
    tg: build(cfg, ...).
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
  if cfg.is_chief and cfg.train.log_dir:
    run_config.write(cfg)
  session_config = (server_lib.session_config(cfg.cluster) if cfg.cluster
                    else None)
  others = peers.Peers(cfg, tg, target, session_config, stop)
  hooks = _hooks(cfg, tg, target, session_config, stop, others)
  # During one of the chief's steps the others may complete a few more.
  tg.chief_start.remember_steps(lambda: hooks.progress.last_global_step,
                                margin=cfg.num_workers + 1)
  others.add_last_resorts()
  try:
    try:
      _run_session(cfg, tg, target, session_config, hooks, others, stop)
    except (Diverged, waits.Stopped):
      _leave(others, hooks.stall_watch, finished=False)
      raise
    result = hooks.result.result if hooks.result else None  # The chief's.
    # The chief finished once it has its result (a stop in the last step
    # leaves the run finished); another replica, unless it was stopped.
    _leave(others, hooks.stall_watch,
           finished=result is not None if cfg.is_chief else not stop.requested)
  finally:
    if hooks.stall_watch is not None:
      hooks.stall_watch.finished()
    for hook in hooks.every_replica:
      # Their end() is skipped when the session closes on an error: the step
      # record's buffer would wait for the interpreter's flush, which
      # process_end may skip, and the chief's sync thread would go on.
      if isinstance(hook, (step_record.StepRecordHook,
                           sync.SyncReplicasHook)):
        hook.close()
  # A stop that came in the last step leaves a finished run, not one to go on.
  if stop.requested and result is None:
    if cfg.is_chief:
      print(f"{cfg.task_name}: stopped on {stop.signal_name}; final checkpoint "
            f"{checkpoints.latest(cfg.train.log_dir)}; the same command "
            "continues from it", flush=True)
    else:
      print(f"{cfg.task_name}: stopped on {stop.signal_name}"
            f"{_where_stopped(hooks.progress.last_global_step, cfg)}",
            flush=True)
  elif result is None and not cfg.is_chief:
    # Its own log, on its own host, tells a finished worker from a killed one.
    print(f"{cfg.task_name}: done: the run reached --train_steps="
          f"{cfg.train.train_steps}", flush=True)
    _say_if_unsaved(cfg, others)
  return result


def _say_if_unsaved(cfg: config_lib.Config, others: peers.Peers) -> None:
  """An async worker trains on without its chief, to the end of the run if
  the chief is gone for good; what it trained is then on the PS tasks only."""
  gone = others.chief_gone()
  if gone:
    errors.warn(
        f"{cfg.task_name}: the chief ({gone}) does not answer, so nothing has "
        "saved the steps since its last checkpoint, nor written result.json "
        "or the export: the model is only on the PS tasks, which keep it "
        f"until they give up (--wait_timeout_secs={cfg.train.wait_timeout_secs:g}"
        "); start the chief again with its command to save it")


def _where_stopped(read_step: Optional[int], cfg: config_lib.Config) -> str:
  """The end of a stopped worker's last line: where it stopped, and what
  next. `read_step` is the global step its last step read (before the
  step's update)."""
  if read_step is None:
    return "; the same command rejoins the run"
  if read_step + 1 >= cfg.train.train_steps:
    return (f" at global step {read_step + 1}, the run's last; nothing is left "
            "to train")
  return f" at global step {read_step}; the same command rejoins the run"


def _leave(others: peers.Peers,
           watch: Optional[stall_watch_lib.StallWatchHook],
           finished: bool) -> None:
  """Tells the PS tasks this replica is done (`finished` the run, or stopped
  before its end), within the stall watch's bound at the end of a run: a PS
  that stopped serving would hold it forever."""
  if watch is not None:
    watch.ending()  # After a clean close TF's end() did; again is harmless.
  others.leave(finished)


def _run_session(cfg, tg: train_graph.TrainGraph, target: str, session_config,
                 hooks: _Hooks, others: peers.Peers,
                 stop: stops.StopRequest) -> None:
  """The session loop: train until a hook says stop."""
  watch = hooks.stall_watch

  def before_session():
    if watch is not None:
      watch.session_starting()
    others.wait()

  with tg.graph.as_default():
    session = session_lib.monitored_session(
        who=cfg.task_name, is_chief=cfg.is_chief, target=target,
        config=session_config, scaffold=_scaffold(tg),
        # The watch times the step alone, then the other hooks' work to its
        # tail.
        first_hooks=[watch] if watch else [],
        hooks=hooks.every_replica + ([watch.tail()] if watch else []),
        chief_hooks=hooks.chief_only,
        log_dir=cfg.train.log_dir if cfg.is_chief else None,
        save_checkpoint_secs=cfg.train.save_checkpoints_secs,
        save_checkpoint_steps=cfg.train.save_checkpoints_steps,
        save_summaries_steps=SUMMARY_STEPS,
        before_session=before_session,
        stopping=lambda: stop.requested,
        on_run_done=watch.run_done if watch else lambda: None)
    try:
      with session:
        while not session.should_stop():
          session.run(tg.train_op)
    except tf.errors.InvalidArgumentError as e:
      # Compiled runs (session.py) raise without `op`; the message names it.
      check = train_graph.LOSS_CHECK_NAME
      if (check not in (e.op.name if e.op is not None else "") and
          f"{{{{node {check}}}}}" not in (e.message or "")):
        raise
      raise Diverged(_diverged_message(cfg, hooks.progress)) from None


def _diverged_message(cfg, progress: hooks_lib.ProgressHook) -> str:
  where = (f"at global step {progress.last_global_step + 1}"
           if progress.last_global_step is not None else "at the first step")
  message = (f"the training loss became NaN or Inf {where}; training stopped "
             "before that step changed any variable. Lower --learning_rate "
             f"(now {cfg.train.learning_rate:g})")
  if cfg.is_chief and cfg.train.log_dir:
    newest = checkpoints.latest(cfg.train.log_dir)
    message += (f"; the last good checkpoint is {newest}" if newest
                else "; no checkpoint was written")
  return message


def _hooks(cfg, tg: train_graph.TrainGraph, target: str, session_config,
           stop: stops.StopRequest, others: peers.Peers) -> _Hooks:
  per_step = examples_per_global_step(cfg)
  throughput = hooks_lib.Throughput(cfg.train.train_steps,
                                    skip_steps=_traced_steps(cfg))
  progress = hooks_lib.ProgressHook(
      cfg.task_name, tg.loss, tg.global_step_read, cfg.train.train_steps,
      per_step, cfg.train.log_every_steps, throughput,
      examples_seen=tg.examples_seen, replicas=replicas_per_global_step(cfg))
  every_replica = [
      hooks_lib.StopOnRequestHook(stop),
      hooks_lib.InputInitHook(tg.train_input.initializer,
                              tg.train_input.feed_dict),
      hooks_lib.ReleaseInputThreadHook(
          lambda: host_cores.release_threads(data.INPUT_THREAD_NAME)),
      hooks_lib.StopAtStepHook(cfg.train.train_steps), progress,
      *tg.training_hooks]
  stall_watch = None
  if cfg.cluster:
    stall_watch = stall_watch_lib.StallWatchHook(
        stop, others.stall_reason, cfg.train.wait_timeout_secs,
        restart_if=others.answer_for_a_restart,
        start_peers=others.session_peers,
        silent_when_named=others.silent_when_named,
        hang_restarts=not cfg.train.sync_replicas,
        sync_replica=(_sync_replica(cfg, tg, target)
                      if cfg.train.sync_replicas else None),
        is_chief=cfg.is_chief, silent_ps=others.silent_ps)
  if cfg.train.trace_steps:
    every_replica.append(tracing.TraceHook(
        cfg.train.trace_steps, os.path.join(cfg.train.log_dir, "traces"),
        _file_stem(cfg), cfg.task_name))
  if cfg.train.record_steps:
    every_replica.append(step_record.StepRecordHook(
        os.path.join(cfg.train.log_dir, "steps", f"{_file_stem(cfg)}.jsonl"),
        tg.loss, tg.global_step_read, tg.applied_step))
  sync_hook = None
  if tg.sync_optimizer is not None:
    sync_hook = _sync_hook(cfg, tg, target, session_config, stop, others)
    every_replica.append(sync_hook)
  if not cfg.is_chief:
    return _Hooks(every_replica, [], progress, None, stall_watch)
  chief_only = [hooks_lib.PublishHook(
      tg.signature, run_signature.encode(tg.own_signature))]
  if sync_hook is not None:
    # Chief hooks end before the checkpoint saver: no step lands mid-save.
    chief_only.append(sync_hook.final_checkpoint_guard())
  result = hooks_lib.ResultHook(
      tg.evaluate, tg.global_step, throughput, per_step, _result_fields(cfg),
      cfg.train.log_dir, progress,
      on_written=lambda: stop.finishing(CLOSING))
  every_replica.append(result)  # Last: after the final checkpoint and release.
  return _Hooks(every_replica, chief_only, progress, result, stall_watch)


def _traced_steps(cfg: config_lib.Config) -> int:
  """Global steps from a process's first until every worker has traced its
  --trace_steps (TraceHook counts its own steps), were they all to run at
  the same speed; 0 without tracing.

  The chief says so when a fresh run is too short to measure its speed
  after them: steps_per_sec then falls back to the whole run.
  """
  if not cfg.train.trace_steps:
    return 0
  own_steps = tracing.SKIP_STEPS + cfg.train.trace_steps
  steps = -(-own_steps * cfg.num_workers // replicas_per_global_step(cfg))
  if cfg.is_chief and steps >= cfg.train.train_steps - 1:
    errors.warn(f"--trace_steps={cfg.train.trace_steps} traces about the "
                f"first {steps} global steps, and --train_steps="
                f"{cfg.train.train_steps} leaves none after them: "
                "steps_per_sec in result.json counts the slower traced "
                f"steps; with --train_steps={10 * steps} or more it would "
                "not")
  return steps


def _sync_replica(cfg, tg: train_graph.TrainGraph, target: str
                  ) -> hung_step.SyncReplica:
  """What a sync replica's stall watch reads on the PS tasks to tell a hung
  step: the hang vote and the global step, through one bounded runner."""
  runs = ps_runs.PsRuns(target, cfg.cluster)
  return hung_step.SyncReplica(
      vote=hang_vote_lib.HangVote(runs, cfg.cluster),
      global_step=ps_runs.global_step_reader(runs, tg.global_step.device),
      last_step=cfg.train.train_steps, is_chief=cfg.is_chief)


def _file_stem(cfg: config_lib.Config) -> str:
  """"local", "chief", "worker-1": names this task's files."""
  return cfg.task_name.replace(" ", "-")


def _scaffold(tg: train_graph.TrainGraph) -> tf.compat.v1.train.Scaffold:
  """The chief keeps a model the PS holds (resume.py); the signature is set
  by the chief's PublishHook, so readiness does not wait for it."""
  with tg.graph.as_default():
    ready = waits.report_uninitialized(
        tg.model_variables + tf.compat.v1.local_variables())
    return tf.compat.v1.train.Scaffold(
        init_op=tf.no_op(name="init_in_init_fn"),
        init_fn=tg.chief_start.init_fn, saver=tg.saver, ready_op=ready,
        ready_for_local_init_op=tg.model_not_ready)


def _sync_hook(cfg, tg: train_graph.TrainGraph, target: str, session_config,
               stop: stops.StopRequest, others: peers.Peers):
  def new_session():
    return repeats.session(target, graph=tg.graph, config=session_config)
  workers_done = None
  if tg.done_signals is not None and cfg.num_workers > 1:
    others_done = tg.done_signals.others_done
    workers_done = lambda session: int(session.run(others_done))
  return sync.SyncReplicasHook(
      tg.sync_optimizer, cfg.is_chief, cfg.num_workers,
      session_factory=new_session if cfg.cluster else None,
      workers_done=workers_done, stop=stop,
      others_gone=others.others_gone if cfg.cluster else None,
      restarted=lambda: tg.chief_start.resumed_mid_run,
      last_step=cfg.train.train_steps,
      ready_timeout_secs=cfg.train.wait_timeout_secs)


def _result_fields(cfg: config_lib.Config) -> dict:
  """result.json's settings; with an input_fn, the input's own batches
  count (examples_per_sec), so there is no --dataset or --batch_size."""
  own_input = bool(cfg.model.input_fn)
  return dict(
      config=run_config.of(cfg), input_fn=cfg.model.input_fn or None,
      sync_replicas=cfg.train.sync_replicas,
      replicas_to_aggregate=cfg.train.replicas_to_aggregate,
      num_workers=cfg.num_workers, num_ps=cfg.num_ps,
      mode="cluster" if cfg.cluster else "local",
      model=cfg.model.model, dataset=None if own_input else cfg.data.dataset,
      batch_size=None if own_input else cfg.data.batch_size,
      optimizer=cfg.train.optimizer,
      learning_rate=cfg.train.learning_rate,
      train_steps=cfg.train.train_steps)
