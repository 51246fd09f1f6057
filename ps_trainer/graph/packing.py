"""One tensor per PS per step, each way: packed reads and packed gradients.

Left alone, TF moves every variable and every gradient as a tensor of its own:
a worker's step of the reference MLP made 6 read RPCs to the PS, the PS 7
more to the worker for gradients and the learning rate, and each of those
costs about as much CPU as moving 100 KB (a --trace_steps trace shows them
one by one). Here, each PS concatenates the variables it holds into one flat
tensor that the worker reads once and splits; the worker concatenates the
gradients for each PS into one flat tensor that the PS splits and applies.
The arithmetic is the same, so results are too. Each part is padded so that
splitting costs no copy (ALIGN_BYTES), and the PS that holds the global step
sends its value in the same tensor, for the hooks that read it every step.

A dense layer's kernel gradient crosses as the two smaller tensors it is the
product of, which the PS multiplies (gradient_factors, --factored_gradients).

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

from ps_trainer.graph import placement

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


# TF hands out the parts of a split tensor as views, without copying, only
# when every part starts and ends on its kernels' 64-byte alignment (SplitV's
# "aligned outputs" case); otherwise the split copies the whole tensor, which
# cost 0.16 ms of a PS's step in a trace of the reference MLP. So each part is
# padded to a multiple of 64 bytes.
ALIGN_BYTES = 64


def _wire_length(spec: tf.TensorSpec, wire_dtype) -> int:
  """Elements of `wire_dtype` that carry a value of `spec`: a float32 value
  one each (cast); any other dtype (the int64 global step) as its bits, so as
  many as its bytes fill."""
  elements = int(np.prod(spec.shape.as_list()))
  if spec.dtype == tf.float32:
    return elements
  if spec.dtype.size % wire_dtype.size:
    raise ValueError(f"cannot pack {spec.dtype.name} bits into "
                     f"{wire_dtype.name} elements")
  return elements * spec.dtype.size // wire_dtype.size


def _padded(length: int, wire_dtype) -> int:
  per_line = ALIGN_BYTES // wire_dtype.size
  return -(-length // per_line) * per_line


def _spec(tensor_or_variable) -> tf.TensorSpec:
  return tf.TensorSpec(tensor_or_variable.shape,
                       tensor_or_variable.dtype.base_dtype)


def _pack(values: List[tf.Tensor], specs: List[tf.TensorSpec],
          wire_dtype) -> tf.Tensor:
  """One flat `wire_dtype` tensor of `values`, each padded (ALIGN_BYTES).

  float32 values are cast for the wire; any other dtype travels as its bits,
  so it arrives exact whatever the wire dtype.
  """
  pieces = []
  for value, spec in zip(values, specs):
    flat = tf.reshape(value, [-1])
    if spec.dtype == tf.float32:
      pieces.append(_to_wire(flat, wire_dtype))
    else:
      pieces.append(tf.reshape(tf.bitcast(flat, wire_dtype), [-1]))
    length = _wire_length(spec, wire_dtype)
    padding = _padded(length, wire_dtype) - length
    if padding:
      pieces.append(tf.zeros([padding], wire_dtype))
  return tf.concat(pieces, axis=0)


def _unpack(packed: tf.Tensor, specs: List[tf.TensorSpec]) -> List[tf.Tensor]:
  """The values that _pack packed, as `specs` describes them."""
  wire_dtype = packed.dtype
  lengths = [_wire_length(spec, wire_dtype) for spec in specs]
  padded_lengths = [_padded(n, wire_dtype) for n in lengths]
  parts = tf.split(packed, padded_lengths)
  values = []
  for spec, part, length, padded_length in zip(specs, parts, lengths,
                                               padded_lengths):
    if padded_length > length:
      part = part[:length]  # Copies this part only.
    if spec.dtype == tf.float32:
      part = _from_wire(part)
    else:
      part = tf.bitcast(
          tf.reshape(part, [-1, spec.dtype.size // wire_dtype.size]),
          spec.dtype)
    values.append(tf.reshape(part, spec.shape))
  return values


def _to_wire(tensor, wire_dtype):
  return tensor if wire_dtype == tf.float32 else tf.cast(tensor, wire_dtype)


def _from_wire(tensor):
  return tensor if tensor.dtype == tf.float32 else tf.cast(tensor, tf.float32)


class PackedReads:
  """Per PS, one read of every float32 variable it holds, split on the worker.

  Build it after the variables exist and before the training graph reads
  them; then open `variable_getter()` as a variable scope's custom getter
  while building that graph.

  Given the global step, the PS that holds it packs its value too:
  `global_step` is then that value on the worker, read with the variables,
  so the hooks' per-step read of it needs no transfer of its own (one fewer
  RPC per step; a trace showed it at 0.2 ms). A read of it alone (a hook's,
  at a session's start or at a checkpoint) moves the whole pack; those are
  rare. If the global step's PS holds no packed variable, `global_step` is
  None and the step is read as before.
  """

  def __init__(self, variables, wire_dtype=tf.float32, global_step=None):
    self._values: Dict[str, tf.Tensor] = {}
    self.global_step: Optional[tf.Tensor] = None
    with tf.name_scope("packed_reads"):
      for device, group in _by_device(variables).items():
        with_step = (global_step is not None
                     and global_step.device == device)
        specs = [_spec(v) for v in group] + ([_spec(global_step)]
                                             if with_step else [])
        with tf.device(device):
          reads = [v.read_value() for v in group]
          if with_step:
            reads.append(global_step.read_value())
          packed = _pack(reads, specs, wire_dtype)
        tf.compat.v1.add_to_collection(READ_PACKS, packed)
        # On the worker: one receive, then views of it.
        values = _unpack(packed, specs)
        if with_step:
          self.global_step = values.pop()  # Packed last, after the variables.
        for variable, value in zip(group, values):
          self._values[variable.op.name] = value

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


# Where the packed tensors go, for what a plan counts (plan.py): the bytes
# that really cross, padding and all.
READ_PACKS = "ps_trainer/packed_reads"
GRADIENT_PACKS = "ps_trainer/packed_gradients"


def pack_gradients(grads_and_vars, wire_dtype=tf.float32, factored=True):
  """Moves each PS's dense float32 gradients as one tensor; the rest as they are.

  With `factored`, a dense layer's kernel gradient travels as its two factors
  when they are smaller (gradient_factors), and the PS multiplies them.

  Returns [(gradient, variable)] in the same order, the packed ones rebuilt
  on their variable's PS.
  """
  out = list(grads_and_vars)
  groups = collections.OrderedDict()
  for index, (grad, variable) in enumerate(out):
    if isinstance(grad, tf.Tensor) and _packable(variable):
      groups.setdefault(variable.device, []).append(index)
  with tf.name_scope("packed_gradients"):
    for device, indexes in groups.items():
      # What crosses for each gradient: [gradient] or its two factors.
      sent = [(gradient_factors(out[i][0]) if factored else None)
              or [out[i][0]] for i in indexes]
      values = [tensor for tensors in sent for tensor in tensors]
      specs = [_spec(tensor) for tensor in values]
      packed = _pack(values, specs, wire_dtype)
      tf.compat.v1.add_to_collection(GRADIENT_PACKS, packed)
      with tf.device(device):
        parts = iter(_unpack(packed, specs))
        for i, tensors in zip(indexes, sent):
          if len(tensors) == 1:
            grad = next(parts)
          else:
            grad = _product(next(parts), next(parts), like=out[i][0].op)
          out[i] = (grad, out[i][1])
  return out


def gradient_factors(grad: tf.Tensor) -> Optional[List[tf.Tensor]]:
  """The two tensors whose product is `grad`, if together they are smaller.

  The kernel gradient of a dense layer, y = x @ W, is x^T @ dy: for a batch of
  64, a 784x256 kernel's 200 K floats are the product of 50 K and 16 K. TF's
  gradient of MatMul builds it as MatMul(a, b, transpose_a=True), and the PS
  runs that same op on the same values, so it gets the same bits; it does the
  multiplication the worker would have done, and the worker sends a third of
  the bytes (the "sufficient factors" of Xie et al. 2015 and Poseidon). A
  kernel used twice (a sum of products), a batch of unknown size, or a
  product that waits on other ops (control inputs, which the PS's copy would
  not keep) is sent as it is.
  """
  op = grad.op
  if (op.type != "MatMul" or not op.get_attr("transpose_a")
      or op.get_attr("transpose_b") or op.control_inputs):
    return None
  factors = list(op.inputs)
  if not all(f.shape.is_fully_defined() for f in factors):
    return None
  if sum(f.shape.num_elements() for f in factors) >= grad.shape.num_elements():
    return None
  return factors


def _product(a: tf.Tensor, b: tf.Tensor, like: tf.Operation) -> tf.Tensor:
  """a^T @ b by the same op as `like`, the worker's MatMul: every attribute
  copied (TF's gradient marks it grad_a or grad_b), so the PS gets the bits
  the worker would have."""
  attrs = {name: like.get_attr(name) for name in ("grad_a", "grad_b")
           if name in like.node_def.attr}
  return tf.raw_ops.MatMul(a=a, b=b, transpose_a=True, transpose_b=False,
                           **attrs)


def densely_read(variables) -> list:
  """Those of `variables` that the graph reads whole and never by rows.

  A user's model is built before its reads could be packed (Keras makes its
  variables as it runs), so its reads are rerouted afterwards
  (reroute_reads); a variable also read by rows (an embedding lookup) stays
  out of the packs, which would move all of it every step.
  """
  out = []
  for variable in variables:
    if not isinstance(variable, tf.Variable) or not hasattr(variable, "handle"):
      continue
    uses = {op.type for op in variable.handle.consumers()}
    if "ReadVariableOp" in uses and uses <= _WHOLE_READS:
      out.append(variable)
  return out


# What may use a variable that reroute_reads packs: its reads, made its
# packed value, and its own set-up. Any other use (a row lookup, a control
# flow or function that captured it) would bypass the packed value, and its
# gradient would be lost.
_WHOLE_READS = {"ReadVariableOp", "AssignVariableOp", "VarIsInitializedOp"}


def reroute_reads(variables, reads: PackedReads) -> int:
  """Makes every op that takes a ReadVariableOp of one of `variables` take
  its packed value instead; returns how many inputs it rerouted. Give it
  densely_read's variables, whose every use is such a read.

  For a model already built (train_graph.py builds a user's model first):
  the model then reads each PS's variables in one transfer, as a built-in
  model does through PackedReads.variable_getter. Ops are rewired in place
  (Operation._update_input; TF's own graph editors do the same) before any
  session runs the graph.
  """
  rerouted = 0
  for variable in variables:
    value = reads.value_of(variable)
    if value is None:
      continue
    for read in variable.handle.consumers():
      if read.type != "ReadVariableOp" or read.name.startswith("packed_reads"):
        continue
      for consumer in list(read.outputs[0].consumers()):
        for index, tensor in enumerate(consumer.inputs):
          if tensor is read.outputs[0]:
            consumer._update_input(index, value)  # pylint: disable=protected-access
            rerouted += 1
  return rerouted
