"""When a sync step that every peer answers for counts as hung: hung_step.HangRules, thread-free.

A fake sync replica gives the global step each look reads; the stall watch's own tests
(test_hang_watch.py) run the same rules on its thread.
"""

from absl.testing import absltest

from ps_trainer.faults import hung_step

BOUND = 120.0


class _Vote:
  """A hang vote that never agrees, counting its verdicts."""

  def __init__(self):
    self.verdicts = 0

  def verdict(self, may_decide, may_begin=True):
    self.verdicts += 1
    return None

  def leave(self):
    return True


def _sync(steps, last_step=None, is_chief=False, vote=None):
  """A sync replica whose reads of the global step return `steps`, then fail."""
  steps = list(steps)
  return hung_step.SyncReplica(vote or _Vote(), lambda: steps.pop(0) if steps else None,
                               last_step, is_chief)


def _rules(sync, steps_done=hung_step.STEPS_BEFORE_HANG_BOUND):
  rules = hung_step.HangRules(600.0, sync=sync)
  for _ in range(steps_done):
    rules.step_ended(0.001)
  return rules


def _looks(rules, started, count, still_in=lambda step: True, silent=False, may_restart=True):
  """What each of `count` looks at the step begun at `started` decides."""
  return [rules.why_hung(started, BOUND, silent, still_in, may_restart) for _ in range(count)]


class GlobalStepTest(absltest.TestCase):

  def test_a_step_stuck_a_look_after_the_global_step_moved_counts_as_hung(self):
    first, moved, confirmed = _looks(_rules(_sync([500, 531, 560])), started=1.0, count=3)
    # The first look notes where the global step is; a healthy step may end a moment after the
    # move that frees it, so the look that sees the move only marks it.
    self.assertIsNone(first)
    self.assertIsNone(moved)
    self.assertEqual(confirmed, hung_step.Hung(
        "past 120 s: 100 x 99% of this session's recent steps, at least 120 s; the global step "
        "moved on from 500 to 560 meanwhile: the other replicas train without it", True))

  def test_a_silent_peer_does_not_keep_a_step_the_others_train_past(self):
    # A backup worker gone for good.
    *_, last = _looks(_rules(_sync([500, 531, 560])), started=1.0, count=3, silent=True)
    self.assertFalse(last.answering)
    self.assertFalse(last.leaves)

  def test_a_step_that_ends_as_its_look_reads_is_not_hung(self):
    rules = _rules(_sync([500, 531, 560]))
    _looks(rules, started=1.0, count=2)
    self.assertEqual(_looks(rules, started=1.0, count=1, still_in=lambda step: False), [None])

  def test_only_reads_within_one_step_are_compared(self):
    rules = _rules(_sync([500, 531, 560, 600]))
    _looks(rules, started=1.0, count=1)  # That step ended; the next one is stuck.
    self.assertEqual(_looks(rules, started=5.0, count=2), [None, None])  # Notes 531, marks 560.
    self.assertIsNotNone(_looks(rules, started=5.0, count=1)[0])

  def test_a_step_noted_before_the_global_step_stopped_sees_it_moved(self):
    # It hung first; the global step moved on until every other replica hung too, so from its
    # first look past the bound on the global step stays where it stopped.
    rules = _rules(_sync([500, 560, 560]))
    rules.step_noted(1.0)  # 10 s in.
    rules.step_noted(1.0)  # 20 s in: read once a step.
    marked, confirmed = _looks(rules, started=1.0, count=2)
    self.assertIsNone(marked)
    self.assertRegex(confirmed.why, r"; the global step moved on from 500 to 560 meanwhile")

  def test_each_step_is_noted_afresh_and_a_failed_note_leaves_it_to_the_first_look(self):
    rules = _rules(_sync([500, 560, 600, 600]))
    rules.step_noted(1.0)  # That step ended; the next one is stuck.
    rules.step_noted(5.0)
    self.assertEqual(_looks(rules, started=5.0, count=2)[1].why.split("; ")[-1],
                     "the global step moved on from 560 to 600 meanwhile: the other replicas "
                     "train without it")
    rules = _rules(_sync([None, 500, 560, 560]))
    rules.step_noted(1.0)  # Failed: not read again at the next note.
    rules.step_noted(1.0)
    self.assertEqual(_looks(rules, started=1.0, count=3)[2].why.split("; ")[-1],
                     "the global step moved on from 500 to 560 meanwhile: the other replicas "
                     "train without it")

  def test_no_note_reads_in_a_sessions_first_steps_nor_in_async_mode(self):
    reads = []
    sync = hung_step.SyncReplica(_Vote(), lambda: reads.append(1) or 500, None, False)
    _rules(sync, steps_done=1).step_noted(1.0)
    hung_step.HangRules(600.0).step_noted(1.0)
    self.assertEqual(reads, [])
    _rules(sync).step_noted(1.0)
    self.assertEqual(reads, [1])

  def test_a_global_step_that_stays_or_goes_back_leaves_it_to_the_vote(self):
    vote = _Vote()
    sync = _sync([500, 500, 400, 450], vote=vote)  # A PS restored from an older checkpoint.
    self.assertEqual(_looks(_rules(sync), started=1.0, count=4), [None] * 4)
    self.assertEqual(vote.verdicts, 4)

  def test_in_a_sessions_first_steps_the_global_step_moving_is_not_enough(self):
    looks = _looks(_rules(_sync([500, 531, 560, 600]), steps_done=1), started=1.0, count=4)
    self.assertEqual(looks, [None] * 4)

  def test_a_worker_stuck_once_the_run_reached_its_last_step_leaves_even_without_restarts(self):
    for steps_done in (1, hung_step.STEPS_BEFORE_HANG_BOUND):
      (hung,) = _looks(_rules(_sync([4000], last_step=4000), steps_done), started=1.0, count=1,
                       may_restart=False)
      self.assertTrue(hung.leaves, steps_done)
      self.assertRegex(hung.why, r"; the run reached its last step meanwhile \(global step 4000 "
                       r"of 4000\)$")

  def test_a_chief_stuck_at_the_last_step_starts_again_if_it_may(self):
    (hung,) = _looks(_rules(_sync([4000], last_step=4000, is_chief=True)), started=1.0, count=1)
    self.assertFalse(hung.leaves)
    self.assertEqual(_looks(_rules(_sync([4000], last_step=4000, is_chief=True)), started=1.0,
                            count=1, may_restart=False), [None])
    self.assertEqual(_looks(_rules(_sync([3999], last_step=4000)), started=1.0, count=1), [None])


class AsyncTest(absltest.TestCase):

  def test_an_async_step_past_its_bound_counts_only_with_every_peer_answering_and_a_restart(self):
    rules = hung_step.HangRules(600.0, hang_restarts=True)
    for _ in range(hung_step.STEPS_BEFORE_HANG_BOUND + 1):
      rules.step_ended(0.002)
    self.assertEqual(rules.bound(), 120.0)
    self.assertEqual(_looks(rules, 1.0, 1), [hung_step.Hung(
        "past 120 s: 100 x the longest of this session's steps, at least 120 s", True)])
    self.assertEqual(_looks(rules, 1.0, 1, silent=True), [None])
    self.assertEqual(_looks(rules, 1.0, 1, may_restart=False), [None])


if __name__ == "__main__":
  absltest.main()
