"""What every task of a job must agree on, and a clear message when they don't.

Tasks started with different training flags do not fail in TF1: they hang (a
sync chief waits for gradients an async worker never sends; a worker waits for
optimizer slots the chief never creates), crash deep in a run, or train
another job than the one reported (a worker with its own batch size or
learning rate: result.json counts the chief's batch for every step, and sync
averages unequal batches as equals). The chief publishes its signature in a
variable on the PS; every other worker compares its own before it trains.
"""

import json
from typing import Optional

# The models that read no --hidden_units. Every other one, a model added later
# included, has its layer sizes checked.
_WITHOUT_HIDDEN_UNITS = ("linear", "cnn")


class MismatchError(ValueError):
  """This task's settings differ from the chief's. The message is one line."""


def of(cfg, input_shape, num_classes: int, variables=None) -> dict:
  """The settings that must match across tasks for the job to be the one
  the chief reports; with `variables` (a user's model), also their names,
  shapes and dtypes."""
  return {
      "variables": (None if variables is None else sorted(
          f"{v.op.name} {v.shape.as_list()} {v.dtype.base_dtype.name}"
          for v in variables)),
      "model": cfg.model.model,
      "input_fn": cfg.model.input_fn or None,
      "params": cfg.model.params if cfg.model.is_user_model else None,
      "model_file": _model_file_digest(cfg.model.model),
      "hidden_units": (None if cfg.model.model in _WITHOUT_HIDDEN_UNITS
                       else list(cfg.model.hidden_units)),
      "vocab_size": (cfg.model.vocab_size
                     if cfg.model.model == "wide_deep" else None),
      "embedding_dim": (cfg.model.embedding_dim
                        if cfg.model.model == "wide_deep" else None),
      "input_shape": list(input_shape),
      "num_classes": num_classes,
      "optimizer": cfg.train.optimizer,
      "learning_rate": cfg.train.learning_rate,
      "batch_size": cfg.data.batch_size,
      "sync_replicas": cfg.train.sync_replicas,
      "replicas_to_aggregate": cfg.train.replicas_to_aggregate,
      "train_steps": cfg.train.train_steps,
      "num_workers": cfg.num_workers,
      "num_ps": cfg.num_ps,
      "hosts": _hosts(cfg.cluster),
  }


def _hosts(cluster) -> Optional[str]:
  """"ps: h:1,h:2; worker: h:3,h:4": every host list of the training
  cluster. None in local mode and in a sparse cluster, where each task
  knows only some of them."""
  if cluster is None or cluster.sparse:
    return None
  return "; ".join(f"{job}: {','.join(hosts)}"
                   for job, hosts in cluster.hosts_by_job().items())


def _model_name(model: str) -> str:
  """--model as every host can agree on it: a file by its name, not by a
  path that depends on where each task was started (its content is compared
  by _model_file_digest)."""
  import os  # pylint: disable=g-import-not-at-top
  path, colon, function = model.rpartition(":")
  if colon and path.endswith(".py"):
    return f"{os.path.basename(path)}:{function}"
  return model


def _model_file_digest(model: str) -> Optional[str]:
  """The sha256 of a --model=PATH.py file's text (its first 12 hex digits):
  two hosts' copies of a model file that differ tell so. None otherwise."""
  import hashlib  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  path = model.rpartition(":")[0]
  if not path.endswith(".py") or not os.path.isfile(path):
    return None
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()[:12]


def encode(signature: dict) -> str:
  return json.dumps(signature, sort_keys=True)


def mismatch(own: dict, chief_encoded: str) -> Optional[str]:
  """A one-line description of how `own` differs from the chief's, or None."""
  try:
    chief = json.loads(chief_encoded)
  except ValueError:
    return "the chief published an unreadable signature (another program?)"
  differences = [
      _variables_differ(own[key], chief[key]) if key == "variables" and
      own.get(key) is not None and chief.get(key) is not None else
      f"{key}: {_shown(own, key)} here but {_shown(chief, key)} on the chief"
      for key in sorted(set(own) | set(chief))
      if key not in own or key not in chief or own[key] != chief[key]]
  if not differences:
    return None
  return ("this worker's settings differ from the chief's: "
          f"{'; '.join(differences)}; start every task with the same training "
          "flags")


def _variables_differ(own: list, chief: list) -> str:
  """The model variables only one side has (first three of each)."""
  here = sorted(set(own) - set(chief))
  there = sorted(set(chief) - set(own))
  return (f"model variables: {'; '.join(here[:3]) or 'none'} here but "
          f"{'; '.join(there[:3]) or 'none'} on the chief")


def _shown(signature: dict, key: str) -> str:
  """signature[key] as a flag gives it: 128,64 for a list; None is a setting
  the task's other flags leave unused (hidden units of --model=linear)."""
  if key not in signature:
    return "not known (another version of ps_trainer?)"
  value = signature[key]
  if value is None:
    return "not used"
  if isinstance(value, list):
    return ",".join(str(v) for v in value) or "none"
  return str(value)
