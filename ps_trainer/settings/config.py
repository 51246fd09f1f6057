"""The run's configuration: built once from flag values and TF_CONFIG, then frozen.

Every later stage receives these objects explicitly; nothing below main.py
reads flags. The environment holds only what is not a setting of the run:
stops.py's count of a task's restarts of itself (it must outlive execv) and
PS_TRAINER_TRACEBACK, a debugging switch task.py reads when it fails.
"""

import dataclasses
import os
import time
from typing import Mapping, Optional

from ps_trainer.datasets import data_files
from ps_trainer.settings import cluster as cluster_lib
from ps_trainer.settings import flags as flags_lib
from ps_trainer.user_model import loading
from ps_trainer.user_model.loading import UserModel

DEFAULT_CHECKPOINT_SECS = 60


class ConfigError(ValueError):
  """Flags that are valid alone but not together. The message is one line."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
  dataset: str
  data_dir: str
  data_path: str
  batch_size: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model. `model` is --model as given: a built-in's name, or the
  PATH.py:FUNCTION of a user's model_fn, whose functions `user` holds once
  main.py has loaded them (user_model/loading.py)."""
  model: str
  hidden_units: tuple
  vocab_size: int = 100_000  # wide_deep only, as is embedding_dim.
  embedding_dim: int = 16
  input_fn: str = ""
  params: str = "{}"
  partition_min_bytes: int = flags_lib.DEFAULT_PARTITION_MIN_BYTES
  user: Optional[UserModel] = None

  @property
  def is_user_model(self) -> bool:
    return loading.is_function_spec(self.model)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How to train and where to write.

  Attributes:
    replicas_to_aggregate: gradients per synchronous step; None when async.
    save_checkpoints_steps / save_checkpoints_secs: exactly one is set.
  """
  optimizer: str
  learning_rate: float
  train_steps: int
  sync_replicas: bool
  replicas_to_aggregate: Optional[int]
  seed: int
  log_dir: str
  save_checkpoints_steps: Optional[int]
  save_checkpoints_secs: Optional[int]
  log_every_steps: int
  wait_timeout_secs: int
  trace_steps: int = 0
  wire_dtype: str = "float32"
  factored_gradients: bool = True
  record_steps: bool = False
  pin_cpus: bool = True


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything a task needs. `cluster` is None in local mode."""
  cluster: Optional[cluster_lib.ClusterInfo]
  data: DataConfig
  model: ModelConfig
  train: TrainConfig

  @property
  def num_workers(self) -> int:
    return self.cluster.num_workers if self.cluster else 1

  @property
  def num_ps(self) -> int:
    return self.cluster.num_ps if self.cluster else 0

  @property
  def is_chief(self) -> bool:
    return self.cluster is None or self.cluster.is_chief

  @property
  def task_name(self) -> str:
    """Names this task in messages: "local", "chief", "worker 1", "ps 0"."""
    if self.cluster is None:
      return "local"
    if self.cluster.is_chief:
      return "chief"
    return f"{self.cluster.job_name} {self.cluster.task_index}"

  @property
  def replica_index(self) -> int:
    return self.cluster.replica_index if self.cluster else 0

  @property
  def writes_log_dir(self) -> bool:
    """Whether this task writes under --log_dir, so must be able to."""
    if self.cluster is None or self.cluster.is_chief:
      return True
    if self.cluster.job_name == "evaluator":
      return True  # Its scores and summaries.
    return bool(self.train.trace_steps or self.train.record_steps)


def from_flag_values(values: Mapping, tf_config: str,
                     now: Optional[float] = None) -> Config:
  """Builds the Config from a dict of parsed flag values and TF_CONFIG.

  Args:
    values: flag name -> value, as FLAGS.flag_values_dict() gives it.
    tf_config: the TF_CONFIG environment variable, or "".
    now: the time used to name a fresh local log directory (tests pin it).

  Raises:
    ConfigError or cluster.ClusterError: one line naming the flag.
  """
  cluster = cluster_lib.resolve(
      values["ps_hosts"], values["worker_hosts"], values["job_name"],
      values["task_index"], tf_config, values["num_workers"])
  num_workers = cluster.num_workers if cluster else 1
  _check_model_reads_data(values["model"], values["dataset"])
  _check_user_functions(values["model"], values.get("input_fn", ""))
  _check_data_flags_are_read(values)
  return Config(
      cluster=cluster,
      data=DataConfig(values["dataset"], values["data_dir"],
                      values["data_path"], values["batch_size"]),
      model=ModelConfig(values["model"],
                        flags_lib.parse_hidden_units(values["hidden_units"]),
                        vocab_size=values["vocab_size"],
                        embedding_dim=values["embedding_dim"],
                        input_fn=values.get("input_fn", ""),
                        params=_params(values),
                        partition_min_bytes=values.get(
                            "partition_min_bytes",
                            flags_lib.DEFAULT_PARTITION_MIN_BYTES)),
      train=TrainConfig(
          optimizer=values["optimizer"],
          learning_rate=(
              flags_lib.DEFAULT_LEARNING_RATES[values["optimizer"]]
              if values["learning_rate"] is None else values["learning_rate"]),
          train_steps=values["train_steps"],
          sync_replicas=values["sync_replicas"],
          replicas_to_aggregate=_replicas_to_aggregate(values, num_workers),
          seed=values["seed"],
          log_dir=_log_dir(values["log_dir"], cluster, now),
          save_checkpoints_steps=values["save_checkpoints_steps"],
          save_checkpoints_secs=_checkpoint_secs(values),
          log_every_steps=values["log_every_steps"],
          wait_timeout_secs=values["wait_timeout_secs"],
          trace_steps=_per_worker_output(values, cluster, "trace_steps",
                                         "traces"),
          record_steps=bool(_per_worker_output(values, cluster,
                                               "record_steps", "steps")),
          wire_dtype=values["wire_dtype"],
          factored_gradients=values["factored_gradients"],
          pin_cpus=values["pin_cpus"]))


def planned_worker(values: Mapping, num_ps: int, num_workers: int,
                   worker: int = 0) -> dict:
  """Flag values for worker `worker` of a cluster of this size whose hosts
  need not exist: what a placement plan (plan.py) builds the graph for."""
  planned = dict(values)
  planned.update(
      ps_hosts=",".join(f"ps{i}:2222" for i in range(num_ps)),
      worker_hosts=",".join(f"worker{i}:2222" for i in range(num_workers)),
      job_name="worker", task_index=worker, num_workers=None,
      # The chief must have one; a plan writes nothing there.
      log_dir=values.get("log_dir") or "plan")
  return planned


def _params(values: Mapping) -> str:
  try:
    return loading.parse_params(values.get("params", "{}"))
  except loading.spec_lib.ModelFnError as e:
    raise ConfigError(str(e)) from None


def _check_user_functions(model: str, input_fn: str) -> None:
  """loading.check_flags, as a ConfigError: one line before TensorFlow
  loads."""
  try:
    loading.check_flags(model, input_fn)
  except loading.spec_lib.ModelFnError as e:
    raise ConfigError(str(e)) from None


def with_user_model(cfg: Config, user: Optional[UserModel]) -> Config:
  """`cfg` with the user's loaded functions (None: a built-in model)."""
  return dataclasses.replace(
      cfg, model=dataclasses.replace(cfg.model, user=user))


def _check_model_reads_data(model: str, dataset: str) -> None:
  """wide_deep reads sparse click records, which no other model reads."""
  if loading.is_function_spec(model):
    return  # A user's model reads what its input gives it.
  if model == "wide_deep" and dataset != "tfrecord":
    raise ConfigError(
        f"--model=wide_deep needs click records with sparse ids, but "
        f"--dataset={dataset} holds dense examples; use --dataset=tfrecord "
        "--data_dir=DIR (docs/large-models.md)")
  if dataset == "tfrecord" and model != "wide_deep":
    raise ConfigError(
        f"--dataset=tfrecord holds click records (sparse ids, dense features, "
        f"a 0/1 label), which --model={model} cannot read; use "
        "--model=wide_deep")


def check_data_flags(values: Mapping) -> None:
  """The data set's file flag is set, and no other: for the flags a user
  gave (main, plan, bench, compare), so a missing one is one line before
  anything starts. A Config alone may lack it: a test passes its DataSet
  itself.

  Raises:
    ConfigError: naming the flag.
  """
  _check_data_flags_are_read(values)
  missing = data_files.missing_file_flag(values["dataset"], values["data_dir"],
                                      values["data_path"])
  if missing:
    raise ConfigError(missing)


def _check_data_flags_are_read(values: Mapping) -> None:
  """A data flag the data set ignores is a mistake: without this, the run
  trains on something else (the bundled digits, say) and exits 0."""
  dataset = values["dataset"]
  for flag, reading in data_files.FILE_FLAGS.items():
    if values[flag] and dataset not in reading:
      raise ConfigError(
          f"--{flag}={values[flag]}: --dataset={dataset} does not read it; "
          f"only --dataset={' or --dataset='.join(reading)} does (add the "
          f"--dataset that holds these files, or drop --{flag})")


def _replicas_to_aggregate(values: Mapping, num_workers: int) -> Optional[int]:
  requested = values["replicas_to_aggregate"]
  if not values["sync_replicas"]:
    if requested is not None:
      raise ConfigError(
          f"--replicas_to_aggregate={requested} needs --sync_replicas; "
          "asynchronous training applies every worker's gradients")
    return None
  if requested is None:
    return num_workers
  if requested > num_workers:
    raise ConfigError(
        f"--replicas_to_aggregate={requested} exceeds the {num_workers} "
        f"worker(s); accepted: 1-{num_workers} (fewer than the workers makes "
        "the rest backups)")
  return requested


def _per_worker_output(values: Mapping, cluster, flag: str, subdir: str):
  """The value of a flag that makes each worker write under its --log_dir."""
  value = values[flag]
  if value and cluster is not None and not cluster.is_worker:
    return type(value)()  # Only replicas run steps; PS ops show in theirs.
  if value and not values["log_dir"] and cluster is not None:
    shown = f"--{flag}" if value is True else f"--{flag}={value}"
    raise ConfigError(
        f"{shown} needs --log_dir on this worker too: it writes to "
        f"<log_dir>/{subdir}/ (on the chief's host, pass the chief's; on "
        "another, a directory there; or leave the flag to the chief)")
  return value


def _checkpoint_secs(values: Mapping) -> Optional[int]:
  steps, secs = values["save_checkpoints_steps"], values["save_checkpoints_secs"]
  if steps is not None and secs is not None:
    raise ConfigError(
        f"--save_checkpoints_steps={steps} and --save_checkpoints_secs={secs} "
        "are both set; pass one (the default is every 60 s)")
  if steps is None and secs is None:
    return DEFAULT_CHECKPOINT_SECS
  return secs


# TF finds a checkpoint by a pattern of its path (its reader and the
# Saver's), where these are wildcards: under them a checkpoint is never found.
_PATTERN_CHARACTERS = "*?[\\"


def _log_dir(log_dir: str, cluster, now: Optional[float]) -> str:
  if log_dir:
    used = sorted({c for c in log_dir if c in _PATTERN_CHARACTERS})
    if used:
      raise ConfigError(
          f"--log_dir={log_dir}: TensorFlow finds checkpoints by pattern, so "
          f"one under a path with {' '.join(used)} in it is never found "
          "(a restart would start over); accepted: a path without * ? [ "
          "or \\")
    return log_dir
  if cluster is None:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return os.path.join("runs", f"local-{stamp}")
  if cluster.is_chief:
    raise ConfigError(
        "--log_dir is required for the chief: checkpoints and result.json go "
        "there, and a restarted chief resumes from it")
  if cluster.job_name == "evaluator":
    raise ConfigError(
        "--log_dir is required for the evaluator: it scores the checkpoints "
        "the chief writes there (a directory both can reach)")
  return ""
