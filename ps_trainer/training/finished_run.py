"""A worker started again after its run had finished: what it still owes.

A PS task exits once every worker has said it is done, and a finished chief
says so before it exports (task.py). So a chief killed during its export (or
at any moment after the PS tasks left) and started again with the same
command would wait --wait_timeout_secs for PS tasks that never come back,
fail, and never write the export. Yet all it still owes lies in its
--log_dir: result.json says the run reached --train_steps, and the final
checkpoint holds the model.

So such a chief first waits a short while for the PS tasks. When the whole
cluster was started again they are up within seconds, and the run ends as
every finished run does, in a session (nothing to train, the export written
or kept, every worker done). When they do not all answer, the job ended
long ago: the chief exports from the checkpoint alone and exits 0.

Another worker owes nothing, but it would likewise wait --wait_timeout_secs
for the PS tasks and exit 1. When it sees the chief's --log_dir (the same
host, or a shared file system), the same evidence tells it the job is over.
"""

from typing import Optional

import tensorflow as tf

from ps_trainer.cluster import waits
from ps_trainer.training import checkpoints
from ps_trainer.training import export
from ps_trainer.training import run_result

# How long a finished chief waits for the PS tasks (at most
# --wait_timeout_secs): TF start-up takes 3-10 s on a busy host, so PS tasks
# started with the chief are up well within it.
PS_WAIT_SECS = 30.0


def earlier_result(log_dir: str, train_steps: int) -> Optional[dict]:
  """result.json of a finished run in `log_dir`, else None.

  Finished: result.json and the newest checkpoint have both reached
  `train_steps`. A higher --train_steps than that run's trains on, as
  before; so does a log dir whose checkpoints were removed to start over,
  or whose result.json cannot be read.
  """
  result = run_result.reached(log_dir, train_steps)
  if result is None:
    return None
  checkpoint = checkpoints.latest(log_dir)
  try:
    if checkpoint is None or checkpoints.global_step(checkpoint) < train_steps:
      return None
  except (tf.errors.OpError, ValueError):
    return None
  return result


def cluster_restarted(cfg, stop) -> bool:
  """Whether every PS answers within a short wait, as when all were restarted.

  Args:
    cfg: the worker's configuration.
    stop: the task's stops.StopRequest; a stop ends the wait.

  Raises:
    waits.Stopped: a stop was requested while waiting.
  """
  ps = cfg.cluster.ps_addresses()
  wait_secs = min(PS_WAIT_SECS, cfg.train.wait_timeout_secs)
  print(f"{cfg.task_name}: the run had finished (global step >= --train_steps="
        f"{cfg.train.train_steps} in result.json and the newest checkpoint); "
        f"waiting up to {wait_secs:.0f} s for the PS tasks, in case the whole "
        "cluster was started again", flush=True)
  try:
    waits.wait_for_addresses(ps, wait_secs, stop=stop)
    return True
  except waits.WaitTimeout as timeout:
    answered = sorted(set(ps) - set(timeout.missing))
    if answered:
      print(f"{cfg.task_name}: only {', '.join(answered)} answered: "
            "left over from the run, they give up on their own after "
            "--wait_timeout_secs", flush=True)
    return False


def export_alone(cfg, dataset, result: dict, stop) -> None:
  """Exports the finished run's final checkpoint, or keeps its export.

  Raises:
    export.ExportError: the export failed (the checkpoint stays intact).
    waits.Stopped: a stop was requested before it began.
  """
  if stop is not None and stop.requested:
    raise waits.Stopped(f"stopped on {stop.signal_name} before exporting "
                        "the finished run; the same command exports it")
  export.export_and_record(cfg, dataset, result)
  print(f"chief: the run had finished at global step {result['global_step']}"
        " and its PS tasks have left: the job is over", flush=True)


def say_over(cfg, result: dict) -> None:
  """What a non-chief worker of a finished run says before it exits 0."""
  print(f"{cfg.task_name}: the run in {cfg.train.log_dir} had finished at "
        f"global step {result['global_step']} and its PS tasks have left: "
        "the job is over, nothing is left to train", flush=True)
