"""One task's role, run once TensorFlow is loaded, and every way it ends.

main.py has checked the flags and --log_dir without TensorFlow, and read the
data set if numpy alone reads it (data_sets.py); here the role runs: a PS,
the evaluator, a replica that trains (or finds its run finished), then the
chief's export. Whatever stops it early becomes one line and an exit status:
2 for bad input, 1 for a failed run, 128 + the signal after a stop.
"""

import errno
import os
import sys

import tensorflow as tf

from ps_trainer import models
from ps_trainer.cluster import host_cores
from ps_trainer.cluster import ps_task
from ps_trainer.cluster import server as server_lib
from ps_trainer.cluster import waits
from ps_trainer.console import errors
from ps_trainer.datasets import data
from ps_trainer.faults import stops
from ps_trainer.settings import config as config_lib
from ps_trainer.settings import run_signature
from ps_trainer.training import checkpoints
from ps_trainer.training import evaluator
from ps_trainer.training import export
from ps_trainer.training import finished_run
from ps_trainer.training import trainer
from ps_trainer.user_model import spec

# Errors whose message is the whole story: bad input, one line, status 2.
_INPUT_ERRORS = (data.DataError, models.ModelError, server_lib.ServerError,
                 spec.ModelFnError,
                 run_signature.MismatchError, evaluator.EvaluatorError,
                 checkpoints.ForeignCheckpointError,
                 checkpoints.MissingCheckpointError)
# A run that could not go on: one line, status 1.
_RUN_ERRORS = (waits.WaitTimeout, trainer.Diverged, export.ExportError)
# Set, it turns the one line of an unforeseen failure back into a traceback.
_TRACEBACK_ENV = "PS_TRAINER_TRACEBACK"


def _wants_traceback() -> bool:
  return bool(os.environ.get(_TRACEBACK_ENV))


class _Loaded:
  """The data set, once loaded: a TF error may come from one of its records."""
  dataset = None


def run(cfg: config_lib.Config, stop: stops.StopRequest,
        dataset: data.DataSet | None = None) -> int:
  """Runs this task's role; returns its exit status or exits in one line.

  dataset: the data set when main.py read it before TensorFlow loaded; else
  this task loads it, if its role needs one.
  """
  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  loaded = _Loaded()
  loaded.dataset = dataset
  try:
    return _run_role(cfg, stop, loaded)
  except _INPUT_ERRORS as e:
    errors.fail(str(e))
  except _RUN_ERRORS as e:
    errors.fail(str(e), status=1)
  except waits.Stopped as e:
    print(f"ps_trainer: {e}", file=sys.stderr, flush=True)
    return stop.exit_status()
  except OSError as e:  # Python's own file work: result.json, step records.
    _file_error(e)
  except tf.errors.ResourceExhaustedError as e:
    if _wants_traceback():
      raise
    if _disk_full(e.message):  # TF reports ENOSPC as resource exhaustion too.
      _fail_disk_full(errors.first_line(e.message))
    errors.fail(f"out of memory ({errors.first_line(e.message)}); the model "
                f"is too large for this host: {_smaller_model(cfg)}")
  except tf.errors.OpError as e:
    if _wants_traceback():
      raise
    errors.fail(*_op_error(e, cfg, loaded.dataset))


def _run_role(cfg: config_lib.Config, stop: stops.StopRequest,
              loaded: _Loaded) -> int:
  info = cfg.cluster
  if info is not None and info.is_ps:
    return ps_task.run_ps(info, stop, cfg.train.wait_timeout_secs)
  if loaded.dataset is None:
    loaded.dataset = data.load(cfg.data.dataset, cfg.data.data_dir,
                               cfg.data.data_path)
  dataset = loaded.dataset
  if info is not None and info.job_name == "evaluator":
    evaluator.run(cfg, dataset, stop)
    return 0
  # Built before the server starts: a model_fn or input_fn that breaks the
  # contract is one line before this task opens a port or prints anything.
  graph = trainer.build(cfg, dataset)
  target = ""
  if info is not None:
    target = server_lib.start_server(info).target
  print(f"{_describe(cfg)}; log dir {cfg.train.log_dir or '(none)'}"
        f"{host_cores.pinned_note()}", flush=True)
  if info is not None:
    earlier = finished_run.earlier_result(cfg.train.log_dir,
                                          cfg.train.train_steps)
    if earlier and not finished_run.cluster_restarted(cfg, stop):
      if cfg.is_chief:
        stop.ended(trainer.FINISHING)
        finished_run.export_alone(cfg, dataset, earlier, stop)
      else:
        finished_run.say_over(cfg, earlier)
      return 0
  result = trainer.run(cfg, graph, target, stop)
  if result is None:
    return stop.exit_status() if stop.requested else 0
  # A finished run, on the chief or alone; a stop during its last step
  # does not cut its export short, nor make it count as stopped.
  stop.ended(trainer.FINISHING)
  export.export_and_record(cfg, dataset, result)
  return 0


def _file_error(e: OSError) -> None:
  if e.errno in (errno.ENOSPC, errno.EDQUOT):
    _fail_disk_full(f"{e.strerror}: {e.filename}")
  if _wants_traceback():
    raise e
  what = f"a file error: {e.filename}:" if e.filename else "an OS error:"
  errors.fail(f"the run stopped on {what} {e.strerror or e} "
              f"({_TRACEBACK_ENV}=1 shows the traceback)", status=1)


def _op_error(e: tf.errors.OpError, cfg: config_lib.Config, dataset):
  """(the line, the status) for an error TensorFlow raised in a run."""
  if (isinstance(e, tf.errors.InvalidArgumentError)
      and "Cannot parse tensor from proto" in (e.message or "")):
    # TF's words when a variable's initial value has too many elements to
    # describe; with the tables in play, the flags that size them.
    return (f"a variable is too large for TensorFlow to create"
            f"{' (' + e.op.name + ')' if e.op is not None else ''}: "
            f"{_smaller_model(cfg)}", 2)
  # A record read during training can be bad where the start-up check
  # did not look; TF's message does not say which file holds it.
  if dataset is not None and data.may_be_bad_records(dataset, e):
    bad = data.find_bad_records(dataset)
    if bad:
      return bad, 2
  where = f" at {e.op.name}" if e.op is not None else ""
  return (f"TensorFlow stopped the run: {type(e).__name__}{where}: "
          f"{errors.first_line(e.message)} ({_TRACEBACK_ENV}=1 shows the "
          "traceback)", 1)


def _fail_disk_full(detail: str) -> None:
  errors.fail(f"a file system is full ({detail}); free space there "
              "(--log_dir holds the checkpoints, summaries and export) and "
              "run the same command again: it continues from the newest "
              "checkpoint", status=1)


def _disk_full(message: str) -> bool:
  """Whether a ResourceExhaustedError is a full disk or quota, not memory."""
  return any(words in (message or "") for words in (
      "No space left on device", "Disk quota exceeded"))


def _smaller_model(cfg: config_lib.Config) -> str:
  """What to lower when the model does not fit: the flags that size it most."""
  if cfg.model.model == "wide_deep":
    return (f"lower --vocab_size={cfg.model.vocab_size} or --embedding_dim="
            f"{cfg.model.embedding_dim} (./launch.sh plan shows the bytes on "
            "each PS)")
  return "lower --hidden_units or --batch_size"


def _input_flag(cfg: config_lib.Config) -> str:
  if cfg.model.input_fn:
    return f"--input_fn={cfg.model.input_fn}"
  return f"--dataset={cfg.data.dataset}"


def _describe(cfg: config_lib.Config) -> str:
  """The task's first line: its role, its mode and the flags that matter."""
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
          f"{_input_flag(cfg)} --optimizer={cfg.train.optimizer} "
          f"--learning_rate={cfg.train.learning_rate:g} "
          f"--train_steps={cfg.train.train_steps}")
