"""The evaluator task: scores each new checkpoint in --log_dir on the test split.

It runs beside the training job, as Estimator's train_and_evaluate did, but
outside its cluster (as Kubeflow treats the evaluator): it starts no server
and talks to no task, it only reads the checkpoints the chief writes into
the shared --log_dir. So it can never slow or stall training, and it can be
started, killed and restarted at any time.

For each checkpoint it has not scored yet it writes TensorBoard summaries
under <log_dir>/eval/ and appends {global_step, checkpoint, loss, accuracy} to
<log_dir>/eval.json. It exits once the run has finished (the chief's
result.json, at --train_steps or past it) and it has scored the checkpoint
the chief wrote last.
"""

import json
import os
import re
from typing import Optional

import tensorflow as tf

from ps_trainer.cluster import waits
from ps_trainer.console import output_dir
from ps_trainer.datasets import data
from ps_trainer.faults import stops
from ps_trainer.graph import model_parts
from ps_trainer.settings import config as config_lib
from ps_trainer.training import checkpoints
from ps_trainer.training import run_result
from ps_trainer.user_model import graphs

EVAL_JSON = "eval.json"
EVAL_SUMMARY_DIR = "eval"
_STEP_SUFFIX = re.compile(r"-(\d+)$")
# A checkpoint interval longer than --wait_timeout_secs must not make the
# evaluator give up between two checkpoints.
_INTERVALS_TO_WAIT = 3


class EvaluatorError(RuntimeError):
  """The checkpoints are not of this model. The message is one line."""


def _step_of(checkpoint: str) -> Optional[int]:
  match = _STEP_SUFFIX.search(checkpoint)
  return int(match.group(1)) if match else None


def read_scores(log_dir: str) -> list:
  """The entries of <log_dir>/eval.json so far ([] when there is none)."""
  try:
    with open(os.path.join(log_dir, EVAL_JSON), encoding="utf-8") as f:
      scores = json.load(f)
  except FileNotFoundError:
    return []
  except ValueError:
    return []  # Cut short by a crash mid-write of an older version: start over.
  if not isinstance(scores, list):
    return []
  # An entry edited by hand into something else is dropped, not a crash.
  return [s for s in scores
          if isinstance(s, dict) and isinstance(s.get("global_step"), int)]


def _append_score(log_dir: str, scores: list, score: dict) -> None:
  """Rewrites eval.json with `score` added; readers never see half a file."""
  scores.append(score)
  output_dir.write_json(os.path.join(log_dir, EVAL_JSON), scores)


class _Evaluation:
  """The test-split graph of the model, without the cluster or an optimizer."""

  def __init__(self, cfg: config_lib.Config, dataset: data.DataSet):
    # The model_fn in EVAL mode, its tables whole: a restore assembles them
    # from the parts the checkpoint holds, however many PS the job had.
    model = model_parts.model_of(cfg, dataset, whole_tables=True)
    evaluation = graphs.Evaluation(model, lambda: graphs.eval_input(model))
    self.graph, self.global_step = evaluation.graph, evaluation.global_step
    self.evaluate, self.saver = evaluation.evaluate, evaluation.saver
    self.variables = (list(evaluation.variables.values())
                      + [evaluation.global_step])
    self.graph.finalize()

  def check(self, checkpoint: str) -> None:
    """Raises EvaluatorError if `checkpoint` is of another model; errors
    reading it (tf.errors.OpError, ValueError) pass through."""
    problem = checkpoints.mismatch(checkpoint, self.variables)
    if problem:
      raise EvaluatorError(
          f"the checkpoint {checkpoint} does not hold this model ({problem}); "
          "start the evaluator with the training flags of the job")

  def score(self, session, checkpoint: str) -> dict:
    """Restores `checkpoint` and scores it.

    Raises:
      EvaluatorError: the checkpoint is of another model.
      tf.errors.OpError, ValueError: it cannot be read (deleted meanwhile).
    """
    self.check(checkpoint)
    self.saver.restore(session, checkpoint)
    step = int(session.run(self.global_step))
    metrics = self.evaluate(session)
    # Named too: an async chief's checkpoint file can be named a step or two
    # before the step it holds (the others train during its save).
    return {"global_step": step, "checkpoint": os.path.basename(checkpoint),
            "loss": metrics["loss"], "accuracy": metrics["accuracy"],
            "metrics": metrics["metrics"]}


def _shown_metrics(metrics: dict) -> list:
  """(name, value) to print: accuracy first, then the rest by name."""
  order = sorted(metrics, key=lambda name: (name != "accuracy", name))
  return [(name, metrics[name]) for name in order
          if metrics[name] is not None]


def _finished_step(log_dir: str, train_steps: int) -> Optional[int]:
  """The global step result.json reports for a run that reached
  `train_steps`, else None (no result.json, or an earlier, shorter run's)."""
  result = run_result.reached(log_dir, train_steps)
  return None if result is None else int(result["global_step"])


def _gone(checkpoint: str) -> bool:
  return not tf.compat.v1.train.checkpoint_exists(checkpoint)


def run(cfg: config_lib.Config, dataset: data.DataSet,
        stop: stops.StopRequest, poll_secs: float = 1.0) -> None:
  """Scores checkpoints until the final one.

  Raises:
    EvaluatorError: the checkpoints are of another model.
    waits.WaitTimeout: no new checkpoint for --wait_timeout_secs (or three
      --save_checkpoints_secs intervals, when that is longer).
    waits.Stopped: a stop was requested.
  """
  log_dir = cfg.train.log_dir
  evaluation = _Evaluation(cfg, dataset)
  newest = checkpoints.latest(log_dir)
  if newest:  # Now, not only when there is something left to score.
    evaluation.check(newest)
  scores = read_scores(log_dir)
  scored = {s["global_step"] for s in scores}
  writer = tf.compat.v1.summary.FileWriter(
      os.path.join(log_dir, EVAL_SUMMARY_DIR))
  print(f"evaluator: watching {log_dir} for checkpoints; scores go to "
        f"{os.path.join(log_dir, EVAL_JSON)}", flush=True)

  def new_checkpoint() -> Optional[str]:
    path = checkpoints.latest(log_dir)
    if path is None or _step_of(path) in scored:
      return None
    return path

  def done() -> bool:
    # Not "a score at --train_steps": in async mode a periodic checkpoint
    # can land on it just before the final one, a step or two past.
    if _finished_step(log_dir, cfg.train.train_steps) is None:
      return False
    return _step_of(checkpoints.latest(log_dir) or "") in scored

  timeout = max(cfg.train.wait_timeout_secs,
                _INTERVALS_TO_WAIT * (cfg.train.save_checkpoints_secs or 0))

  with tf.compat.v1.Session(graph=evaluation.graph) as session:
    try:
      while not done():
        waits.wait_until(
            lambda: new_checkpoint() is not None or done(),
            f"a new checkpoint in {log_dir} (the chief writes them)",
            timeout, poll_secs=poll_secs,
            note_every_secs=60, stop=stop)
        checkpoint = new_checkpoint()
        if checkpoint is None:
          continue
        try:
          score = evaluation.score(session, checkpoint)
        except (tf.errors.OpError, ValueError):
          if not _gone(checkpoint):
            raise
          # Deleted by the chief's max_to_keep between listing and reading:
          # a newer one is there.
          continue
        scored.add(score["global_step"])
        scored.add(_step_of(checkpoint))
        _append_score(log_dir, scores, score)
        writer.add_summary(tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=name, simple_value=value)
            for name, value in score["metrics"].items()
            if value is not None]), score["global_step"])
        writer.flush()
        print(f"evaluator: step {score['global_step']}  "
              + "  ".join(f"test {name} {value:.4f}" for name, value in
                          _shown_metrics(score["metrics"])), flush=True)
    finally:
      writer.close()
  print(f"evaluator: scored the final checkpoint; {len(scores)} checkpoint(s) "
        f"in {os.path.join(log_dir, EVAL_JSON)}", flush=True)
