"""<log_dir>/result.json: the record of a finished run.

The chief writes it when a run reaches --train_steps (hooks.ResultHook), and
again with the export's path added. A task started again reads it to tell a
finished run from one to continue; so does the evaluator, to know that the
final checkpoint has come. Each reader treats a file it cannot use (missing,
cut short, edited by hand) as no result: training or scoring goes on.
"""

import json
import os
from typing import Optional

from ps_trainer.console import output_dir

FILE_NAME = "result.json"


def path(log_dir: str) -> str:
  return os.path.join(log_dir, FILE_NAME)


def read(log_dir: str) -> Optional[dict]:
  """The result in `log_dir`, or None when there is no usable one."""
  try:
    with open(path(log_dir), encoding="utf-8") as f:
      result = json.load(f)
    int(result["global_step"])
  except (OSError, ValueError, TypeError, KeyError):
    return None
  return result


def reached(log_dir: str, train_steps: int) -> Optional[dict]:
  """The result in `log_dir` if its run reached `train_steps`, else None."""
  result = read(log_dir)
  if result is None or int(result["global_step"]) < train_steps:
    return None
  return result


def write(log_dir: str, result: dict) -> None:
  """Writes the result atomically. Raises OSError."""
  output_dir.write_json(path(log_dir), result)
