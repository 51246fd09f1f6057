"""The chief's final model as a SavedModel, for TF Serving and tf.saved_model.

After a finished run the chief (and a local run) writes
<log_dir>/export/<global step>/: a TF1 SavedModel with the tag "serve" and
one Predict signature, "serving_default":

  inputs   images         float32 [None, H, W, C] in [0, 1]  (digits,
                          synthetic, mnist, npz of images)
           features       float32 [None, D]    (npz of feature vectors)
           ids, dense     int64 [None, None] padded with -1, float32
                          [None, D]            (wide_deep; no dense when
                          the records have no dense features)
  outputs  probabilities  float32 [None, classes]: softmax of the logits
           classes        int64 [None]: the most probable class

(A user's model serves its own predictions, on inputs that follow its
input_fn's features.)

The model is built again in a fresh graph, without a device function (the
export serves in one process, not on the PS tasks), and restored from the
newest checkpoint in --log_dir. The SavedModel holds only the model's
variables and the global step it was trained to: no optimizer slots.
"""

import os
import shutil
from typing import Optional, Tuple

import tensorflow as tf

from ps_trainer.console import errors
from ps_trainer.datasets import data
from ps_trainer.graph import model_parts
from ps_trainer.settings import config as config_lib
from ps_trainer.training import checkpoints
from ps_trainer.training import run_result
from ps_trainer.user_model import graphs

EXPORT_SUBDIR = "export"
SIGNATURE_KEY = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
# Pads a row of "ids" to the batch's longest row. The serving graph drops
# every negative id, so served ids are >= 0 (as clicks.py writes them; the
# TFRecord schema would allow negative ids, which training hashes instead).
IDS_PADDING = graphs.SPARSE_PADDING
# Where a half-written export lives until it is renamed into place. The dot
# keeps it out of TF Serving's sight: it loads only numbered directories.
_PARTIAL = ".partial-"


class ExportError(RuntimeError):
  """The export failed; the checkpoint and result.json are intact. One line."""


class _NotThisModel(Exception):
  """The checkpoint lacks a variable of the model, or holds another shape."""


def export_saved_model(cfg: config_lib.Config, dataset: data.DataSet,
                       log_dir: str) -> str:
  """Exports the newest checkpoint in `log_dir` as a SavedModel.

  Args:
    cfg: the run's configuration (the model and its sizes).
    dataset: the run's data set (input shape and classes).
    log_dir: the chief's --log_dir, which holds the checkpoints.

  Returns:
    <log_dir>/export/<global step of the checkpoint>.

  Raises:
    ExportError: no checkpoint, one that does not hold this model, or a
      directory that cannot be written.
  """
  return _export(cfg, dataset, log_dir)[0]


def export_and_record(cfg: config_lib.Config, dataset: data.DataSet,
                      result: dict) -> dict:
  """After a finished run: exports, adds "export_dir" to result.json, says so.

  result.json is written again whole (atomically) and only after the export
  is in place, so it never names an export that is not there.

  Returns:
    `result` with "export_dir", the export's absolute path.

  Raises:
    ExportError: as export_saved_model.
  """
  log_dir = cfg.train.log_dir
  path, signature = _export(cfg, dataset, log_dir)
  result = dict(result, export_dir=os.path.abspath(path))
  try:
    run_result.write(log_dir, result)
  except OSError as e:
    raise ExportError(f"exported {path}, but cannot rewrite result.json in "
                      f"--log_dir={log_dir} ({e.strerror})") from None
  if signature is None:
    signature = (f"{describe(cfg, dataset)}, kept from an earlier export of "
                 "this step")
  print(f"export: {path} ({signature})", flush=True)
  return result


def describe(cfg: config_lib.Config, dataset: data.DataSet) -> str:
  """E.g. "serving_default: images float32 [None, 8, 8, 1] -> probabilities,
  classes": the signature the export has, built in a scratch graph.

  Raises:
    ModelFnError: the model_fn broke the contract in PREDICT mode.
  """
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    return _described(*_serving(cfg, dataset))


def _described(inputs: dict, outputs: dict) -> str:
  """The signature of serving `inputs` and `outputs`, as describe says it."""
  described = ", ".join(
      f"{name} {tensor.dtype.name} "
      f"[{', '.join(str(d) for d in tensor.shape.as_list())}]"
      for name, tensor in inputs.items())
  return f"{SIGNATURE_KEY}: {described} -> {', '.join(outputs)}"


def _serving(cfg, dataset) -> tuple:
  """(inputs, outputs) of the model in PREDICT mode, in the default graph:
  inputs as the training features (a user's input_fn's, or --dataset's),
  outputs the model's predictions. Each table whole (see below)."""
  # Whatever num_ps the run had: the checkpoint stores a partitioned table
  # under its full name, as slices (one per part), and a restore assembles
  # any slice - here the whole table - from them. The export then does not
  # depend on the cluster.
  user = model_parts.model_of(cfg, dataset, whole_tables=True)
  if cfg.model.input_fn:  # The user's own.
    specs, name = graphs.feature_specs(user), "features"
  else:
    specs = data.feature_specs(dataset)
    name = "features" if len(dataset.input_shape) == 1 else "images"
  inputs, features = graphs.serving_inputs(specs, name)
  return inputs, graphs.serving_outputs(user, features)


def _export(cfg, dataset, log_dir) -> Tuple[str, Optional[str]]:
  """Returns (the export's path, its signature as describe says it; None
  when the export was there already)."""
  checkpoint = checkpoints.latest(log_dir)
  if checkpoint is None:
    raise ExportError(f"no checkpoint in --log_dir={log_dir} to export")
  step = _global_step(checkpoint)
  base = os.path.join(log_dir, EXPORT_SUBDIR)
  path = os.path.join(base, str(step))
  _remove_partial_exports(base)
  if os.path.isdir(path):
    # Only whole exports are renamed into place, so this one is complete: a
    # restarted chief finishing the same step exported these weights before.
    # Keep it: TF Serving may be serving it, and swapping a directory under
    # a server cannot be done atomically.
    return path, None
  partial = os.path.join(base, f"{_PARTIAL}{step}-{os.getpid()}")
  try:
    signature = _write(cfg, dataset, checkpoint, partial)
    os.rename(partial, path)  # Atomic: TF Serving never sees half a model.
  except (OSError, tf.errors.OpError, _NotThisModel) as e:
    shutil.rmtree(partial, ignore_errors=True)
    raise ExportError(_failure(e, checkpoint, path)) from None
  return path, signature


def _global_step(checkpoint: str) -> int:
  try:
    return checkpoints.global_step(checkpoint)
  except (tf.errors.OpError, ValueError) as e:
    message = errors.first_line(getattr(e, "message", None) or str(e))
    raise ExportError(f"cannot read the global step of the checkpoint "
                      f"{checkpoint}: {message}") from None


def _remove_partial_exports(base: str) -> None:
  """Removes what exports that crashed half-way left.

  Safe: only the chief exports, one export at a time.
  """
  try:
    names = os.listdir(base)
  except OSError:
    return  # No exports yet (or no directory): writing will say what is wrong.
  for name in names:
    if name.startswith(_PARTIAL):
      shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def _write(cfg, dataset, checkpoint: str, export_dir: str) -> str:
  """Builds the serving graph, restores `checkpoint`, writes the SavedModel;
  returns its signature as describe says it."""
  graph = tf.Graph()
  with graph.as_default():
    # As Estimator gave every graph one: a model_fn may read it in any mode.
    # Restored with the model, so the export says which step it serves.
    global_step = tf.compat.v1.train.get_or_create_global_step()
    inputs, outputs = _serving(cfg, dataset)
    # Only what the model created: its variables.
    model_variables = list(graphs.model_variables(graph).values())
    problem = checkpoints.mismatch(checkpoint, model_variables)
    if problem:
      raise _NotThisModel(problem)
    restore = tf.compat.v1.train.Saver(model_variables + [global_step])
    signature = tf.compat.v1.saved_model.predict_signature_def(
        inputs=inputs, outputs=outputs)
    with tf.compat.v1.Session(graph=graph) as session:
      restore.restore(session, checkpoint)
      session.run([v.initializer for v in tf.compat.v1.global_variables()
                   if v not in model_variables and v is not global_step])
      builder = tf.compat.v1.saved_model.Builder(export_dir)
      builder.add_meta_graph_and_variables(
          session, [tf.saved_model.SERVING],
          signature_def_map={SIGNATURE_KEY: signature},
          strip_default_attrs=True)
      builder.save()
  return _described(inputs, outputs)


def _failure(e: Exception, checkpoint: str, path: str) -> str:
  """One line for an export that failed, saying what is left intact."""
  intact = (f"the checkpoint {checkpoint} and result.json are intact; run "
            "the same command again to export")
  if isinstance(e, OSError):
    return f"cannot write the export {path} ({e.strerror or e}); {intact}"
  if isinstance(e, _NotThisModel):
    return (f"the checkpoint {checkpoint} does not hold this model ({e}): "
            "--log_dir holds another run's checkpoints; nothing exported")
  return (f"the export {path} failed: {type(e).__name__}: "
          f"{errors.first_line(e.message)}; {intact}")
