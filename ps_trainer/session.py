"""The MonitoredSession a replica trains in.

The same hooks and session creators as MonitoredTrainingSession, with one
difference: before each session is created - the first and every one that
replaces a session lost to a PS or chief that went away - this replica waits,
saying whom it waits for, until the tasks it needs answer. TF's own creators
wait silently (for a PS) or poll every 30 s (for the chief's model).
"""

from typing import Callable, Optional

import tensorflow as tf

train = tf.compat.v1.train


class _AnnouncedCreator(train.SessionCreator):
  """Runs `before()` ahead of each session; says so when a session is replaced."""

  def __init__(self, inner: train.SessionCreator, before: Callable[[], None],
               who: str):
    self._inner = inner
    self._before = before
    self._who = who
    self._created = 0

  def create_session(self):
    if self._created:
      print(f"{self._who}: lost the session (a PS or the chief stopped "
            "answering); reconnecting", flush=True)
    self._before()
    session = self._inner.create_session()
    self._created += 1
    return session


def monitored_session(*, who: str, is_chief: bool, target: str, config,
                      scaffold: train.Scaffold, hooks: list, chief_hooks: list,
                      log_dir: Optional[str], save_checkpoint_secs,
                      save_checkpoint_steps, save_summaries_steps: int,
                      before_session: Callable[[], None]):
  """A MonitoredSession as MonitoredTrainingSession would build it.

  The chief restores from and checkpoints into `log_dir` and writes
  summaries there; hooks run in MonitoredTrainingSession's order (chief
  hooks, summaries, checkpoints, then `hooks`).
  """
  if is_chief:
    inner = train.ChiefSessionCreator(scaffold=scaffold, master=target,
                                      config=config, checkpoint_dir=log_dir)
    all_hooks = list(chief_hooks)
    if log_dir:
      all_hooks.append(train.SummarySaverHook(
          scaffold=scaffold, save_steps=save_summaries_steps,
          output_dir=log_dir))
      all_hooks.append(train.CheckpointSaverHook(
          log_dir, save_secs=save_checkpoint_secs,
          save_steps=save_checkpoint_steps, scaffold=scaffold))
    all_hooks.extend(hooks)
  else:
    inner = train.WorkerSessionCreator(scaffold=scaffold, master=target,
                                       config=config)
    all_hooks = list(hooks)
  return train.MonitoredSession(
      session_creator=_AnnouncedCreator(inner, before_session, who),
      hooks=all_hooks, stop_grace_period_secs=10)
