"""When a step that every peer answers for counts as hung (the stall watch's rules).

A step can hang inside TF while every peer answers: when TF turns the step's
part on this task away as a repeat (repeats.py) and its cancel of the other
parts is lost, they wait forever for tensors of the part that never ran
(about 1 repeat in 40 on this machine). No Python code can end that step,
but the task can start again (stall_watch.py), sooner than after
--wait_timeout_secs once these rules say the step is hung:

- An async step that has taken HANG_STEP_FACTOR times the session's longest
  step so far, and at least HANG_FLOOR_SECS (past the minute TF can take to
  fail a step whose PS was started again), if every peer answers then and
  none was found silent earlier in the step.
- A sync step also waits, rightly, for the other replicas, the chief's
  checkpoint saves included, which can take longer than that, and one hung
  replica stalls the others. Past the same bound (counted from the 99th
  percentile of the recent steps, RECENT_STEPS), with every peer answering,
  it counts as hung once every replica's step is (hang_vote.py).
- With backup workers (--replicas_to_aggregate below the workers) the others
  train on without a hung replica, so no vote completes. But every global
  step gives each replica a token that ends its step once its gradient is in
  (sync_replicas.py), and a hung step's gradient never goes in: so a sync
  step past the bound, answering or not, counts as hung once the global step
  has moved on since the step's first note (10 s in; else its first look
  past the bound) and the step is still running a look later (a healthy step
  ends a moment after the move that frees it: the later look is for a step
  that ends as a look reads). Noted that early, a replica that hung a while
  before every other one did still sees the global step move past it.
  Without backup workers a hung replica's missing gradient holds the global
  step still, and the vote decides.
- A sync step past the bound once the global step has reached the run's
  last step hangs in a run the others have finished: a worker other than the
  chief leaves it (exit 0, even with no restart left), the chief starts again.

Not in a session's first STEPS_BEFORE_HANG_BOUND steps, which can be slow
(nor do they count toward the bound): there a sync replica only follows a
vote another began, or leaves a run that is over.
"""

import collections
import time
from typing import Callable, NamedTuple, Optional, Protocol

HANG_STEP_FACTOR = 100
HANG_FLOOR_SECS = 120.0
STEPS_BEFORE_HANG_BOUND = 10
# A sync step's length includes rightful waits (a checkpoint save, a peer
# starting again, a hang another replica restarted for), and one such wait
# as the longest step would put the bound out of reach for the session: a
# sync replica's bound counts from the 99th percentile of its recent steps.
RECENT_STEPS = 1000
# How often a replica tries again to clear its hang-vote flag.
LEAVE_RETRY_SECS = 5.0


class Hung(NamedTuple):
  """A step that counts as hung: why, whether every peer answers, and
  whether the task leaves (a worker in a run that is over) or starts again."""
  why: str
  answering: bool
  leaves: bool = False


class Vote(Protocol):
  """What the rules ask of a replica's hang_vote.HangVote (tests fake it)."""

  def verdict(self, may_decide: bool, may_begin: bool = True) -> Optional[str]:
    """Why this replica starts again (every replica is stuck), or None."""

  def leave(self) -> bool:
    """Clears this replica's flag; whether it is clear now."""


class SyncReplica(NamedTuple):
  """What a sync replica's rules ask of the cluster.

  vote: its hang_vote.HangVote.
  global_step: () -> the global step now, read on its PS; None: that failed
    (ps_runs.global_step_reader).
  last_step: the run's last global step (--train_steps); None: none.
  is_chief: whether this replica is the chief.
  """
  vote: Vote
  global_step: Callable[[], Optional[int]]
  last_step: Optional[int]
  is_chief: bool


class HangRules:
  """One task's rules, fed its session's steps; asked from the watch's thread.

  Args:
    timeout_secs: --wait_timeout_secs, the bound on every step.
    hang_restarts: whether an async step may count as hung before
      `timeout_secs`.
    sync: a SyncReplica (sync replicas), or None.
    clock: the stall watch's monotonic clock.
  """

  def __init__(self, timeout_secs: float, hang_restarts: bool = False,
               sync: Optional[SyncReplica] = None,
               clock: Callable[[], float] = time.monotonic):
    self._timeout = timeout_secs
    self._hang_restarts = hang_restarts
    self._sync = sync
    self._clock = clock
    self._steps = 0
    self._longest_step = 0.0
    self._recent_steps = collections.deque(maxlen=RECENT_STEPS)
    self._voted_in = None  # The step whose hang vote this replica is in.
    # (the step, the global step at its first note or look past its bound).
    self._global_step_seen = None
    self._moved_in = None  # The step in whose look the global step moved.
    self._noted_in = None  # The step whose first note read the global step.
    # Whether its flag may be set still, and when to try clearing it next.
    self._leave_owed, self._next_leave = False, 0.0

  @property
  def looks_when_silent(self) -> bool:
    """Whether a step with a silent peer can still count as hung (sync)."""
    return self._sync is not None

  def session_starting(self) -> None:
    self._steps, self._longest_step = 0, 0.0
    self._recent_steps.clear()

  def session_created(self) -> None:
    if self._sync is not None:
      # Its flag may be set still, if it was stopped or restarted mid-vote.
      # The watch's thread clears it: every call into the vote is made there.
      self._leave_owed, self._next_leave = True, 0.0

  def step_ended(self, took: float) -> None:
    self._steps += 1
    if self._steps > STEPS_BEFORE_HANG_BOUND:
      self._longest_step = max(self._longest_step, took)
      self._recent_steps.append(took)

  def step_noted(self, started: float) -> None:
    """At a note on the step begun at `started` (every 10 s of it): at the
    first, a sync replica past its session's first steps notes where the
    global step is, for _by_the_global_step to compare later looks with. One
    read a step: if it fails (its warning said why), the first look past the
    bound notes it instead."""
    if (self._sync is None or self._steps < STEPS_BEFORE_HANG_BOUND
        or self._noted_in == started or self._seen_in(started)):
      return
    self._noted_in = started
    now = self._sync.global_step()
    if now is not None:
      self._global_step_seen = (started, now)

  def _seen_in(self, started: float) -> bool:
    seen = self._global_step_seen
    return seen is not None and seen[0] == started

  def leave_if_owed(self, started: Optional[float]) -> None:
    """Clears this replica's hang-vote flag once the step it voted in
    (`started` is the step now, if any) has ended, or a session started,
    and tries again every LEAVE_RETRY_SECS until that works."""
    if self._sync is None:
      return
    if self._voted_in is not None and started != self._voted_in:
      self._voted_in = None  # That step ended.
      self._leave_owed, self._next_leave = True, 0.0
    now = self._clock()
    if not self._leave_owed or now < self._next_leave:
      return
    self._next_leave = now + LEAVE_RETRY_SECS
    if self._sync.vote.leave():
      self._leave_owed = False

  def bound(self) -> float:
    """How long a step may wait, while every peer answers, before it is
    taken for TF's repeat hang (HANG_STEP_FACTOR)."""
    first_steps = self._steps < STEPS_BEFORE_HANG_BOUND
    if self._sync is not None:
      if first_steps:  # It may only join a vote another replica began.
        return min(self._timeout, HANG_FLOOR_SECS)
      recent = sorted(self._recent_steps)
      step = recent[int(0.99 * (len(recent) - 1))] if recent else 0.0
    elif first_steps or not self._hang_restarts:
      return self._timeout
    else:
      step = self._longest_step
    return min(self._timeout, max(HANG_FLOOR_SECS, HANG_STEP_FACTOR * step))

  def why_hung(self, started: float, bound: float, silent: bool,
               still_in: Callable[[float], bool],
               may_restart: bool = True) -> Optional[Hung]:
    """At a look past `bound`: a Hung for a step that counts as hung, or
    None. `still_in(started)` says whether the task is still in that step;
    without `may_restart` (no restart left) only leaving counts."""
    informed = self._steps >= STEPS_BEFORE_HANG_BOUND
    sync = self._sync
    steps = ("the longest of this session's steps" if sync is None else
             "99% of this session's recent steps")
    why = (f"past {bound:.0f} s: {HANG_STEP_FACTOR} x {steps}, at least "
           f"{HANG_FLOOR_SECS:.0f} s" if informed else
           f"past {bound:.0f} s, in one of this session's first steps")
    if sync is None:
      return None if silent or not may_restart else Hung(why, True)
    by_step = self._by_the_global_step(started, informed)
    if by_step and still_in(started):  # Not a step that ended as it read.
      moved, run_over = by_step
      leaves = run_over and not sync.is_chief
      if may_restart or leaves:
        return Hung(f"{why}; {moved}", not silent, leaves)
    if not may_restart:
      return None
    if self._voted_in != started and silent:
      return None  # As in async mode: a peer was silent, so not a hang.
    self._voted_in = started
    self._leave_owed = False  # Its flag is this step's now.
    agreed = sync.vote.verdict(may_decide=not silent, may_begin=informed)
    if agreed is None or not still_in(started):
      return None  # Or the step ended while it voted.
    return Hung(f"{why}; {agreed}", not silent)

  def _by_the_global_step(self, started: float, informed: bool):
    """(why, whether the run is over) when the global step shows a sync
    step hung though no vote can agree, else None: it reached the last step,
    or (past the first steps) it moved on since the step's first note
    (step_noted) or first look past the bound, and this is a later look
    still."""
    last_step = self._sync.last_step
    now = self._sync.global_step()
    if now is None:
      return None
    if last_step is not None and now >= last_step:
      return (f"the run reached its last step meanwhile (global step {now} of "
              f"{last_step})"), True
    if not informed:
      return None
    if not self._seen_in(started):
      self._global_step_seen = (started, now)
      return None
    seen = self._global_step_seen[1]
    if now <= seen:
      return None
    if self._moved_in != started:
      # A healthy step ends a moment after the move that frees it, maybe
      # while this look read: the next look tells.
      self._moved_in = started
      return None
    return (f"the global step moved on from {seen} to {now} meanwhile: "
            "the other replicas train without it"), False
