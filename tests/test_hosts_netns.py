"""A cluster on real hosts: every task in its own network namespace, on its own address.

The README's per-host set-up, for real: ps0, worker0 and worker1 are network namespaces on one
private switch (tests/netns.py), each task listens on port 2222 of its own address and reaches the
others over veth links through a bridge, as separate machines would. Needs root (skipped
otherwise); nothing is added to the machine's own namespace, and every namespace goes at the end.

- an async job across the three hosts trains to the end, and every task exits 0;
- worker1's link down for LINK_DOWN_SECS in the middle of a run (its interface set down, as a
  pulled cable or a switch port going away): worker1 must train again once its link is back. A
  sync job must then finish with every task exiting 0; an async one, whose chief trains on alone
  at a speed no fixed step count can bound, is stopped with SIGTERM to each worker: both exit 143,
  the chief with a final checkpoint, and the PS exits 0.

Every wait is bounded; a failure names each task's status and exit time, a timeline of what the
tasks printed (stalls show as gaps), and the tail of each task's log.
"""

import os
import signal
import time
from typing import List, Optional, Sequence

from absl.testing import absltest

import netns
import testutil
import watch

PORT = 2222
# (host, job, task index); host i has address .(i+1) of the subnet.
TASKS = (("ps0", "ps", 0), ("worker0", "worker", 0), ("worker1", "worker", 1))
LINK_DOWN_SECS = 10  # the "cut off the network for ~10 s"
# TensorFlow start-up of three processes on 2 cores, up to the first progress line.
START_TIMEOUT_SECS = 120
# From the start (or from the link's return) to the end of every task.
FINISH_TIMEOUT_SECS = 150
# Once a task has failed, how long the others get to end before the test gives up on them.
# TF's benign warning at each step's clean-up: noise in timelines and tails.
NOISE = "local_rendezvous.cc"


class Cluster(watch.TaskWatch):
  """The tasks of one job, each started in its host's namespace, watched with a timeline."""

  def __init__(self, test: absltest.TestCase, net: netns.Network, log_dir: str,
               flags: List[str]):
    super().__init__(test)
    self.net, self.log_dir = net, log_dir
    ps = f"{net.address('ps0')}:{PORT}"
    workers = ",".join(f"{net.address(h)}:{PORT}" for h, job, _ in TASKS if job == "worker")
    common = [testutil.PYTHON, "-m", "ps_trainer", f"--ps_hosts={ps}",
              f"--worker_hosts={workers}", f"--log_dir={log_dir}", *flags]
    for host, job, index in TASKS:
      argv = net.exec_args(host, common + [f"--job_name={job}", f"--task_index={index}"])
      proc = testutil.start(argv, os.path.join(log_dir, "logs", f"{host}.log"),
                            name=f"{job} {index} ({host})")
      test.addCleanup(proc.kill_group)
      self.procs[host] = proc
    self.note(f"started {', '.join(self.procs)} with {' '.join(flags)}")

  def lines(self, host: str) -> List[str]:
    """host's log without TF's clean-up noise."""
    return [l for l in self.procs[host].read_log().splitlines() if NOISE not in l]

  def last_step(self, host: str) -> Optional[int]:
    """The global step of host's last progress line, or None."""
    steps = [int(m.group("step")) for m in map(watch.PROGRESS.match, self.lines(host)) if m]
    return steps[-1] if steps else None

  def report(self, headline: str, tail_lines: int = 25) -> str:
    """headline, each task's state, the timeline, and the tail of each log."""
    self.poll()
    out = [headline, "tasks:"]
    for host, proc in self.procs.items():
      rc = proc.returncode
      state = (f"exited {rc} at {self.exit_secs.get(host, self.secs()):.1f} s" if rc is not None
               else f"STILL RUNNING at {self.secs():.1f} s")
      out.append(f"  {host} ({proc.name}): {state}")
    out.append(f"network:\n{self.net.describe()}")
    out.append(self.timeline())
    for host in self.procs if tail_lines > 0 else ():
      lines = self.lines(host)[-tail_lines:]
      out.append(f"--- last {len(lines)} lines of {host}'s log (without {NOISE} noise) ---")
      out += [f"  {l}" for l in lines]
    return "\n".join(out)

class HostsNetnsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    reason = netns.unavailable_reason()
    if reason:
      self.skipTest(reason)
    self.net = netns.Network([host for host, _, _ in TASKS])
    # Registered first, so it runs last: after the tasks in the namespaces were killed.
    self.addCleanup(self.net.destroy)
    self.net.create()
    self.log_dir = testutil.make_tempdir(self)

  def start(self, *flags: str) -> Cluster:
    return Cluster(self, self.net, self.log_dir, list(flags))

  def check_result(self, cluster: Cluster, train_steps: int, sync: bool) -> dict:
    result, summary = cluster.assert_finished(self.log_dir, train_steps, sync, ps="ps0")
    self.assertGreater(result["accuracy"], 0.9, summary)
    testutil.assert_no_leftover(marker=self.log_dir)
    # Shown by `pytest -rP` and in Bazel's test.log: how long each phase took.
    print(f"{self.id()}: global step {result['global_step']}, test accuracy "
          f"{result['accuracy']:.4f}\n{cluster.timeline()}")
    return result

  def test_async_job_across_three_hosts(self):
    cluster = self.start("--train_steps=400", "--log_every_steps=20")
    cluster.wait_all(START_TIMEOUT_SECS + FINISH_TIMEOUT_SECS)
    self.check_result(cluster, 400, sync=False)
    # Worker 1 trained too; on a loaded machine it may join when the chief is half way.
    self.assertRegex(cluster.procs["worker1"].read_log(),
                     r"worker 1: (step \d+/400|starting at global step \d+ of 400)")

  def cut_worker1_link_mid_run(self, train_steps: int, cut_at_step: int,
                               flags: Sequence[str] = ()) -> tuple:
    """Starts the job; once worker1 has logged global step cut_at_step (past the start-up, in
    steady training), takes its link down for LINK_DOWN_SECS and brings it back.

    Returns (cluster, the highest global step either worker had logged when the link came back).
    """
    # Progress lines every 20 steps (~0.2 s): the timeline then shows when training stalls and
    # when it resumes to within a fraction of a second.
    cluster = self.start(f"--train_steps={train_steps}", "--log_every_steps=20", *flags)
    cluster.wait_until(lambda: (cluster.last_step("worker1") or 0) >= cut_at_step,
                       f"progress line of worker1 at global step {cut_at_step} or later",
                       START_TIMEOUT_SECS)
    cluster.note(f"worker1 link DOWN (last logged global steps: chief "
                 f"{cluster.last_step('worker0')}, worker1 {cluster.last_step('worker1')})")
    self.net.link_down("worker1")
    try:
      cut_end = time.monotonic() + LINK_DOWN_SECS
      while time.monotonic() < cut_end:
        cluster.poll()
        time.sleep(watch.POLL_SECS)
    finally:
      self.net.link_up("worker1")
    cluster.note("worker1 link UP again")
    if "done:" in cluster.procs["worker0"].read_log():
      cluster.fail(f"the chief finished before worker1's link came back: raise --train_steps "
                   f"above {train_steps} so the test covers a return mid-run")
    step_at_return = max(cluster.last_step("worker1") or 0, cluster.last_step("worker0") or 0)
    return cluster, step_at_return

  def test_async_job_survives_a_worker_link_down_mid_run(self):
    # The chief trains on alone while worker1 is cut off, and TCP's retransmission back-off keeps
    # worker1 away for up to ~20 s after a 10 s cut. At this machine's 150-800 steps/s no fixed
    # --train_steps both outlasts that and ends in reasonable time (10,000 once ended 3 s after
    # the link came back, before worker1 logged a step), so the run is long and the test stops it
    # once worker1 has trained again, as a user would: SIGTERM to each worker.
    cluster, step_at_return = self.cut_worker1_link_mid_run(1_000_000, cut_at_step=500)
    cluster.wait_until(lambda: (cluster.last_step("worker1") or 0) > step_at_return,
                       f"progress line of worker1 past global step {step_at_return} after its "
                       "link came back", FINISH_TIMEOUT_SECS)
    cluster.note("SIGTERM to worker0 and worker1")
    for host in ("worker0", "worker1"):
      cluster.procs[host].signal_group(signal.SIGTERM)
    deadline = time.monotonic() + FINISH_TIMEOUT_SECS
    while (any(p.returncode is None for p in cluster.procs.values())
           and time.monotonic() < deadline):
      cluster.poll()
      time.sleep(watch.POLL_SECS)
    codes = {host: proc.returncode for host, proc in cluster.procs.items()}
    summary = cluster.report(f"exit statuses after the stop: {codes}")
    # Both workers stopped on the signal and told the PS they were done, so the PS ends cleanly.
    self.assertEqual(codes, {"ps0": 0, "worker0": 143, "worker1": 143}, summary)
    self.assertRegex(cluster.procs["worker0"].read_log(),
                     r"chief: stopped on SIGTERM; final checkpoint \S*model\.ckpt-\d+", summary)
    # A stopped run is not a finished one: the same command would continue it.
    self.assertFalse(os.path.exists(os.path.join(self.log_dir, "result.json")), summary)
    self.assertIn("every worker is done; exiting", cluster.procs["ps0"].read_log(), summary)
    testutil.assert_no_leftover(marker=self.log_dir)

  def test_sync_job_survives_a_worker_link_down_mid_run(self):
    # Every step needs worker1's gradient, so the global step stands still while it is cut off
    # and the run can end at a fixed step, whatever the machine's speed.
    cluster, step_at_return = self.cut_worker1_link_mid_run(
        1200, cut_at_step=300, flags=["--sync_replicas"])
    cluster.wait_all(FINISH_TIMEOUT_SECS)
    self.check_result(cluster, 1200, sync=True)
    self.assertGreater(cluster.last_step("worker1") or 0, step_at_return, cluster.report(
        f"worker1 logged no progress after its link came back (last logged global step "
        f"before: {step_at_return})"))


if __name__ == "__main__":
  absltest.main()
