"""A multi-process test's tasks, watched: a timeline of their logs and bounded waits on them.

Shared by the tests that start one process per task and then inject a fault
(tests/faulty_cluster.py, tests/test_hosts_netns.py). A subclass starts the processes into
`procs`, says how to read a task's log lines (`lines`) and how to report a failure (`report`);
this class keeps the timeline (log lines as they appear, steady progress folded away so stalls
stand out, exits) and waits with bounds, failing with the report.
"""

import re
import time
from typing import Callable, Dict, List

import testutil

# A worker's progress line; group "step" is the global step.
PROGRESS = re.compile(r"^(?:chief|worker \d+): step (?P<step>\d+)/\d+")
# Once one task has failed, how long the others get to end before the test gives up on them.
AFTER_FAILURE_SECS = 45
POLL_SECS = 0.2


class TaskWatch:
  """Call __init__ first, then fill `procs` ({name: testutil.Process}) in the subclass."""

  def __init__(self, test):
    self.test = test
    self.t0 = time.monotonic()
    self.events: List[str] = []
    self.procs: Dict[str, testutil.Process] = {}
    self.exit_secs: Dict[str, float] = {}
    self._lines_seen: Dict[str, int] = {}
    self._last_progress: Dict[str, float] = {}

  def lines(self, name: str) -> List[str]:
    raise NotImplementedError

  def report(self, headline: str) -> str:
    raise NotImplementedError

  def secs(self) -> float:
    return time.monotonic() - self.t0

  def note(self, text: str) -> None:
    self.events.append(f"{self.secs():6.1f} s  {text}")

  def timeline(self) -> str:
    return "\n".join(["timeline (s since start):"] + [f"  {e}" for e in self.events])

  def fail(self, headline: str) -> None:
    self.test.fail(self.report(headline))

  def poll(self) -> None:
    """Adds new log lines and exits to the timeline.

    Progress lines only when they are a task's first or come after a gap of more than 2 s, so
    stalls show and steady training does not flood it.
    """
    for name, proc in self.procs.items():
      lines = self.lines(name)
      now = self.secs()
      for line in lines[self._lines_seen.get(name, 0):]:
        if PROGRESS.match(line):
          last = self._last_progress.get(name)
          self._last_progress[name] = now
          if last is not None and now - last <= 2.0:
            continue
          gap = "" if last is None else f"   [{now - last:.1f} s after the previous one]"
          self.note(f"{name}: {line}{gap}")
        else:
          self.note(f"{name}: {line}")
      self._lines_seen[name] = len(lines)
      if proc.returncode is not None and name not in self.exit_secs:
        self.exit_secs[name] = now
        self.note(f"{name} exited with status {proc.returncode}")

  def assert_finished(self, log_dir: str, train_steps: int, sync: bool, ps: str) -> tuple:
    """result.json of a finished 2-worker, 1-PS run; returns (result, report for messages)."""
    result = testutil.read_result_json(log_dir)
    summary = self.report(f"result.json: {result}")
    test = self.test
    if sync:
      test.assertEqual(result["global_step"], train_steps, summary)
    else:
      test.assertGreaterEqual(result["global_step"], train_steps, summary)
    test.assertEqual(result["sync_replicas"], sync, summary)
    test.assertEqual((result["num_workers"], result["num_ps"]), (2, 1), summary)
    test.assertIn("every worker is done; exiting", self.procs[ps].read_log(), summary)
    return result, summary

  def wait_until(self, ready: Callable[[], bool], what: str, timeout: float) -> None:
    """Polls until ready(); fails with the report if it takes timeout or a task ends first."""
    deadline = time.monotonic() + timeout
    while True:
      self.poll()
      if ready():
        return
      ended = [n for n, p in self.procs.items() if p.returncode is not None]
      if ended:
        self.fail(f"{', '.join(ended)} ended while the test waited for {what}")
      if time.monotonic() >= deadline:
        self.fail(f"no {what} within {timeout:.0f} s")
      time.sleep(POLL_SECS)

  def wait_all(self, timeout: float) -> None:
    """Waits for every task to end; fails unless every one exits 0.

    Once one fails, the others get AFTER_FAILURE_SECS more, to show whether they end or hang.
    """
    deadline = time.monotonic() + timeout
    while True:
      self.poll()
      codes = {n: p.returncode for n, p in self.procs.items()}
      if all(c is not None for c in codes.values()):
        break
      if any(c not in (None, 0) for c in codes.values()):
        deadline = min(deadline, time.monotonic() + AFTER_FAILURE_SECS)
      if time.monotonic() >= deadline:
        self.fail(f"tasks still running {timeout:.0f} s after the wait began "
                  "(killed at the end of the test)")
      time.sleep(POLL_SECS)
    failed = {n: c for n, c in codes.items() if c != 0}
    if failed:
      self.fail(f"tasks failed: {failed}")
