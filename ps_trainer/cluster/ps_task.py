"""A PS task's life: serve until every worker says it is done (ps_flags.py),
or until none has answered for --wait_timeout_secs, or a stop request."""

import time
from typing import Optional

from ps_trainer.cluster import host_cores
from ps_trainer.cluster import ps_flags
from ps_trainer.cluster import server as server_lib
from ps_trainer.cluster import waits
from ps_trainer.console import errors
from ps_trainer.settings import cluster as cluster_lib

# The longest pause between two "waiting for" lines of a PS.
_MAX_STRAGGLER_NOTE_SECS = 600.0


def run_ps(info: cluster_lib.ClusterInfo, stop, wait_timeout_secs: float,
           poll_secs: float = 0.5, probe_every_secs: float = 2.0,
           straggler_note_secs: float = 30.0, clock=time.monotonic) -> int:
  """Runs a PS task until every replica is done; returns the exit status.

  0 once every replica has said it is done. A PS never waits forever: if no
  worker has answered for `wait_timeout_secs` (they crashed or were never
  started), it gives up with status 1. After a stop request (`stop`, a
  stops.StopRequest) it stays only while workers still answer, at most the
  stop's grace period, so a stopping chief can still write its checkpoint.
  When the others finished the run after the chief was stopped, it keeps
  their steps for the chief (ChiefKeep) up to `wait_timeout_secs`.
  """
  server = server_lib.start_server(info)
  watch = _WorkerWatch(info, wait_timeout_secs, probe_every_secs, clock)
  with ps_flags.OwnFlags(info, server.target) as read_flags:
    errors.say(f"ps {info.task_index}: serving on {info.address}; waiting "
               f"for {info.num_workers} worker(s) to finish"
               f"{host_cores.pinned_note()}")
    # The flags, not their count: one replica started again (its flag
    # cleared) while another finishes leaves the count as it was.
    last = [0] * info.num_workers
    keep = ChiefKeep(info, wait_timeout_secs)
    stop_seen = None
    next_note = None
    note_gap = straggler_note_secs
    while True:
      flags = read_flags()
      done = sum(1 for flag in flags if flag)
      now = clock()
      changed = flags != last
      if changed or (next_note is not None and now >= next_note):
        # Once some are done, the rest are named: one that never joined
        # (other host lists, say) is otherwise waited for in silence. Named
        # ever more rarely while nothing changes: one worker stopped for good
        # while the rest train on for hours is not worth a line every 30 s.
        note_gap = (straggler_note_secs if changed
                    else min(2 * note_gap, _MAX_STRAGGLER_NOTE_SECS))
        left = not_done_names(info, flags)
        watch.note_done(flags)
        errors.say(f"ps {info.task_index}: {done} of {info.num_workers} "
                   f"worker(s) done{'; waiting for ' + left if left else ''}")
        last = flags
        next_note = now + note_gap if left else None  # None left: said once.
      keeping = keep.keeping(flags, now)
      if done >= info.num_workers and not keeping:
        break
      # Kept for a stopped chief, the workers have all left: none to probe.
      answering = not keeping and watch.any_answering(now)
      if stop.requested:
        stop_seen = stop_seen or now
        if not answering or now - stop_seen >= stop.grace_secs:
          errors.say(f"ps {info.task_index}: stopped on {stop.signal_name} "
                     f"with {done} of {info.num_workers} worker(s) done")
          return stop.exit_status()
      elif keeping:
        if keep.gave_up(now):
          return 1
      elif watch.gave_up(now):
        # A chief that died after its last checkpoint while others finished.
        lost = ("; the steps trained since the chief's last checkpoint are "
                "lost" if not flags[0] and ps_flags.FINISHED in flags[1:]
                else "")
        errors.say(f"ps {info.task_index}: giving up: no worker has answered "
                   f"for {watch.silent_secs(now):.0f} s ({watch.describe()}) "
                   f"and {done} of {info.num_workers} said done "
                   f"(--wait_timeout_secs={wait_timeout_secs:g}){lost}; "
                   "exiting with status 1")
        return 1
      time.sleep(poll_secs)
  if stop.requested:  # Stopped tasks exit 128 + the signal, as the others.
    errors.say(f"ps {info.task_index}: every worker is done; stopped on "
               f"{stop.signal_name}")
    return stop.exit_status()
  errors.say(f"ps {info.task_index}: every worker is done; exiting")
  return 0


class ChiefKeep:
  """Whether a PS keeps the model for a chief that was stopped while the
  other replicas trained on (async) and then finished the run.

  Their steps since the chief's final checkpoint exist only on the PS tasks:
  leaving would lose them, and the chief started again with its command
  would find no PS. So the PS stays, as for a chief that died, until the
  chief is back (it clears its flag, then finishes) or `timeout_secs` have
  passed; workers no longer answer then, so this clock, not the workers',
  bounds it (a sparse cluster's PS has no workers to probe).
  """

  def __init__(self, info: cluster_lib.ClusterInfo, timeout_secs: float):
    self._info = info
    self._timeout = timeout_secs
    self._since = None

  def keeping(self, flags: list, now: float) -> bool:
    chief_stopped = flags[0] == ps_flags.STOPPED
    if chief_stopped and ps_flags.FINISHED in flags[1:] and all(flags):
      if self._since is None:
        self._since = now
        errors.say(
            f"ps {self._info.task_index}: every worker is done, but the "
            f"chief ({self._chief()}) was stopped before the run's end: "
            "keeping the steps trained since its final checkpoint until it "
            "is started again with its command to save them (giving up "
            f"after --wait_timeout_secs={self._timeout:g})")
      return True
    self._since = None
    return False

  def _chief(self) -> str:
    return _named(self._info.replica_name(0), self._info.replica_addresses())

  def gave_up(self, now: float) -> bool:
    if now - self._since < self._timeout:
      return False
    errors.say(
        f"ps {self._info.task_index}: giving up: the chief was not started "
        f"again within --wait_timeout_secs={self._timeout:g}; the steps "
        "trained since its final checkpoint are lost; exiting with status 1")
    return True


def _named(name: str, addresses: dict) -> str:
  """"worker 1 at host:port" for a replica's name, or the name alone where
  `addresses` (the cluster's replica_addresses) lacks it (a sparse one)."""
  address = addresses.get(name)
  return f"{name} at {address}" if address else name


def not_done_names(info: cluster_lib.ClusterInfo, flags: list,
                   most: int = 5) -> str:
  """"worker 1 at host:port, ..." for the replicas whose flag is not set.

  The first `most` of them, then how many more: a big job's line stays short.
  """
  addresses = info.replica_addresses()
  names = [_named(info.replica_name(r), addresses)
           for r, flag in enumerate(flags) if not flag]
  more = f" and {len(names) - most} more" if len(names) > most else ""
  return ", ".join(names[:most]) + more


class _WorkerWatch:
  """Whether any worker of the cluster answers, probed every few seconds.

  A sparse cluster (Kubeflow's dynamic workers) does not tell a PS where the
  workers are; there the PS cannot tell and waits for their done signals.
  """

  def __init__(self, info, timeout_secs, probe_every_secs, clock,
               note_every_secs: Optional[float] = None):
    self._info = info
    self._who = f"ps {info.task_index}"
    self._workers = {} if info.sparse else info.replica_addresses()
    self._flags = [0] * info.num_workers
    self._timeout = timeout_secs
    self._probe_every = probe_every_secs
    # Often enough to be seen before a short bound runs out.
    self._note_every = note_every_secs or min(60.0, max(10.0, timeout_secs / 4))
    self._last_answer = clock()
    self._last_probe = None
    self._answering = True
    self._next_note = self._last_answer + self._note_every

  def note_done(self, flags: list) -> None:
    """Leaves the replicas whose done flag is set out of the names it gives.

    They are still probed: a replica stopped and started again trains on with
    its flag set, so its answer still means the job is alive.
    """
    self._flags = flags

  def any_answering(self, now) -> bool:
    if not self._workers:
      return True
    if self._last_probe is None or now - self._last_probe >= self._probe_every:
      self._last_probe = now
      self._answering = any(waits.reachable(a, timeout_secs=0.5)
                            for a in self._workers.values())
      if self._answering:
        self._last_answer = now
        self._next_note = now + self._note_every
      elif now >= self._next_note and not self.gave_up(now):
        # Past the bound (a PS paused that long), the give-up line says it.
        errors.say(f"{self._who}: no worker has answered for "
                   f"{self.silent_secs(now):.0f} s ({self.describe()}); "
                   f"giving up after {self._timeout:.0f} s")
        self._next_note = now + self._note_every
    return self._answering

  def gave_up(self, now) -> bool:
    return bool(self._workers) and self.silent_secs(now) >= self._timeout

  def silent_secs(self, now) -> float:
    """Seconds since a worker last answered."""
    return now - self._last_answer

  def describe(self) -> str:
    """The workers not yet done, with their addresses."""
    return not_done_names(self._info, self._flags)
