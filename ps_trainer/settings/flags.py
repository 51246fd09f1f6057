"""Every command-line flag of the trainer, and the checks on their values.

In the trainer, the only module besides main.py that touches FLAGS (plan_main.py
and experiments/ are programs of their own). Flags are never mutated: derived
values (the default learning rate, the default number of replicas to
aggregate) are resolved in config.py.
"""

import functools
import json
import math

from absl import flags

MODELS = ("linear", "mlp", "cnn", "wide_deep")
OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad")
DATASETS = ("digits", "synthetic", "mnist", "npz", "tfrecord")
JOB_NAMES = ("ps", "worker", "chief", "evaluator")
WIRE_DTYPES = ("float32", "bfloat16")
# A user's get_variable of twice this many bytes is split over the PS tasks.
DEFAULT_PARTITION_MIN_BYTES = 4 << 20
# Rates that train every bundled model and data set in 1,000 steps.
DEFAULT_LEARNING_RATES = {
    "sgd": 0.1, "momentum": 0.05, "adam": 0.001, "adagrad": 0.1}


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> list:
  """Defines the trainer's flags and their validators (call once).

  Args:
    flag_values: where to define them; tests pass a fresh FlagValues.

  Returns:
    The names of the flags defined.
  """
  fv = flag_values
  before = set(fv)
  define_string = functools.partial(flags.DEFINE_string, flag_values=fv)
  define_integer = functools.partial(flags.DEFINE_integer, flag_values=fv)
  define_float = functools.partial(flags.DEFINE_float, flag_values=fv)
  define_boolean = functools.partial(flags.DEFINE_boolean, flag_values=fv)
  # Cluster.
  define_string(
      "ps_hosts", "", "Comma-separated host:port of every PS task.")
  define_string(
      "worker_hosts", "",
      "Comma-separated host:port of every worker task; worker 0 is the chief.")
  define_string(
      "job_name", "",
      "This task's role with --ps_hosts/--worker_hosts: ps | worker | "
      "evaluator (chief comes from TF_CONFIG). An evaluator scores each new "
      "checkpoint in --log_dir. Empty, with no TF_CONFIG: train alone in "
      "this process (local mode).")
  define_integer("task_index", None,
                       "This task's index in its job's host list, from 0.")
  define_integer(
      "num_workers", None,
      "Training replicas in the job (chief + workers). Only needed with a "
      "sparse TF_CONFIG, which does not list every worker.")
  # What to train.
  define_string(
      "model", "mlp",
      f"Model: {' | '.join(MODELS)}; or your own model function as "
      "PATH.py:FUNCTION or package.module:FUNCTION, model_fn(features, "
      "labels, mode, params) -> ps_trainer.ModelSpec (README: Your own model).")
  define_string(
      "input_fn", "",
      "Your own input function, PATH.py:FUNCTION or package.module:FUNCTION: "
      "input_fn(mode, input_context, params) -> tf.data.Dataset of "
      "(features, labels). Needs --model=PATH.py:FUNCTION. Default: "
      "--dataset supplies the input.")
  define_string(
      "params", "{}",
      "A JSON object handed to your model_fn and input_fn as `params`, e.g. "
      "'{\"units\": 64}'.")
  define_integer(
      "partition_min_bytes", DEFAULT_PARTITION_MIN_BYTES,
      "Your own model: a get_variable larger than this many bytes is split "
      "over the PS tasks in parts of at least this size (as TF2's "
      "MinSizePartitioner does). Built-in models split their tables "
      "themselves.")
  define_string("hidden_units", "128,64",
                "Comma-separated hidden layer sizes of --model=mlp and of the "
                "deep part of --model=wide_deep.")
  define_integer(
      "vocab_size", 100_000,
      "--model=wide_deep: rows of its embedding and wide weights; ids are "
      "hashed into them (id mod vocab_size). With several PS tasks both are "
      "split into one part per PS.")
  define_integer("embedding_dim", 16,
                 "--model=wide_deep: width of an id's embedding.")
  define_string("dataset", "digits", f"Data set: {' | '.join(DATASETS)}.")
  define_string("data_dir", "",
                "Directory with the four MNIST IDX files (--dataset=mnist), "
                "or with train* and test* TFRecord files of tf.train.Example "
                "click records (--dataset=tfrecord; docs/large-models.md).")
  define_string("data_path", "",
                      "Keras-layout .npz file (--dataset=npz).")
  # How to train.
  define_integer("batch_size", 64, "Examples per step on each worker.")
  define_string("optimizer", "adam", f"Optimizer: {' | '.join(OPTIMIZERS)}.")
  define_float(
      "learning_rate", None,
      "Learning rate. Default per optimizer: " + ", ".join(
          f"{name} {rate:g}" for name, rate in DEFAULT_LEARNING_RATES.items())
      + ".")
  define_integer("train_steps", 1000,
                       "Global steps to train; a restarted job continues "
                       "from its checkpoint up to this step.")
  define_boolean(
      "sync_replicas", False,
      "Synchronous training: aggregate --replicas_to_aggregate gradients per "
      "step (TF1's SyncReplicasOptimizer scheme, with a token queue per "
      "replica). Default: asynchronous updates.")
  define_integer(
      "replicas_to_aggregate", None,
      "Gradients averaged per synchronous step. Default: the number of "
      "workers; fewer makes the rest backup workers.")
  define_integer("seed", 0, "Seed for initial weights and shuffling.")
  # Output. absl.logging defines its own --log_dir (for log files, unused
  # here); the contract's --log_dir replaces it, with the same type.
  if "log_dir" in fv:
    delattr(fv, "log_dir")
  define_string(
      "log_dir", "",
      "Checkpoints, summaries and result.json. Required for the chief; local "
      "mode defaults to a fresh runs/local-<time> directory.")
  define_integer("save_checkpoints_steps", None,
                       "Checkpoint every N global steps (instead of "
                       "--save_checkpoints_secs).")
  define_integer("save_checkpoints_secs", None,
                 "Checkpoint every N seconds (default 60 unless "
                 "--save_checkpoints_steps is set); always at the end too.")
  define_integer("log_every_steps", 100,
                       "Print a progress line every N steps of this worker.")
  define_integer(
      "trace_steps", 0,
      "Trace N steps on each worker (after its first 20) into "
      "<log_dir>/traces/<task>.json, a Chrome trace (chrome://tracing, "
      "ui.perfetto.dev) of every op on the worker and the PS tasks, and print "
      "where a step's time went. 0: no tracing.")
  define_string(
      "wire_dtype", "float32",
      f"Precision of what crosses the network between workers and PS tasks: "
      f"{' | '.join(WIRE_DTYPES)}. bfloat16 halves the bytes of variable "
      "reads and gradients; the PS keeps, updates and checkpoints float32. "
      "No effect in local mode.")
  define_boolean(
      "factored_gradients", True,
      "Send a dense layer's kernel gradient as the two tensors it is the "
      "product of (the layer's input and its output's gradient) when they "
      "are smaller: batch x (inputs + units) < inputs x units. The PS "
      "multiplies them, with the same result to the last bit at float32 "
      "(with --wire_dtype=bfloat16 the factors are rounded, not their "
      "product). Fewer bytes on the network, more work on the PS: "
      "--nofactored_gradients when the PS's CPU, not its network, limits "
      "the job. No effect in local mode.")
  define_boolean(
      "pin_cpus", True,
      "When tasks of this job share a host and each can have cores of its "
      "own, keep each task on its own cores (an equal share of the cores "
      "this process may use); a worker's synthetic-data thread may still use "
      "any of them, at the lowest priority. --nopin_cpus leaves placement to "
      "the OS.")
  define_boolean(
      "record_steps", False,
      "Each worker appends one JSON line per step to <log_dir>/steps/"
      "<task>.jsonl: time, global step, loss and, in async mode, the "
      "gradient's staleness (updates by others between its read and its "
      "apply). ./launch.sh compare turns it on.")
  # Faults.
  define_integer(
      "wait_timeout_secs", 600,
      "Longest wait for another task before giving up with exit status 1: "
      "a worker for a PS or the chief (at start and after losing them), one "
      "training step (a sync step waits for every aggregated worker), a PS "
      "for its workers when none of them answers. Waits name whom they wait "
      "for every 10 s. A step stuck while every task it needs answers starts "
      "its task again instead (at most 3 times in a row; async, sooner: "
      "after 100 times the session's longest step and at least 120 s, "
      "unless a task was silent meanwhile). A session start (the "
      "first, or after losing one) gets 4 times this to reach a step.")
  _register_validators(fv)
  return sorted(set(fv) - before | {"log_dir"})


def _one_of(fv, name: str, accepted) -> None:
  flags.register_validator(
      name, lambda value: value in accepted,
      message=f"unknown value; accepted: {', '.join(accepted)}",
      flag_values=fv)


def _at_least(fv, name: str, minimum: int, allow_none: bool = False) -> None:
  def check(value):
    return (allow_none and value is None) or (
        value is not None and value >= minimum)
  flags.register_validator(name, check, message=f"must be >= {minimum}",
                           flag_values=fv)


_INT32_MAX = 2**31 - 1


def _between(fv, name: str, minimum: int, maximum: int) -> None:
  flags.register_validator(
      name, lambda value: value is not None and minimum <= value <= maximum,
      message=f"must be between {minimum} and {maximum}", flag_values=fv)


def _is_json_object(value: str) -> bool:
  try:
    return isinstance(json.loads(value), dict)
  except ValueError:
    return False


def parse_hidden_units(value: str) -> tuple:
  """'128,64' -> (128, 64); raises ValueError with the reason."""
  parts = [p.strip() for p in value.split(",")] if value.strip() else []
  if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(
        "expected comma-separated positive whole numbers, e.g. 256,128")
  return tuple(int(p) for p in parts)


def _valid_hidden_units(value: str) -> bool:
  try:
    parse_hidden_units(value)
    return True
  except ValueError:
    return False


def _register_validators(fv) -> None:
  flags.register_validator(
      "model", lambda value: value in MODELS or ":" in value,
      message=f"unknown value; accepted: {', '.join(MODELS)}, or your own "
      "model_fn as PATH.py:FUNCTION or package.module:FUNCTION",
      flag_values=fv)
  flags.register_validator(
      "input_fn", lambda value: not value or ":" in value,
      message="expected PATH.py:FUNCTION or package.module:FUNCTION",
      flag_values=fv)
  flags.register_validator(
      "params", _is_json_object,
      message="expected a JSON object, e.g. '{\"units\": 64}'",
      flag_values=fv)
  _at_least(fv, "partition_min_bytes", 1)
  _one_of(fv, "optimizer", OPTIMIZERS)
  _one_of(fv, "dataset", DATASETS)
  _one_of(fv, "wire_dtype", WIRE_DTYPES)
  flags.register_validator(
      "job_name", lambda value: value in ("",) + JOB_NAMES,
      # "chief" passes here so that the cluster can say where it comes from.
      message="unknown job name; accepted: "
      f"{', '.join(j for j in JOB_NAMES if j != 'chief')} (chief comes from "
      "TF_CONFIG)",
      flag_values=fv)
  flags.register_validator(
      "hidden_units", _valid_hidden_units,
      message="expected comma-separated positive whole numbers, e.g. 256,128",
      flag_values=fv)
  _at_least(fv, "task_index", 0, allow_none=True)
  _at_least(fv, "num_workers", 1, allow_none=True)
  _at_least(fv, "batch_size", 1)
  # TF sizes a table's parts with int32: a larger value wraps around (a
  # smaller table, or a negative shape) instead of failing.
  _between(fv, "vocab_size", 1, _INT32_MAX)
  _between(fv, "embedding_dim", 1, _INT32_MAX)
  _at_least(fv, "train_steps", 1)
  _at_least(fv, "replicas_to_aggregate", 1, allow_none=True)
  _at_least(fv, "save_checkpoints_steps", 1, allow_none=True)
  _at_least(fv, "save_checkpoints_secs", 1, allow_none=True)
  _at_least(fv, "log_every_steps", 1)
  _at_least(fv, "trace_steps", 0)
  _at_least(fv, "wait_timeout_secs", 1)
  flags.register_validator(
      "learning_rate",
      lambda value: value is None or (math.isfinite(value) and value > 0),
      message="must be a finite number > 0, e.g. 0.01",
      flag_values=fv)
