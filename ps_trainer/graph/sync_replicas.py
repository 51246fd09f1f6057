"""Synchronous replicas with one token queue per replica.

The scheme is TF1's SyncReplicasOptimizer's: every variable has a gradient
accumulator on its PS that takes gradients tagged with the sender's local
step, drops stale ones, and hands the chief's sync op the average of
`replicas_to_aggregate` fresh ones; the sync op applies it, moves the global
step on and hands out tokens (the new global step), and a replica's train op
ends by taking one: that is how it learns the step it may compute next.

TF1 puts every token in one queue that all replicas take from, so a token is
anybody's. A worker killed after its gradient went in but before it took its
token leaves that token to the next taker: the chief took it at once, sent a
second gradient for the same step, and since the accumulators count
gradients, not replicas, its two made a step; each such step leaves it the
token of the dead worker again. In CI the "synchronous" chief went on to
train alone, 237 steps in 4 s, while the job should have waited for the
worker (tests/test_faults.py). A fast worker likewise takes a slow one's
token and counts twice in a step.

Here the sync op puts one token in each replica's own queue, so a replica
can only ever take its own, and it takes all it has and keeps the newest:
a replica that fell behind (a backup, or a worker back from a restart) skips
straight to the current step instead of sending a stale gradient for each
token it missed.

A token no newer than the step of the gradient a replica just sent was not
made by that gradient's step: it is a release (handed out by a chief that
resumes a run, for replicas blocked in a step, or at the end), or one given
in the instant a replica joined. It still ends the replica's step, but its
next gradient carries a local step of -1, which every accumulator drops, and
the replica then waits for a token as usual: it never counts twice.

A replica takes all its tokens every step, so its queue holds one per
global step it is behind: a few for a slow backup worker. Only a replica
that is gone (a dead backup worker the run goes on without) lets them pile
up, one per global step, on the PS for as long as the run lasts. So a
queue holding MAX_WAITING_TOKENS gets no more: a replica that comes back
empties its queue before it starts (_start_step), and one that was merely
that many steps behind takes a stale token, so its next gradient is dropped
and the one after is fresh again.
"""

from typing import List

import tensorflow as tf

from ps_trainer.cluster import waits


# A local step below every global step: a gradient tagged with it is stale.
_DROPPED = -1

# Tokens a replica's queue may hold (see the module docstring): a bound on
# what a replica gone for good costs its PS, far above what a live one keeps.
MAX_WAITING_TOKENS = 100


class SyncOptimizer(tf.compat.v1.train.Optimizer):
  """Wraps `optimizer` so each global step averages gradients of N replicas.

  With more workers than `replicas_to_aggregate` the extra ones are backups:
  a step completes once fresh gradients of N different replicas have arrived
  (any others already in by then are averaged in too), and gradients older
  than the global step are dropped, so the slowest worker never holds a step
  up.

  Build it on every replica with the same arguments except
  `replica_index`, then use `apply_gradients`'s train op as the replica's
  train op. The chief runs `chief_init_op` once per session and `sync_op` in
  a loop (sync.SyncReplicasHook does both); every other replica runs
  `local_step_init_op` once per session.

  Attributes, after apply_gradients():
    local_step_init_op: starts this replica at the current global step.
    chief_init_op: also tells the accumulators the current global step.
    ready_for_local_init_op: reports the global variables not yet set.
    sync_op: waits for N fresh gradients per variable, applies their mean,
      moves the global step on and gives every replica a token of it.
    release_op: gives every replica a token of the current global step, so
      a replica blocked at the end of its step returns.
    release_others_op: the same for every replica but this one.
    release_own_op: the same for this replica only.
  """

  def __init__(self, optimizer: tf.compat.v1.train.Optimizer,
               replicas_to_aggregate: int, num_workers: int,
               replica_index: int, name: str = "sync_replicas",
               max_waiting_tokens: int = MAX_WAITING_TOKENS):
    super().__init__(use_locking=False, name=name)
    if not 0 <= replica_index < num_workers:
      raise ValueError(f"replica_index {replica_index} is not one of the "
                       f"{num_workers} replicas")
    if max_waiting_tokens < 1:
      raise ValueError(f"max_waiting_tokens must be at least 1, not "
                       f"{max_waiting_tokens}: a replica needs a token to "
                       "end its step")
    self._opt = optimizer
    self._replicas_to_aggregate = replicas_to_aggregate
    self._num_workers = num_workers
    self._replica_index = replica_index
    self._max_waiting_tokens = max_waiting_tokens
    self.local_step_init_op = None
    self.chief_init_op = None
    self.ready_for_local_init_op = None
    self.sync_op = None
    self.release_op = None
    self.release_others_op = None
    self.release_own_op = None

  def compute_gradients(self, *args, **kwargs):
    return self._opt.compute_gradients(*args, **kwargs)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Sends this replica's gradients and takes its token: the train op."""
    grads_and_vars = list(grads_and_vars)
    if not grads_and_vars:
      raise ValueError("no gradients to apply")
    if global_step is None:
      raise ValueError("a global step is needed to tell stale gradients")
    # A local variable, never checkpointed or shared, and on this worker:
    # a device function sends every variable to a PS, so it sits with an op
    # that the device function leaves on the worker.
    with tf.compat.v1.colocate_with(tf.no_op(name="local_anchor")):
      local_step = tf.compat.v1.Variable(
          0, dtype=global_step.dtype.base_dtype, trainable=False,
          collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
          name="sync_rep_local_step")
    self.ready_for_local_init_op = waits.report_uninitialized(
        tf.compat.v1.global_variables())
    # One read for the gradients' tags and the check of the token.
    sent = local_step.read_value()

    sends, means, accumulators = [], [], []
    with tf.compat.v1.name_scope(None, self._name):
      for grad, var in grads_and_vars:
        if grad is None:
          means.append(None)
          continue
        with tf.compat.v1.device(var.device):
          send, mean, accumulator = _accumulate(
              grad, var, sent, self._replicas_to_aggregate)
        sends.append(send)
        means.append(mean)
        accumulators.append((accumulator, var.device))

    with tf.compat.v1.device(global_step.device), tf.compat.v1.name_scope(""):
      update = self._opt.apply_gradients(
          zip(means, [v for _, v in grads_and_vars]), global_step)
      queues = [tf.queue.FIFOQueue(-1, global_step.dtype.base_dtype,
                                   shapes=(), name=f"sync_token_q_{i}",
                                   shared_name=f"sync_token_q_{i}")
                for i in range(self._num_workers)]

      def give(to_queues):
        return _give_each_a_token(to_queues, global_step,
                                  self._max_waiting_tokens)

      with tf.control_dependencies([update]):
        self.sync_op = give(queues)
      self.release_op = give(queues)
      own_queue = queues[self._replica_index]
      self.release_others_op = give([q for q in queues if q is not own_queue])
      self.release_own_op = give([own_queue])
      with tf.control_dependencies(sends):
        token = _newest_token(own_queue)
      start = _start_step(own_queue, global_step)
    next_step = tf.where(token > sent, token,
                         tf.constant(_DROPPED, token.dtype))
    train_op = local_step.assign(next_step, name=name, read_value=False)
    self.local_step_init_op = local_step.assign(start, read_value=False)

    chief_init = [self.local_step_init_op]
    for accumulator, device in accumulators:
      with tf.compat.v1.device(device):
        chief_init.append(accumulator.set_global_step(
            global_step, name="SetGlobalStep"))
    self.chief_init_op = tf.group(*chief_init)
    return train_op

  def get_slot(self, *args, **kwargs):
    return self._opt.get_slot(*args, **kwargs)

  def get_slot_names(self, *args, **kwargs):
    return self._opt.get_slot_names(*args, **kwargs)

  def variables(self) -> List[tf.Variable]:
    return self._opt.variables()


def _accumulate(grad, var, local_step, replicas_to_aggregate: int):
  """(op sending `grad`, the mean of N fresh ones, the accumulator)."""
  if isinstance(grad, tf.IndexedSlices):
    accumulator = tf.compat.v1.SparseConditionalAccumulator(
        grad.dtype, shape=(), shared_name=var.name + "/grad_accum")
    return (accumulator.apply_indexed_slices_grad(grad, local_step=local_step),
            accumulator.take_indexed_slices_grad(replicas_to_aggregate),
            accumulator)
  accumulator = tf.compat.v1.ConditionalAccumulator(
      grad.dtype, shape=var.get_shape(), shared_name=var.name + "/grad_accum")
  return (accumulator.apply_grad(grad, local_step=local_step),
          accumulator.take_grad(replicas_to_aggregate), accumulator)


def _give_each_a_token(queues, global_step, limit: int) -> tf.Operation:
  """The current global step into every queue holding fewer than `limit`.

  Never a blocking enqueue: the queues are unbounded, and a full one gets
  none (a batch of zero tokens). The bound is loose by a token or two, when
  the chief's sync thread and its end-of-run release give at once.
  """
  token = global_step.read_value()
  gives = []
  for queue in queues:
    count = tf.cast(queue.size() < limit, tf.int32)
    gives.append(queue.enqueue_many(tf.fill([count], token)))
  return tf.group(*gives)


def _newest_token(queue) -> tf.Tensor:
  """Waits for a token in `queue`, then takes every one there: the newest.

  Only this replica takes from its queue, so the size read first can only
  grow before the dequeue: taking max(size, 1) never waits once one is in.
  (The PS cancels the pending dequeue of a replica whose process died when
  its connection closes; one left behind by a cut link would take a token of
  the replica's next process, as it would in TF1's shared queue.)
  """
  waiting = queue.size()
  tokens = queue.dequeue_many(tf.maximum(waiting, 1))
  return tf.reduce_max(tokens)


def _start_step(queue, global_step) -> tf.Tensor:
  """Where a replica starts: the global step, and its queue emptied.

  A worker back from a restart finds the tokens given to it while it was
  away; had it kept them, its first step would return at once and its next
  gradient would be dropped (see the module docstring): a step's work lost.
  The step is read before the queue is emptied, so a token taken with the
  rest can only be newer than it (then the replica starts there).
  """
  step = global_step.read_value()
  with tf.control_dependencies([step]):
    left = queue.dequeue_many(queue.size())
  return tf.reduce_max(tf.concat([[step], left], 0))
