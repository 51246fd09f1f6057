"""The run's whole configuration, as result.json and run_config.json hold it.

Two runs that differ in any setting that shapes them (--hidden_units, --seed,
the model file, --params) leave files that say so, with the code's git commit
and the TensorFlow version that ran them.
"""

import functools
import json
import os
import subprocess
from typing import Optional

from ps_trainer.console import output_dir
from ps_trainer.settings import config as config_lib

FILE_NAME = "run_config.json"


def of(cfg: config_lib.Config) -> dict:
  """Every setting of `cfg` that shapes the run's numbers, and the code."""
  train, model = cfg.train, cfg.model
  return {
      "model": model.model,
      "input_fn": model.input_fn or None,
      "params": json.loads(model.params),
      "hidden_units": list(model.hidden_units),
      "vocab_size": model.vocab_size,
      "embedding_dim": model.embedding_dim,
      "partition_min_bytes": model.partition_min_bytes,
      "dataset": None if model.input_fn else cfg.data.dataset,
      "data_dir": cfg.data.data_dir or None,
      "data_path": cfg.data.data_path or None,
      "batch_size": None if model.input_fn else cfg.data.batch_size,
      "optimizer": train.optimizer,
      "learning_rate": train.learning_rate,
      "train_steps": train.train_steps,
      "sync_replicas": train.sync_replicas,
      "replicas_to_aggregate": train.replicas_to_aggregate,
      "seed": train.seed,
      "wire_dtype": train.wire_dtype,
      "factored_gradients": train.factored_gradients,
      "num_workers": cfg.num_workers,
      "num_ps": cfg.num_ps,
      "cluster": cfg.cluster.hosts_by_job() if cfg.cluster else {},
      "git_commit": git_commit(),
      "tensorflow_version": _tensorflow_version(),
  }


def write(cfg: config_lib.Config) -> str:
  """Writes <log_dir>/run_config.json (atomically); returns its path."""
  path = os.path.join(cfg.train.log_dir, FILE_NAME)
  output_dir.write_json(path, of(cfg))
  return path


@functools.lru_cache(maxsize=None)
def git_commit() -> Optional[str]:
  """The commit of the checkout this package runs from, with "-dirty" when
  it has changes; None outside a git checkout (an installed package)."""
  package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  root = os.path.dirname(package_dir)
  try:
    # Installed in a virtual environment inside another project's checkout,
    # the package is in no checkout of its own: that project's commit is not
    # this code's.
    top = subprocess.run(
        ["git", "-C", root, "rev-parse", "--show-toplevel"],
        capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    if os.path.realpath(top) != os.path.realpath(root):
      return None
    commit = subprocess.run(
        ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
        text=True, timeout=10, check=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return f"{commit}-dirty" if dirty else commit or None


def _tensorflow_version() -> Optional[str]:
  import sys  # pylint: disable=g-import-not-at-top
  tf = sys.modules.get("tensorflow")
  return getattr(tf, "__version__", None)
