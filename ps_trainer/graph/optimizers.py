"""The optimizers, by --optimizer name.

Each is TF1's own, with one change to Adam for models spread over several PS
(`PerPsAdam`): same variables, same checkpoint names, same numbers.
"""

import contextlib

import tensorflow as tf

OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad")


def make_optimizer(name: str, learning_rate: float):
  """A TF1 optimizer by name; momentum uses 0.9."""
  train = tf.compat.v1.train
  if name == "sgd":
    return train.GradientDescentOptimizer(learning_rate)
  if name == "momentum":
    return train.MomentumOptimizer(learning_rate, momentum=0.9)
  if name == "adam":
    return PerPsAdam(learning_rate)
  if name == "adagrad":
    return train.AdagradOptimizer(learning_rate)
  raise ValueError(f"--optimizer={name!r} is unknown; accepted: "
                   f"{', '.join(OPTIMIZERS)}")


class PerPsAdam(tf.compat.v1.train.AdamOptimizer):
  """TF1's Adam, with its shared state crossing between PS once per PS per step.

  Adam keeps two scalars, beta1_power and beta2_power, beside one variable
  (on one PS), and TF's Adam reads both anew for every variable's update: on
  a model spread over several PS, each variable on another PS costs two
  transfers between PS tasks per step. Here the updates on one PS share one
  read of the two, stacked into one tensor: one transfer per PS. A step of a
  12-variable MLP on 3 PS moves 5 tensors between PS tasks this way (the
  rest are the tokens that order the scalars' own update and the global
  step's after the others) against 15 with TF's Adam and 2 with SGD.

  The scalars are read before any update changes them, as in TF's Adam (their
  update waits on every variable's), so the arithmetic is the same. Resource
  variables only, as the trainer makes; reference variables keep TF's reads.
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._power_reads = {}  # device -> (beta1_power, beta2_power) values
    self._updating = None  # the variable whose update is being built

  def _get_beta_accumulators(self):
    """The two variables, except inside one variable's update, which gets
    the values read for its device."""
    beta1_power, beta2_power = super()._get_beta_accumulators()
    if self._updating is None:  # _finish, which assigns to the variables
      return beta1_power, beta2_power
    device = self._updating.device
    if device not in self._power_reads:
      # Stacked where the scalars live: one tensor to send, not two. The
      # colocation is required, too: under apply_gradients' colocation with
      # the variable, the reads could not be placed beside the scalars.
      with tf.compat.v1.colocate_with(beta1_power, ignore_existing=True):
        both = tf.stack([beta1_power.read_value(), beta2_power.read_value()])
      self._power_reads[device] = tuple(tf.unstack(both))
    return self._power_reads[device]

  def _finish(self, update_ops, name_scope):
    self._power_reads = {}  # Each apply_gradients reads afresh, in its graph.
    return super()._finish(update_ops, name_scope)

  @contextlib.contextmanager
  def _building_update_of(self, var):
    self._updating = var
    try:
      yield
    finally:
      self._updating = None

  def _resource_apply_dense(self, grad, var):
    with self._building_update_of(var):
      return super()._resource_apply_dense(grad, var)

  def _resource_apply_sparse(self, grad, var, indices):
    with self._building_update_of(var):
      return super()._resource_apply_sparse(grad, var, indices)
