"""Where variables and ops go: the device function of a cluster task.

Variables go to PS tasks, balanced by bytes; everything else stays on the task
that builds the graph. The balancing strategy is its own object so tests can
check it on a graph without starting a server.
"""

import numpy as np
import tensorflow as tf

from ps_trainer.settings import cluster as cluster_lib


def variable_bytes(op: tf.Operation) -> int:
  """Bytes a variable-creating op will hold, from its shape and dtype attrs.

  Works for resource variables (VarHandleOp) and ref variables (VariableV2).
  Ops without a static shape count as one element, so they still spread out.
  """
  try:
    shape = tf.TensorShape(op.get_attr("shape"))
    dtype = tf.as_dtype(op.get_attr("dtype"))
  except ValueError:
    return 0
  elements = int(np.prod([d if d is not None else 1 for d in shape.as_list()])
                 ) if shape.rank is not None else 1
  return elements * max(dtype.size, 1)


class GreedyByteBalancer:
  """A ps_strategy: each new variable goes to the PS holding fewest bytes so far.

  TF 2.21 no longer ships contrib's GreedyLoadBalancingStrategy; round-robin
  can put the large variables together on one PS, whose memory and link
  then carry most of the model.
  Every worker builds the same graph in the same order, so every worker
  computes the same placement without talking to the others.

  replica_device_setter also asks about ops whose device is decided elsewhere
  (optimizer slots colocated with their variable, accumulators built under
  their variable's device). So each answer is checked against the device the
  op really got at the next call, and its bytes move to where the op went.
  """

  def __init__(self, num_ps: int):
    if num_ps < 1:
      raise ValueError(f"need at least one PS task, got {num_ps}")
    self._loads = [0] * num_ps
    self._unchecked = []  # (op, task it was counted on), device not yet seen.

  @property
  def loads(self) -> list:
    """Bytes held by each PS task, as far as the graph says so far."""
    self._check_earlier_answers()
    return list(self._loads)

  def __call__(self, op: tf.Operation) -> int:
    self._check_earlier_answers()
    task = min(range(len(self._loads)), key=lambda i: (self._loads[i], i))
    self._loads[task] += variable_bytes(op)
    self._unchecked.append((op, task))
    return task

  def _check_earlier_answers(self) -> None:
    still_unplaced = []
    for op, counted_on in self._unchecked:
      if not op.device:  # Not placed (yet): keep the answer as given.
        still_unplaced.append((op, counted_on))
        continue
      spec = tf.DeviceSpec.from_string(op.device)
      placed_on = spec.task if spec.job == "ps" else None
      if placed_on != counted_on:
        size = variable_bytes(op)
        self._loads[counted_on] -= size
        if placed_on is not None and placed_on < len(self._loads):
          self._loads[placed_on] += size
    self._unchecked = still_unplaced


def is_table_part(variable) -> bool:
  """A part of a partitioned variable (a table): read by row lookups,
  never whole (packing.py leaves it out; plan.py counts rows, not parts)."""
  return variable._get_save_slice_info() is not None  # pylint: disable=protected-access


def size_partitioning_getter(num_ps: int, min_bytes: int):
  """A custom getter that splits a get_variable of at least twice
  `min_bytes` into parts of at least `min_bytes`, at most one per PS task
  (TF2's MinSizePartitioner): a user's large tables spread over the PS, and
  every other variable stays whole and keeps its name. A variable given a
  partitioner of its own keeps it."""
  partitioner = tf.compat.v1.min_max_variable_partitioner(
      max_partitions=max(num_ps, 1), min_slice_size=min_bytes)

  def partitioning_getter(getter, *args, **kwargs):  # TF passes `getter=`.
    shape = tf.TensorShape(kwargs.get("shape"))
    dtype = tf.as_dtype(kwargs.get("dtype") or tf.float32)
    if (num_ps > 1 and kwargs.get("partitioner") is None
        and shape.is_fully_defined() and shape.rank
        and shape.num_elements() * max(dtype.size, 1) >= 2 * min_bytes):
      kwargs["partitioner"] = partitioner
    return getter(*args, **kwargs)
  return partitioning_getter


def device_function(info: cluster_lib.ClusterInfo):
  """The device function for a training replica of `info`'s cluster.

  Args:
    info: the cluster from this task's view; must be a training replica.

  Returns:
    A function for `tf.compat.v1.device()` (TF 2's `tf.device` takes no
    functions): variables to `/job:ps/task:k` (balanced by bytes), every
    other op to this task.
  """
  return tf.compat.v1.train.replica_device_setter(
      ps_tasks=info.num_ps,
      ps_device="/job:ps",
      worker_device=info.task_device,
      ps_strategy=GreedyByteBalancer(info.num_ps))
