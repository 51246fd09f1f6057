"""The evaluator task: scores each new checkpoint in --log_dir on the test split.

It runs beside the training job, as Estimator's train_and_evaluate did, but
outside its cluster (as Kubeflow treats the evaluator): it starts no server
and talks to no task, it only reads the checkpoints the chief writes into
the shared --log_dir. So it can never slow or stall training, and it can be
started, killed and restarted at any time.

For each checkpoint it has not scored yet it writes TensorBoard summaries
under <log_dir>/eval/ and appends {global_step, loss, accuracy} to
<log_dir>/eval.json. It exits once it has scored a checkpoint at or past
--train_steps: the chief's final one.
"""

import json
import os
import re
from typing import Optional

import tensorflow as tf

from ps_trainer import config as config_lib
from ps_trainer import data
from ps_trainer import stops
from ps_trainer import train_graph
from ps_trainer import waits

EVAL_JSON = "eval.json"
EVAL_SUMMARY_DIR = "eval"
_STEP_SUFFIX = re.compile(r"-(\d+)$")


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
  return scores if isinstance(scores, list) else []


def _append_score(log_dir: str, scores: list, score: dict) -> None:
  """Rewrites eval.json with `score` added; readers never see half a file."""
  scores.append(score)
  path = os.path.join(log_dir, EVAL_JSON)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(scores, f, indent=1)
  os.replace(path + ".tmp", path)


class _Evaluation:
  """The test-split graph of the model, without the cluster or an optimizer."""

  def __init__(self, cfg: config_lib.Config, dataset: data.DataSet):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.global_step = tf.compat.v1.train.get_or_create_global_step()
      # Same model, same table parts as the training graph: the checkpoint's
      # variables restore by name, slices and all.
      self.evaluate = train_graph.build_evaluation(cfg, dataset)
      self.saver = tf.compat.v1.train.Saver(
          tf.compat.v1.global_variables(), sharded=False)
    self.graph.finalize()

  def score(self, session, checkpoint: str) -> dict:
    self.saver.restore(session, checkpoint)
    step = int(session.run(self.global_step))
    metrics = self.evaluate(session)
    return {"global_step": step, "loss": metrics["loss"],
            "accuracy": metrics["accuracy"]}


def run(cfg: config_lib.Config, dataset: data.DataSet,
        stop: stops.StopRequest, poll_secs: float = 1.0) -> None:
  """Scores checkpoints until the final one.

  Raises:
    waits.WaitTimeout: no new checkpoint for --wait_timeout_secs.
    waits.Stopped: a stop was requested.
  """
  log_dir = cfg.train.log_dir
  evaluation = _Evaluation(cfg, dataset)
  scores = read_scores(log_dir)
  scored = {s["global_step"] for s in scores}
  writer = tf.compat.v1.summary.FileWriter(
      os.path.join(log_dir, EVAL_SUMMARY_DIR))
  print(f"evaluator: watching {log_dir} for checkpoints; scores go to "
        f"{os.path.join(log_dir, EVAL_JSON)}", flush=True)

  def new_checkpoint() -> Optional[str]:
    path = tf.train.latest_checkpoint(log_dir)
    if path is None or _step_of(path) in scored:
      return None
    return path

  def done() -> bool:
    # The chief's last checkpoint is at --train_steps or a step or two past
    # it (async); eval.json may hold scores of an earlier, shorter run.
    return any(step >= cfg.train.train_steps for step in scored)

  with tf.compat.v1.Session(graph=evaluation.graph) as session:
    try:
      while not done():
        waits.wait_until(
            lambda: new_checkpoint() is not None or done(),
            f"a new checkpoint in {log_dir} (the chief writes them)",
            cfg.train.wait_timeout_secs, poll_secs=poll_secs,
            note_every_secs=60, stop=stop)
        checkpoint = new_checkpoint()
        if checkpoint is None:
          continue
        try:
          score = evaluation.score(session, checkpoint)
        except tf.errors.NotFoundError:
          # Deleted by the chief's max_to_keep between listing and reading:
          # a newer one is there.
          continue
        scored.add(score["global_step"])
        scored.add(_step_of(checkpoint))
        _append_score(log_dir, scores, score)
        writer.add_summary(tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag="loss", simple_value=score["loss"]),
            tf.compat.v1.Summary.Value(tag="accuracy",
                                       simple_value=score["accuracy"])]),
                           score["global_step"])
        writer.flush()
        print(f"evaluator: step {score['global_step']}  test accuracy "
              f"{score['accuracy']:.4f}  test loss {score['loss']:.4f}",
              flush=True)
    finally:
      writer.close()
  print(f"evaluator: scored the final checkpoint; {len(scores)} checkpoint(s) "
        f"in {os.path.join(log_dir, EVAL_JSON)}", flush=True)
