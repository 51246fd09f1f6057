"""ps_trainer: one task of a TensorFlow 1 parameter-server training job.

Usage:
  python -m ps_trainer [flags]                      # train alone (local mode)
  python -m ps_trainer --ps_hosts=H:P,... --worker_hosts=H:P,...
      --job_name=ps|worker|evaluator --task_index=N [flags]  # one task
  TF_CONFIG='{"cluster": ..., "task": ...}' python -m ps_trainer [flags]

The role comes from --job_name/--task_index, else from TF_CONFIG (as Kubeflow
writes it), else the process trains alone with the same graph. Worker 0 (or
the TF_CONFIG chief) is the chief: it checkpoints into --log_dir, evaluates
the test split at the end, writes <log_dir>/result.json and exports the model
to <log_dir>/export/<step>/. PS tasks exit once every worker is done. An
evaluator scores each new checkpoint into <log_dir>/eval.json (evaluator.py).
`./launch.sh local` starts a whole cluster on this machine. Flags: --helpfull.
"""

import errno
import os
import sys

# TensorFlow's C++ start-up chatter drowns the progress lines; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags as absl_flags

from ps_trainer import errors
from ps_trainer import flags as flags_lib
from ps_trainer import output_dir
from ps_trainer import process_end

FLAGS = absl_flags.FLAGS
TRAINER_FLAGS = flags_lib.define_flags()


def _fail(message: str, status: int = 2) -> None:
  """One clear line on stderr and a non-zero exit, never a traceback.

  Status 2: the input was wrong; 1: the run failed (a peer never answered,
  the loss diverged, TensorFlow stopped it).
  """
  print(f"ps_trainer: error: {message}", file=sys.stderr, flush=True)
  sys.exit(status)


def main(argv) -> int:
  if len(argv) > 1:  # absl's UsageError would print the whole help first.
    _fail(f"unexpected arguments {' '.join(argv[1:])!r}; every setting is a "
          "--flag (see --helpfull)")
  # Only pure modules so far: bad flags and TF_CONFIG answer in a blink,
  # before TensorFlow loads.
  from ps_trainer import cluster as cluster_lib
  from ps_trainer import config as config_lib
  try:
    cfg = config_lib.from_flag_values(FLAGS.flag_values_dict(),
                                      os.environ.get("TF_CONFIG", ""))
  except (cluster_lib.ClusterError, config_lib.ConfigError) as e:
    _fail(str(e))
  created = _check_log_dir(cfg.train.log_dir) if cfg.writes_log_dir else []
  if not cfg.is_chief:
    created = []  # Left for the chief, which may be about to write there.
  if os.environ.get("PS_TRAINER_CHECK_ONLY"):
    # `launch.sh local` checks the chief's flags so before it starts any task:
    # a mistake is then one line, not one per task among the launcher's own.
    return 0
  try:
    return _run_task(cfg)
  finally:
    output_dir.remove_if_empty(created)


def _check_log_dir(log_dir: str) -> list:
  """Fails in one line now, not after training, if --log_dir is unusable.

  Returns:
    The directories it created, deepest first.
  """
  try:
    return output_dir.prepare(log_dir, "--log_dir")
  except output_dir.OutputDirError as e:
    _fail(str(e))


def _run_task(cfg) -> int:
  """Runs this task's role. Errors end it with one line: status 2 for bad
  input, 1 for a failed run; a stop signal ends it with 128 + its number."""
  stop = _receive_stop_signals(cfg)
  from ps_trainer import host_cores  # pylint: disable=g-import-not-at-top
  if cfg.cluster is not None and cfg.train.pin_cpus:
    host_cores.pin_task(cfg.cluster)  # Before TensorFlow starts its threads.
  from ps_trainer import quiet_import  # pylint: disable=g-import-not-at-top
  tf = quiet_import.tensorflow()
  from ps_trainer import checkpoints
  from ps_trainer import data
  from ps_trainer import evaluator
  from ps_trainer import export
  from ps_trainer import finished_run
  from ps_trainer import models
  from ps_trainer import ps_task
  from ps_trainer import run_signature
  from ps_trainer import server as server_lib
  from ps_trainer import trainer
  from ps_trainer import waits

  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  info = cfg.cluster
  dataset = None
  try:
    if info is not None and info.is_ps:
      return ps_task.run_ps(info, stop, cfg.train.wait_timeout_secs)
    dataset = data.load(cfg.data.dataset, cfg.data.data_dir,
                        cfg.data.data_path)
    if info is not None and info.job_name == "evaluator":
      evaluator.run(cfg, dataset, stop)
      return 0
    target = ""
    if info is not None:
      target = server_lib.start_server(info).target
    graph = trainer.build(cfg, dataset)  # Its errors come before any output.
    print(f"{_describe(cfg)}; log dir {cfg.train.log_dir or '(none)'}"
          f"{host_cores.pinned_note()}", flush=True)
    if info is not None:
      earlier = finished_run.earlier_result(cfg.train.log_dir,
                                            cfg.train.train_steps)
      if earlier and not finished_run.cluster_restarted(cfg, stop):
        if cfg.is_chief:
          stop.ended("exporting the finished run")
          finished_run.export_alone(cfg, dataset, earlier, stop)
        else:
          finished_run.say_over(cfg, earlier)
        return 0
    result = trainer.run(cfg, graph, target, stop)
    if result is None:
      return stop.exit_status() if stop.requested else 0
    # A finished run, on the chief or alone; a stop during its last step
    # does not cut its export short, nor make it count as stopped.
    stop.ended("exporting the finished run")
    export.export_and_record(cfg, dataset, result)
    return 0
  except (data.DataError, models.ModelError, server_lib.ServerError,
          run_signature.MismatchError, evaluator.EvaluatorError,
          checkpoints.ForeignCheckpointError,
          checkpoints.MissingCheckpointError) as e:
    _fail(str(e))
  except (waits.WaitTimeout, trainer.Diverged, export.ExportError) as e:
    _fail(str(e), status=1)
  except waits.Stopped as e:
    print(f"ps_trainer: {e}", file=sys.stderr, flush=True)
    return stop.exit_status()
  except OSError as e:  # Python's own file work: result.json, step records.
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
      _fail_disk_full(f"{e.strerror}: {e.filename}")
    if os.environ.get("PS_TRAINER_TRACEBACK"):
      raise
    where = f"{e.filename}: " if e.filename else ""
    _fail(f"the run stopped on a file error: {where}{e.strerror or e} "
          "(PS_TRAINER_TRACEBACK=1 shows the traceback)", status=1)
  except tf.errors.ResourceExhaustedError as e:
    if _disk_full(e.message):  # TF reports ENOSPC as resource exhaustion too.
      _fail_disk_full(errors.first_line(e.message))
    _fail(f"out of memory ({errors.first_line(e.message)}); the model is too "
          f"large for this host: {_smaller_model(cfg)}")
  except tf.errors.OpError as e:
    if os.environ.get("PS_TRAINER_TRACEBACK"):
      raise
    if (isinstance(e, tf.errors.InvalidArgumentError)
        and "Cannot parse tensor from proto" in (e.message or "")):
      # TF's words when a variable's initial value has too many elements to
      # describe; with the tables in play, the flags that size them.
      _fail(f"a variable is too large for TensorFlow to create"
            f"{' (' + e.op.name + ')' if e.op is not None else ''}: "
            f"{_smaller_model(cfg)}")
    # A record read during training can be bad where the start-up check
    # did not look; TF's message does not say which file holds it.
    if dataset is not None and data.may_be_bad_records(dataset, e):
      bad = data.find_bad_records(dataset)
      if bad:
        _fail(bad)
    where = f" at {e.op.name}" if e.op is not None else ""
    _fail(f"TensorFlow stopped the run: {type(e).__name__}{where}: "
          f"{errors.first_line(e.message)} (PS_TRAINER_TRACEBACK=1 shows the "
          "traceback)", status=1)


def _fail_disk_full(detail: str) -> None:
  _fail(f"a file system is full ({detail}); free space there (--log_dir "
        "holds the checkpoints, summaries and export) and run the same "
        "command again: it continues from the newest checkpoint", status=1)


def _disk_full(message: str) -> bool:
  """Whether a ResourceExhaustedError is a full disk or quota, not memory."""
  return any(words in (message or "") for words in (
      "No space left on device", "Disk quota exceeded"))


def _smaller_model(cfg) -> str:
  """What to lower when the model does not fit: the flags that size it most."""
  if cfg.model.model == "wide_deep":
    return (f"lower --vocab_size={cfg.model.vocab_size} or --embedding_dim="
            f"{cfg.model.embedding_dim} (./launch.sh plan shows the bytes on "
            "each PS)")
  return "lower --hidden_units or --batch_size"


def _receive_stop_signals(cfg):
  """From here on SIGINT/SIGTERM request a clean stop (stops.py)."""
  from ps_trainer import stops
  how = "stopping after the current step"
  grace_secs = stops.GRACE_SECS
  if cfg.cluster is not None and cfg.cluster.is_ps:
    how = "stopping once the workers are done"
    grace_secs = stops.PS_GRACE_SECS
  elif cfg.cluster is not None and cfg.cluster.job_name == "evaluator":
    how = "stopping after the current evaluation"
  elif cfg.is_chief:
    how += ", with a final checkpoint"
  stop = stops.StopRequest(cfg.task_name, how, grace_secs)
  stop.install()
  return stop


def _describe(cfg) -> str:
  replicas = cfg.train.replicas_to_aggregate
  mode = (f"sync, {replicas} replica{'s' if replicas > 1 else ''} per step"
          if cfg.train.sync_replicas else "async")
  if cfg.cluster is None:
    where = "local mode (one process, no cluster)"
    mode = "sync" if cfg.train.sync_replicas else ""
  else:
    where = (f"{cfg.cluster.job_name} {cfg.cluster.task_index} of "
             f"{cfg.num_workers} worker(s) and {cfg.num_ps} PS")
  return (f"ps_trainer: {where}{', ' + mode if mode else ''}; "
          f"--model={cfg.model.model} "
          f"--dataset={cfg.data.dataset} --optimizer={cfg.train.optimizer} "
          f"--learning_rate={cfg.train.learning_rate:g} "
          f"--train_steps={cfg.train.train_steps}")


def _parse_flags(argv):
  """absl's flag parsing, with a bad flag reported in one line (exit 2)."""
  try:
    return FLAGS(argv)
  except absl_flags.Error as e:
    _fail(errors.flag_error(e))


def run() -> None:
  process_end.run_then_finish(
      lambda: app.run(main, flags_parser=_parse_flags))
