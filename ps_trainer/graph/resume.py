"""How the chief starts: keep the model the PS tasks hold, else restore, else initialize.

MonitoredTrainingSession's chief restores the newest checkpoint when there is
one and runs the init op when there is none. Both are wrong when the PS tasks
kept running while the chief restarted: restoring rolls the model back to the
last checkpoint, and initializing throws away everything learnt so far
(tensorflow/tensorflow#13806). The PS tasks hold the
newest state then, so the chief keeps it.
"""

from typing import Optional

import tensorflow as tf

from ps_trainer.cluster import waits
from ps_trainer.console import errors


class ChiefStart:
  """Graph pieces and session callbacks for the chief's session start.

  Build it in the graph before the session; use `saver()` as the scaffold's
  saver, `init_fn` as its init_fn and a no-op as its init_op.

  Args:
    model_variables: what a checkpoint holds and the init op initializes.
    not_ready: waits.report_uninitialized(model_variables).
    global_step: to say where a kept model stands.
    sync: whether sync_replicas.SyncOptimizer's accumulators and token
      queues live on the PS tasks (the queues with the global step). A
      chief killed between its sync thread's take_grad (which moves the
      accumulators' step on) and the update of the global step leaves the
      workers holding tokens, and sending gradients tagged, one step past
      the global step; a token no newer than a replica's last tag counts as
      a release (sync_replicas), so no step would complete. Keeping the
      model then moves the global step on by one. Likewise after a restore
      while the PS with the token queues kept running (another PS
      restarted): tokens up to the last step this chief saw are still there,
      so the global step is raised past it (see `remember_steps`). When that
      PS restarted too, its queues are new and the steps since the
      checkpoint are trained again.
    last_step: --train_steps; no move goes past it.
    who: names the task in what it says ("chief", "local").
  """

  def __init__(self, model_variables, not_ready, global_step,
               sync: bool = False, last_step: Optional[int] = None,
               who: str = "chief"):
    self.who = who
    self._model_variables = list(model_variables)
    self._not_ready = not_ready
    self._initialize = tf.compat.v1.variables_initializer(
        self._model_variables)
    self._global_step = global_step
    self._last_step = last_step
    self._step_past_accumulators = None
    if sync:
      self._step_past_accumulators = tf.compat.v1.assign_add(global_step, 1)
      self._floor = tf.compat.v1.placeholder(global_step.dtype.base_dtype,
                                             [], name="global_step_floor")
      self._raise_to_floor = global_step.assign(
          tf.maximum(global_step.read_value(), self._floor))
      self._tokens_live = tf.compat.v1.is_variable_initialized(global_step)
      # Run only by a restore; spare the others TF's "never used" dump.
      getattr(self._tokens_live, "mark_used", lambda: None)()
    self._seen_step = lambda: None
    self._margin = 0
    # Whether this session started in the middle of a run whose sync state
    # lives on: a restarted chief kept the model, or a chief that lost a PS
    # restored it while the PS with the token queues kept running. Other
    # workers may be blocked on the token queue then (sync.SyncReplicasHook
    # releases them).
    self.resumed_mid_run = False

  def remember_steps(self, seen_step, margin: int) -> None:
    """Sync mode: a restore leaves the global step at least seen_step() + margin.

    Args:
      seen_step: () -> the last global step this process saw, or None.
      margin: global steps the job may have made beyond it (the accumulators
        are at most one ahead of the real global step).
    """
    self._seen_step = seen_step
    self._margin = margin

  def model_is_live(self, session) -> bool:
    """True if every model variable already has a value on its PS."""
    return waits.all_initialized(session, self._not_ready)()

  def saver(self, **kwargs) -> tf.compat.v1.train.Saver:
    """A Saver of the model variables that restores only over an empty PS."""
    return _KeepingSaver(self, self._model_variables, **kwargs)

  def init_fn(self, unused_scaffold, session) -> None:
    """Initializes the model unless the PS tasks hold it already."""
    if self._keep(session):
      return
    session.run(self._initialize)

  def restore(self, session, save_path: str, restore) -> None:
    """Restores `save_path` with `restore` (the Saver's own) unless the PS
    tasks still hold the model; moves the global step past live tokens."""
    if self._keep(session):
      return
    tokens_live = self._tokens_outlived_the_model(session)
    restore(session, save_path)
    # Silent in TF; after a PS restart it is what the job went back to.
    errors.say(f"{self.who}: restored {save_path}")
    if tokens_live:
      self._step_past_live_tokens(session)

  def _keep(self, session) -> bool:
    self.resumed_mid_run = self.model_is_live(session)
    if not self.resumed_mid_run:
      return False
    step = int(session.run(self._global_step))
    print(f"chief: the PS tasks still hold the model at global step {step}; "
          "keeping it rather than a checkpoint or fresh weights", flush=True)
    if (self._step_past_accumulators is not None
        and (self._last_step is None or step < self._last_step)):
      session.run(self._step_past_accumulators)
    return True

  def _tokens_outlived_the_model(self, session) -> bool:
    """Before a restore: whether the token queues' PS kept running."""
    if self._step_past_accumulators is None:
      return False
    return bool(session.run(self._tokens_live))

  def _step_past_live_tokens(self, session) -> None:
    seen = self._seen_step()
    if seen is None:
      return
    self.resumed_mid_run = True
    restored = int(session.run(self._global_step))
    floor = seen + self._margin
    if self._last_step is not None:
      floor = min(floor, self._last_step)
    if floor > restored:
      session.run(self._raise_to_floor, {self._floor: floor})
      print(f"chief: restored the newest checkpoint (global step {restored}) "
            f"and moved the global step on to {floor}, past the sync tokens "
            "of the PS that kept running", flush=True)


class _KeepingSaver(tf.compat.v1.train.Saver):
  """A Saver whose restore() leaves a model the PS tasks still hold alone."""

  def __init__(self, start: ChiefStart, var_list, **kwargs):
    super().__init__(var_list, **kwargs)
    self._start = start

  def restore(self, sess, save_path):
    self._start.restore(sess, save_path, super().restore)
