"""The checkpoints of a --log_dir: where they are, and whether they hold this model.

A restore checks names but not shapes: a table of another --vocab_size
restores without a word and then predicts garbage, and a chief resuming
another run's --log_dir went on training a [32, 32] kernel in a [32, 16]
variable and saved the mix there. The chief, the evaluator and the export
ask first. Nor does a restore mind variables the checkpoint holds beyond the
graph's: a linear model restored its one layer from an MLP's checkpoint
(that layer's shape fitted by chance), and the chief's saves then replaced
the MLP's checkpoints with its own. So the chief also asks for the
checkpoint to hold nothing else, and the evaluator and the export, whose
graphs hold the model alone, for it to hold no other model variable.

TF's `checkpoint` file names the checkpoints by the path they were saved
under: absolute, for an absolute --log_dir (before the trainer's savers wrote
relative names). A directory moved or copied elsewhere then named the old
place: a restore from it died with a traceback, and in a copy, a chief
would have restored, and in time deleted, the original's checkpoints. So
they are looked up in --log_dir itself (latest), and the chief rewrites such
a file before it restores (relocate).
"""

import os
import re
from typing import Optional

import tensorflow as tf

from ps_trainer import models


class ForeignCheckpointError(ValueError):
  """--log_dir holds checkpoints of another model. The message is one line."""


class MissingCheckpointError(ValueError):
  """--log_dir's checkpoint file names a checkpoint that is not there."""


def latest(log_dir: str) -> Optional[str]:
  """The newest checkpoint in `log_dir`, where the directory is now; None if
  it has none, or its checkpoint file names one that is not in it."""
  state = tf.train.get_checkpoint_state(log_dir) if log_dir else None
  if state is None or not state.model_checkpoint_path:
    return None
  path = _in(log_dir, state.model_checkpoint_path)
  return path if _exists(path) else None


def relocate(log_dir: str) -> Optional[str]:
  """Before the chief restores: if `log_dir`'s checkpoint file names another
  directory (the run was moved or copied), makes it name the checkpoints in
  `log_dir`; returns the directory it named, else None.

  Raises:
    MissingCheckpointError: the newest checkpoint it names is not in log_dir,
      or not whole (TF's restore would end in a traceback).
  """
  state = tf.train.get_checkpoint_state(log_dir) if log_dir else None
  if state is None or not state.model_checkpoint_path:
    return None
  newest = state.model_checkpoint_path
  named = os.path.dirname(newest)
  moved = os.path.realpath(named) != os.path.realpath(log_dir)
  lacking = _missing_files(_in(log_dir, newest))
  if lacking:
    raise MissingCheckpointError(
        _missing(log_dir, newest, state, moved, lacking))
  if not moved:
    return None
  # The older ones too: the saver deletes them by these names (max_to_keep).
  older = _older_whole(log_dir, state)
  # Relative names, as the trainer's savers now write (save_relative_paths).
  name = (os.path.basename if os.path.isabs(log_dir)
          else lambda path: _in(log_dir, path))
  tf.compat.v1.train.update_checkpoint_state(
      log_dir, name(newest), [name(path) for path in older + [newest]])
  return named


def _missing(log_dir: str, newest: str, state, moved: bool,
             lacking: list) -> str:
  """The one line for a newest checkpoint that is gone or not whole (its
  files `lacking`)."""
  base = os.path.basename(newest)
  if moved and lacking == [base + ".index", base + ".data-*"]:  # No file.
    return (f"--log_dir={log_dir}: its checkpoint file names {newest}, and "
            f"{base} is not in --log_dir (moved or copied without it?); put "
            "it there, or give a new --log_dir; nothing was changed")
  intact = [os.path.basename(path) for path in _older_whole(log_dir, state)]
  if intact:
    way_on = (f"the newest whole one is {intact[-1]}: to continue from it, "
              f"make model_checkpoint_path \"{intact[-1]}\" in "
              f"{os.path.join(log_dir, 'checkpoint')}")
  else:
    way_on = ("no whole checkpoint is left: give a new --log_dir, or remove "
              f"{os.path.join(log_dir, 'checkpoint')} to start over there")
  return (f"--log_dir={log_dir}: its newest checkpoint, {base}, is missing "
          f"files ({', '.join(lacking)}); {way_on}; nothing was changed")


def _older_whole(log_dir: str, state) -> list:
  """The checkpoints older than the newest that the checkpoint file names
  and that are whole in log_dir, oldest first, as that file names them."""
  newest = state.model_checkpoint_path
  return [path for path in state.all_model_checkpoint_paths
          if path != newest and _exists(_in(log_dir, path))]


def _in(log_dir: str, path: str) -> str:
  return os.path.join(log_dir, os.path.basename(path))


def _missing_files(checkpoint: str) -> list:
  """Which files of `checkpoint` are not there: its index, its data shards.

  Listed, not globbed: a --log_dir named with [ ] * or ? would match
  nothing. A prefix saved again with another shard count may keep the old
  count's shards; it is whole if any count has all of its shards.
  """
  directory, base = os.path.split(checkpoint)
  try:
    names = set(tf.io.gfile.listdir(directory or "."))
  except tf.errors.NotFoundError:
    names = set()
  missing = [] if base + ".index" in names else [base + ".index"]
  shard = re.compile(re.escape(base) + r"\.data-(\d{5})-of-(\d{5})$")
  present = {}  # shard count -> the shards of it there
  for name in names:
    match = shard.match(name)
    if match:
      present.setdefault(int(match.group(2)), set()).add(int(match.group(1)))
  if not present:
    return missing + [base + ".data-*"]
  of = min(present, key=lambda count: count - len(present[count]))
  return missing + [f"{base}.data-{i:05d}-of-{of:05d}" for i in range(of)
                    if i not in present[of]]


def _exists(checkpoint: str) -> bool:
  """Whether `checkpoint` is whole: its index and every data shard."""
  return not _missing_files(checkpoint)


def check_log_dir(log_dir: str, variables) -> None:
  """Before a chief or local run restores: its newest checkpoint must fit.

  Raises:
    ForeignCheckpointError: it lacks a variable, holds one in another shape,
      or holds one that `variables` (every variable the chief saves) lack.
  """
  checkpoint = latest(log_dir)
  if not checkpoint:
    return
  problem = mismatch(checkpoint, variables, exact=True)
  if problem:
    raise ForeignCheckpointError(
        f"--log_dir={log_dir} holds checkpoints of another model "
        f"({problem}; {checkpoint}): continue that run with the training "
        "flags it was started with, or give this one a new --log_dir; "
        "nothing was changed")


def global_step(checkpoint: str) -> int:
  """The global step saved in `checkpoint`.

  Raises:
    tf.errors.OpError or ValueError: the checkpoint cannot be read, or holds
      no global step.
  """
  return int(tf.train.load_checkpoint(checkpoint).get_tensor("global_step"))


def mismatch(checkpoint: str, variables, exact: bool = False
             ) -> Optional[str]:
  """What `checkpoint` lacks or holds in another shape, or holds beyond
  `variables`, or None if it fits. Beyond them, only another model's
  variables count (not the optimizer's, nor slots of `variables`), unless
  `exact`: `variables` are all the chief saves.

  Partitioned tables are saved under their full name and whole shape, so
  `variables` may hold them whole or in parts of any number: a part is
  checked through its full name.

  Raises:
    tf.errors.OpError or ValueError: the checkpoint cannot be read (gone).
  """
  saved = tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()
  names = set()
  for variable in variables:
    info = variable._get_save_slice_info()  # pylint: disable=protected-access
    name = info.full_name if info else variable.op.name
    shape = list(info.full_shape) if info else variable.shape.as_list()
    if name not in saved:
      return f"it has no {name}"
    if saved[name] != shape:
      return f"{name} is {saved[name]} there, {shape} here"
    names.add(name)
  scope = models.SCOPE + "/"
  extra = sorted(
      name for name in set(saved) - names
      if exact or (name.startswith(scope)
                   and not any(name.startswith(n + "/") for n in names)))
  if extra:
    more = f", nor {len(extra) - 1} more" if len(extra) > 1 else ""
    return f"it holds {extra[0]}, which this model has not{more}"
  return None
