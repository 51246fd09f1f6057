"""The stall watch and TF's repeat hang (repeats.py): a step stuck while every peer answers
starts its task again before the step bound, async alone and sync once the replicas agree (or
the others train on without it, or the run has ended). The rules themselves are in
test_hung_step.py; here a fake clock, a fake hang vote and a recording stop drive the hook.
"""

import contextlib
import io
import math
import os
import time
from unittest import mock

from absl.testing import absltest

from ps_trainer.faults import hung_step
from ps_trainer.faults import stall_watch
from ps_trainer.faults import stops
import stall_testlib
import stop_fakes
import testutil


class FakeVote:
  """A hang vote (hang_vote.HangVote) whose verdicts and leave() results are given, one per
  call (then None and True), and reads of the global step beside it that return
  `global_steps` (then None); it records its calls but the reads, and counts the reads (one
  at each look past the bound, and at a long step's first note)."""

  def __init__(self, verdicts, leaves=(), global_steps=()):
    self._verdicts = list(verdicts)
    self._leaves = list(leaves)
    self._global_steps = list(global_steps)
    self.calls = []
    self.reads = 0
    self.on_verdict = lambda: None

  def verdict(self, may_decide, may_begin=True):
    self.on_verdict()
    self.calls.append(("verdict may decide" if may_decide else "verdict")
                      + ("" if may_begin else ", joining only"))
    return self._verdicts.pop(0) if self._verdicts else None

  def leave(self):
    self.calls.append("leave")
    return self._leaves.pop(0) if self._leaves else True

  def global_step(self):
    self.reads += 1
    return self._global_steps.pop(0) if self._global_steps else None

  def sync_replica(self, last_step=None, is_chief=False):
    return hung_step.SyncReplica(self, self.global_step, last_step, is_chief)


def stuck_after(steps, stop, clock, silent_from, **watch_args):
  """A watch (600 s bound, a note every 10 s) over steps that take `steps` s each, then one that
  never returns (TF's repeat hang), begun: (the hook, when that step began). A peer does not
  answer from `silent_from` s into that step on."""
  began = [math.inf]
  hook = stall_watch.StallWatchHook(stop, lambda: "the PS tasks", timeout_secs=600,
                                    note_every_secs=10, restart_if=lambda: True,
                                    silent_when_named=lambda: clock.now - began[0] >= silent_from,
                                    clock=clock, **watch_args)
  hook.after_create_session(None, None)
  for took in steps:
    clock.now += 1.0
    hook.before_run(None)
    clock.now += took
    hook.after_run(None, None)
  clock.now += 1.0
  hook.before_run(None)
  began[0] = clock.now
  return hook, began[0]


class HangWatchTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.enterContext(mock.patch.dict(os.environ))
    os.environ.pop(stops.RESTARTS_ENV, None)

  def async_hang(self, steps_before: int, silent_from: float = math.inf,
                hang_restarts: bool = True, longest_step_secs: float = 0.001,
                wait_secs: float = 0.5) -> stop_fakes.RestartingStop:
    """`steps_before` steps that return (the last taking `longest_step_secs`), then one that
    never does, watched (600 s bound) until its clock reads 130 s, and `wait_secs` more; a
    peer does not answer from `silent_from` s into it on."""
    stop, clock = stop_fakes.RestartingStop("worker 1"), testutil.ManualClock()
    steps = [0.001] * steps_before
    if steps:
      steps[-1] = longest_step_secs
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      hook, started = stuck_after(steps, stop, clock, silent_from, poll_secs=0.02,
                                  hang_restarts=hang_restarts)
      for waited in range(10, 140, 10):  # The watch names it every 10 s on the way.
        clock.now = started + waited
        time.sleep(0.1)
      stall_testlib.wait_for(lambda: stop.restarts or stop.forced, secs=wait_secs)
      hook.finished()
    self.assertEqual(stop.forced, [])
    stop.notes = output.getvalue().splitlines()
    return stop

  def test_an_async_step_hung_while_every_peer_answers_restarts_before_the_bound(self):
    stop = self.async_hang(steps_before=hung_step.STEPS_BEFORE_HANG_BOUND, wait_secs=10)
    (reason,) = stop.restarts
    # Its notes say when it may start again, not only when it would give up.
    self.assertRegex(stop.notes[0], r"^worker 1: this step has waited \d+ s for the PS tasks; "
                     r"giving up after 600 s \(starting again sooner, from 120 s, if it stays "
                     r"stuck while every peer answers\)$")
    self.assertRegex(reason, r"^a step waited 1[23]\d s \(past 120 s: 100 x the longest of "
                     r"this session's steps, at least 120 s\) while every peer answers$")

  def test_a_hang_is_waited_out_first_steps_a_silent_peer_slow_steps_or_no_early_bound(self):
    enough = hung_step.STEPS_BEFORE_HANG_BOUND + 1
    for name, kwargs in {"first steps": dict(steps_before=enough - 2),
                         "a peer silent": dict(steps_before=enough, silent_from=10),
                         "a peer silent at the look": dict(steps_before=enough, silent_from=120),
                         "slow steps": dict(steps_before=enough, longest_step_secs=1.5),
                         "no early bound": dict(steps_before=enough, hang_restarts=False)
                         }.items():
      stop = self.async_hang(**kwargs)
      self.assertEqual(stop.restarts, [], name)
      # Their notes promise no restart before 600 s; a longest step of 1.5 s puts the bound
      # at 150 s, past the clock here.
      if name in ("first steps", "a peer silent", "no early bound"):
        self.assertTrue(all(note.endswith("giving up after 600 s") for note in stop.notes),
                        (name, stop.notes))
      elif name == "slow steps":
        self.assertIn("(starting again sooner, from 150 s, if it stays stuck while every peer "
                      "answers)", stop.notes[-1])

  def sync_hang(self, verdicts, silent_from=math.inf, leaves=(), global_steps=(),
                steps=(0.001,) * hung_step.STEPS_BEFORE_HANG_BOUND, looks=(130, 140),
                step_ends_in_verdict=False, last_step=None, who="worker 1", exits=None,
                restarts_made=0):
    """A sync replica's steps taking `steps` s, then one that never returns, with a hang vote
    whose verdicts are `verdicts`, whose leave() returns `leaves` (then True) and whose reads
    of the global step return `global_steps` (then None), of a run whose last step is
    `last_step`; the clock reads each of `looks` s into the stuck step in turn, moving on once
    the watch has read the global step there (a look past the bound, or the step's first note)
    or ended the task, and a peer does not answer from `silent_from` s on: (its restarts, the calls
    to its vote). It exits 0 with a reason `exits` matches, or not at all; it has made
    `restarts_made` restarts in a row before."""
    self.enterContext(mock.patch.dict(os.environ, {stops.RESTARTS_ENV: str(restarts_made)}))
    stop, clock = stop_fakes.RestartingStop(who), testutil.ManualClock()
    vote = FakeVote(verdicts, leaves, global_steps)
    with contextlib.redirect_stdout(io.StringIO()):
      hook, started = stuck_after(steps, stop, clock, silent_from, poll_secs=0.01,
                                  sync_replica=vote.sync_replica(last_step, who == "chief"))
      if step_ends_in_verdict:
        vote.on_verdict = lambda: hook.after_run(None, None)
      for waited in looks:
        reads_before = vote.reads
        clock.now = started + waited
        stall_testlib.wait_for(lambda: vote.reads > reads_before or stop.restarts or stop.forced, secs=2)
      stall_testlib.wait_for(lambda: stop.restarts or stop.forced, secs=0.3)
      hook.finished()
    if exits is None:
      self.assertEqual(stop.forced, [])
    else:
      ((reason, status),) = stop.forced
      self.assertRegex(reason, exits)
      self.assertEqual(status, 0)
    return stop.restarts, vote.calls

  def test_a_sync_step_hung_restarts_before_the_bound_once_every_replica_agrees(self):
    restarts, calls = self.sync_hang([None, "so were the steps of all 2 replicas"])
    (reason,) = restarts
    self.assertRegex(reason, r"^a step waited 140 s \(past 120 s: 100 x 99% of this session's "
                     r"recent steps, at least 120 s; so were the steps of all 2 replicas\) while "
                     r"every peer answers$")
    # Its flag cleared as its session starts, then a verdict at each look.
    self.assertEqual(calls, ["leave", "verdict may decide", "verdict may decide"])

  def test_a_sync_step_waits_on_while_the_replicas_do_not_agree_or_a_peer_is_silent(self):
    restarts, calls = self.sync_hang([None, None], global_steps=[500, 500])
    self.assertEqual(restarts, [])
    self.assertEqual(calls, ["leave", "verdict may decide", "verdict may decide"])
    restarts, calls = self.sync_hang(["would restart"], silent_from=10, looks=(130,))
    self.assertEqual((restarts, calls), ([], ["leave"]))  # Never even voted.

  def test_a_sync_step_stuck_while_the_global_step_moves_on_restarts_alone(self):
    # Backup workers: the others train on without it, so no vote can agree. The look that sees
    # the move only marks it (a healthy step may be ending); the next one decides.
    restarts, calls = self.sync_hang([None, None], global_steps=[500, 531, 560],
                                     looks=(130, 140, 150))
    (reason,) = restarts
    self.assertRegex(reason, r"^a step waited 150 s \(past 120 s: 100 x 99% of this session's "
                     r"recent steps, at least 120 s; the global step moved on from 500 to 560 "
                     r"meanwhile: the other replicas train without it\) while every peer "
                     r"answers$")
    self.assertEqual(calls, ["leave", "verdict may decide", "verdict may decide"])
    # A backup worker gone for good is silent, and the others train on without it too.
    restarts, calls = self.sync_hang([], silent_from=10, global_steps=[500, 531, 560],
                                     looks=(130, 140, 150))
    (reason,) = restarts
    self.assertRegex(reason, r"; the global step moved on from 500 to 560 meanwhile: the other "
                     r"replicas train without it\)$")
    self.assertEqual(calls, ["leave"])

  def test_a_sync_step_notes_the_global_step_ten_seconds_in(self):
    # It hung before the others did: by its first look past the bound the global step had
    # stopped (at 560), but it had moved on since the step's first note (500).
    restarts, calls = self.sync_hang([None, None], global_steps=[500, 560, 560],
                                     looks=(11, 130, 140))
    (reason,) = restarts
    self.assertRegex(reason, r"^a step waited 140 s \(.*; the global step moved on from 500 to "
                     r"560 meanwhile: the other replicas train without it\) while every peer "
                     r"answers$")
    self.assertEqual(calls, ["leave", "verdict may decide"])

  def test_a_sync_step_stuck_as_the_run_reached_its_last_step_ends_the_task(self):
    # The others finished the run: a worker leaves (saying it is done), the chief starts again,
    # which ends the run as every finished run ends.
    ended = (r"^a step waited 130 s \(past 120 s: .*; the run reached its last step meanwhile "
             r"\(global step 4000 of 4000\)\)")
    restarts, calls = self.sync_hang([], global_steps=[4000], last_step=4000, looks=(130,),
                                     silent_from=10, exits=ended + ": nothing is left to train$")
    self.assertEqual((restarts, calls), ([], ["leave"]))
    # So does a worker that has no restart left.
    self.sync_hang([], global_steps=[4000], last_step=4000, looks=(130,),
                   exits=ended + ": nothing is left to train$", restarts_made=stops.MAX_RESTARTS)
    restarts, calls = self.sync_hang([], global_steps=[4000], last_step=4000, looks=(130,),
                                     silent_from=10, who="chief")
    (reason,) = restarts
    self.assertRegex(reason, ended + "$")
    # One step short of the end is not the end.
    restarts, calls = self.sync_hang([None, None], global_steps=[3999, 3999], last_step=4000)
    self.assertEqual(restarts, [])

  def test_a_rightful_wait_as_its_longest_step_leaves_a_sync_replica_its_bound(self):
    # A chief's save, a peer starting again or a hang another replica restarted for.
    steps = (0.001,) * 30 + (150.0,) + (0.001,) * 30
    restarts, calls = self.sync_hang([None, "so were the steps of all 2 replicas"], steps=steps)
    self.assertLen(restarts, 1)

  def test_a_sync_replica_follows_an_agreement_though_a_peer_went_silent(self):
    # The peers that restart for the agreement do not answer a moment.
    restarts, calls = self.sync_hang([None, "another replica found every replica's step stuck "
                                      "as long"], silent_from=135)
    (reason,) = restarts
    self.assertRegex(reason, r"^a step waited 140 s \(past 120 s: .*; another replica found "
                     r"every replica's step stuck as long\)$")
    self.assertEqual(calls, ["leave", "verdict may decide", "verdict"])

  def test_a_sync_replica_in_its_first_steps_only_joins_a_vote_begun(self):
    # Started again in the middle of a hang of another replica, say: its first step is stuck too.
    restarts, calls = self.sync_hang(["so were the steps of all 2 replicas"], steps=(0.001,),
                                     looks=(130,))
    (reason,) = restarts
    self.assertRegex(reason, r"^a step waited 130 s \(past 120 s, in one of this session's first "
                     r"steps; so were the steps of all 2 replicas\) while every peer answers$")
    self.assertEqual(calls, ["leave", "verdict may decide, joining only"])

  def test_a_sync_replica_whose_step_ends_while_it_votes_stays(self):
    restarts, calls = self.sync_hang(["so were the steps of all 2 replicas"], looks=(130,),
                                     step_ends_in_verdict=True)
    self.assertEqual(restarts, [])
    self.assertEqual(calls[:2], ["leave", "verdict may decide"])

  def test_a_sync_replica_clears_its_flag_until_that_works(self):
    # At its session's start the PS was not there yet; then its step ends after it voted.
    vote, clock = FakeVote([], leaves=[False]), testutil.ManualClock()
    hook = stall_watch.StallWatchHook(stop_fakes.RestartingStop("worker 1"), lambda: "the PS tasks",
                                      timeout_secs=600, poll_secs=0.01, restart_if=lambda: True,
                                      sync_replica=vote.sync_replica(), clock=clock)
    with contextlib.redirect_stdout(io.StringIO()):
      hook.after_create_session(None, None)
      stall_testlib.wait_for(lambda: vote.calls == ["leave"])
      clock.now += hung_step.LEAVE_RETRY_SECS
      stall_testlib.wait_for(lambda: vote.calls == ["leave", "leave"])
      for _ in range(hung_step.STEPS_BEFORE_HANG_BOUND):
        stall_testlib.whole_step(hook)
      hook.before_run(None)
      clock.now += 130
      stall_testlib.wait_for(lambda: len(vote.calls) == 3)
      hook.after_run(None, None)  # The step ends after all: a slow peer.
      stall_testlib.wait_for(lambda: len(vote.calls) == 4)
      hook.finished()
    self.assertEqual(vote.calls, ["leave", "leave", "verdict may decide", "leave"])



if __name__ == "__main__":
  absltest.main()
