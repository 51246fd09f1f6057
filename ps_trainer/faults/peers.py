"""A replica and the other tasks: waiting for them, naming the ones a step
waits for, and what it still owes them when it leaves.
"""

import os

from ps_trainer.cluster import ps_flags
from ps_trainer.cluster import repeats
from ps_trainer.cluster import waits
from ps_trainer.console import errors
from ps_trainer.faults import ps_runs
from ps_trainer.settings import run_signature


# How long a task whose step is stuck waits for its peers to answer before
# it starts itself again (stall_watch.StallWatchHook); TF takes 3-10 s to start.
RESTART_GRACE_SECS = 30.0
# How long a chief that refuses connections at the end of a run gets to come
# back (one starting itself again takes 3-10 s) before it counts as gone.
CHIEF_BACK_SECS = 15.0
# How often a worker looks whether the chief has the model ready.
_CHIEF_POLL_SECS = 0.05


class Peers:
  """One replica's view of the rest of the cluster; inert in local mode.

  Args:
    cfg: the run's configuration.
    tg: the replica's train_graph.TrainGraph.
    target: this task's server target.
    session_config: the task's ConfigProto.
    stop: the task's stops.StopRequest.
  """

  def __init__(self, cfg, tg, target: str, session_config, stop):
    self._cfg = cfg
    self._info = cfg.cluster
    self._tg = tg
    self._target = target
    self._session_config = session_config
    self._stop = stop
    self._timeout = cfg.train.wait_timeout_secs
    self._gone_when_named = set()  # Whom stall_reason found not answering.
    self._finished = False  # Whether leave() said this replica finished.

  def wait(self) -> None:
    """Before each session: waits, saying so, for the PS tasks, then the chief,
    then tells the PS tasks this replica trains (ps_flags.clear_done).

    Raises:
      run_signature.MismatchError: this worker's training flags differ from
        the chief's, which would otherwise hang the job or crash mid-run.
      waits.WaitTimeout: they did not answer within --wait_timeout_secs.
      waits.Stopped: a stop was requested meanwhile.
    """
    if self._info is None:
      return
    waits.wait_for_addresses(self._info.ps_addresses(), self._timeout,
                             stop=self._stop, note_at_once=True)
    if not self._info.is_chief:
      self._wait_for_chief()
    # After a stop and a restart this replica's done flag is still set.
    ps_flags.clear_done(self._target, self._info)

  def _wait_for_chief(self) -> None:
    """MonitoredTrainingSession would wait too, but checks only every 30 s,
    so a worker that starts a moment before the chief would miss half a
    short run. Each look is one small read on a PS, so it looks often: at
    every 0.5 s an async chief trained some hundred steps alone."""
    tg = self._tg
    what = "the chief to initialize or restore the model"
    with repeats.session(self._target, graph=tg.graph,
                         config=self._session_config) as session:
      waits.wait_until(lambda: session.run(tg.signature_published), what,
                       self._timeout, poll_secs=_CHIEF_POLL_SECS,
                       stop=self._stop)
      problem = run_signature.mismatch(
          tg.own_signature, session.run(tg.signature).decode())
      if problem:
        raise run_signature.MismatchError(problem)
      waits.wait_until(waits.all_initialized(session, tg.model_not_ready), what,
                       self._timeout, poll_secs=_CHIEF_POLL_SECS,
                       stop=self._stop)

  def stall_reason(self) -> str:
    """What a long step waits for: the peers it needs that do not answer."""
    # A sync step waits for both: a lost PS is as likely as a lost worker.
    waited_for = ("the PS tasks and the other workers' gradients"
                  if self._cfg.train.sync_replicas else "the PS tasks")
    gone = waits.unreachable(self._needed())
    self._gone_when_named = set(gone)
    if gone:
      return f"{waited_for}; not answering: {', '.join(gone)}"
    return f"{waited_for} (every known task answers: a slow or restarting peer?)"

  def silent_ps(self) -> str:
    """"ps 0 at host:port, ..." for the PS tasks that refuse connections now."""
    return ", ".join(waits.unreachable(self._info.ps_addresses()))

  def silent_when_named(self) -> bool:
    """Whether stall_reason() found a peer not answering, when last called."""
    return bool(self._gone_when_named)

  def answer_for_a_restart(self, within_secs: float = RESTART_GRACE_SECS
                           ) -> bool:
    """Whether every peer a step needs answers, now or within `within_secs`.

    The grace is for a peer that is starting again itself (the tasks of a
    stuck sync step give up within a second of each other), not for one that
    did not answer when the stall was last named either: that one is gone.
    """
    needed = self._needed()
    gone = set(waits.unreachable(needed))
    if not gone:
      return True
    if gone & self._gone_when_named:
      return False
    return not waits.still_unreachable(needed, within_secs)

  def session_peers(self) -> str:
    """"ps 0 at host:port, ...": the PS tasks and, for a non-chief, the
    chief: the tasks a session start waits for."""
    needed = self._info.ps_addresses()
    if not self._info.is_chief:
      needed.update(self._chief())
    return waits.describe(needed)

  def chief_gone(self) -> str:
    """"worker 0 at host:port" if this non-chief replica's chief refuses
    connections, has not said on PS 0 that it finished the run (it died, or
    was stopped before the end) and is not back within CHIEF_BACK_SECS (a
    chief starting itself again); else "". Each look is bounded: the stall
    watch has ended."""
    if self._info is None or self._info.is_chief:
      return ""
    chief = self._chief()
    if not waits.unreachable(chief):
      return ""
    said = ps_runs.PsRuns(self._target, self._info, timeout_secs=5.0).run(
        0, lambda: ps_flags.done_flags(0, self._info.num_workers)[0],
        "read whether the chief said it is done")
    if said is None or said == ps_flags.FINISHED:  # Unknown, or it finished.
      return ""
    gone = waits.still_unreachable(chief, CHIEF_BACK_SECS)
    return waits.describe(gone) if gone else ""

  def _chief(self) -> dict:
    """{name: address} of the chief, empty where a sparse TF_CONFIG does
    not list it."""
    chief = "chief" if self._info.has_chief_job else "worker 0"
    address = self._info.replica_addresses().get(chief)
    return {chief: address} if address else {}

  def _needed(self) -> dict:
    """{name: address} of the tasks a step of this replica needs."""
    needed = self._info.ps_addresses()
    if self._cfg.train.sync_replicas:
      needed.update(self.other_replicas())
    return needed

  def other_replicas(self) -> dict:
    """{name: address} of the other training replicas this task knows."""
    return {name: address
            for name, address in self._info.replica_addresses().items()
            if address != self._info.address}

  def others_gone(self) -> bool:
    """True when none of the other replicas answers (they crashed).

    False when this task knows none of them (a sparse TF_CONFIG).
    """
    others = self.other_replicas()
    return bool(others) and len(waits.unreachable(others)) == len(others)

  def add_last_resorts(self) -> None:
    """What a task forced to exit still does: the chief saves, all say done."""
    if self._info is None:
      return
    if self._info.is_chief:
      self._stop.add_last_resort(self._save_checkpoint, "a last checkpoint")
    # Not before a restart: the PS tasks could leave before it is back. A
    # replica forced out after it finished (in its export, say) still did.
    self._stop.add_last_resort(
        lambda: self._signal_done(self._finished, timeout_secs=5),
        "telling the PS tasks this worker is done", before_restart=False)

  def _save_checkpoint(self) -> None:
    tg = self._tg
    with repeats.session(self._target, graph=tg.graph,
                         config=self._session_config) as session:
      path = tg.saver.save(
          session, os.path.join(self._cfg.train.log_dir, "model.ckpt"),
          global_step=tg.global_step, write_meta_graph=False)
    errors.say(f"{self._cfg.task_name}: wrote a last checkpoint {path}")

  def leave(self, finished: bool) -> None:
    """Tells the PS tasks this replica is done for good: `finished` the run,
    or stopped before its end."""
    self._finished = finished
    if self._info is not None:
      self._signal_done(finished,
                        timeout_secs=5 if self._stop.requested else 30)

  def _signal_done(self, finished: bool, timeout_secs: float) -> None:
    ps_flags.signal_done(self._target, self._info, finished,
                         timeout_secs=timeout_secs)
