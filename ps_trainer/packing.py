"""One tensor per PS per step, each way: packed reads and packed gradients.

Left alone, TF moves every variable and every gradient as a tensor of its own:
a worker's step of the reference MLP made 6 read RPCs to the PS, the PS 7
more to the worker for gradients and the learning rate, and each of those
costs about as much CPU as moving 100 KB (a --trace_steps trace shows them
one by one). Here, each PS concatenates the variables it holds into one flat
tensor that the worker reads once and splits; the worker concatenates the
gradients for each PS into one flat tensor that the PS splits and applies.
The arithmetic is the same, so results are too.

The same two places carry `--wire_dtype=bfloat16`: the packed tensors are cast
for the wire and back, so the PS keeps, updates and checkpoints float32
variables, and only what crosses the network is rounded.

The model reads its variables through `variable_getter`, a custom getter, so
model code keeps calling get_variable and knows nothing of this.
"""

import collections
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from ps_trainer import placement

WIRE_DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16}


def _packable(variable) -> bool:
  """Whole float32 variables on a PS; not the parts of a partitioned table,
  which the model reads a few rows at a time (a packed read would move the
  whole table every step)."""
  return (variable.dtype.base_dtype == tf.float32 and bool(variable.device)
          and not placement.is_table_part(variable))


def _by_device(variables) -> Dict[str, list]:
  groups = collections.OrderedDict()
  for variable in variables:
    if _packable(variable):
      groups.setdefault(variable.device, []).append(variable)
  return groups


def _sizes(variables) -> List[int]:
  return [int(np.prod(v.shape.as_list())) for v in variables]


def _to_wire(tensor, wire_dtype):
  return tensor if wire_dtype == tf.float32 else tf.cast(tensor, wire_dtype)


def _from_wire(tensor):
  return tensor if tensor.dtype == tf.float32 else tf.cast(tensor, tf.float32)


class PackedReads:
  """Per PS, one read of every float32 variable it holds, split on the worker.

  Build it after the variables exist and before the training graph reads
  them; then open `variable_getter()` as a variable scope's custom getter
  while building that graph.
  """

  def __init__(self, variables, wire_dtype=tf.float32):
    self._values: Dict[str, tf.Tensor] = {}
    with tf.name_scope("packed_reads"):
      for device, group in _by_device(variables).items():
        with tf.device(device):
          packed = _to_wire(tf.concat(
              [tf.reshape(v.read_value(), [-1]) for v in group], axis=0),
                            wire_dtype)
        # On the worker: one receive, then views of it.
        parts = tf.split(_from_wire(packed), _sizes(group))
        for variable, part in zip(group, parts):
          self._values[variable.op.name] = tf.reshape(part, variable.shape)

  def value_of(self, variable) -> Optional[tf.Tensor]:
    if not isinstance(variable, tf.Variable):
      return None  # A PartitionedVariable: its parts are read by rows.
    return self._values.get(variable.op.name)

  def variable_getter(self):
    """A custom getter returning the packed value of variables it knows."""
    def getter(getter, name, *args, **kwargs):  # TF passes `getter` by name.
      variable = getter(name, *args, **kwargs)
      value = self.value_of(variable)
      return variable if value is None else value
    return getter


def gradients(loss, variables, reads: PackedReads):
  """[(gradient, variable)] of `loss`, through the packed reads.

  Gradients are taken with respect to the values the model read; a variable
  the model read directly (not packed) gets its gradient as usual.
  """
  targets = [reads.value_of(v) if reads.value_of(v) is not None else v
             for v in variables]
  return list(zip(tf.gradients(loss, targets), variables))


def pack_gradients(grads_and_vars, wire_dtype=tf.float32):
  """Moves each PS's dense float32 gradients as one tensor; the rest as they are.

  Returns [(gradient, variable)] in the same order, the packed ones split
  again on their variable's PS.
  """
  out = list(grads_and_vars)
  groups = collections.OrderedDict()
  for index, (grad, variable) in enumerate(out):
    if isinstance(grad, tf.Tensor) and _packable(variable):
      groups.setdefault(variable.device, []).append(index)
  with tf.name_scope("packed_gradients"):
    for device, indexes in groups.items():
      packed = _to_wire(tf.concat(
          [tf.reshape(out[i][0], [-1]) for i in indexes], axis=0), wire_dtype)
      with tf.device(device):
        parts = tf.split(_from_wire(packed), _sizes([out[i][1] for i in indexes]))
        for i, part in zip(indexes, parts):
          out[i] = (tf.reshape(part, out[i][1].shape), out[i][1])
  return out
