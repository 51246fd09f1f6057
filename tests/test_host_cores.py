"""Tasks sharing a host: threads per task, and each task on its own cores."""

import json
import os
import signal
import sys
import threading
import time
from unittest import mock

from absl.testing import absltest

from ps_trainer.cluster import host_cores
from ps_trainer.cluster import server as server_lib
from ps_trainer.settings import cluster as cluster_lib
from tests import testutil


def info(ps, workers, job="worker", index=0):
  return cluster_lib.resolve(",".join(ps), ",".join(workers), job, index, "",
                             None)


class DescribeTest(absltest.TestCase):

  def test_names_cores_as_a_person_would(self):
    self.assertEqual(host_cores.describe([0]), "core 0")
    self.assertEqual(host_cores.describe([2, 3, 4]), "cores 2-4")
    self.assertEqual(host_cores.describe([1, 5]), "cores 1,5")


class ThreadsPerTaskTest(absltest.TestCase):

  def test_tasks_sharing_a_host_split_its_cores(self):
    one_each = info(["127.0.0.1:1"], ["127.0.0.1:2"])
    self.assertEqual(host_cores.threads_per_task(one_each, cpus=2), 1)
    three = info(["127.0.0.1:1"], ["127.0.0.1:2", "127.0.0.1:3"])
    self.assertEqual(host_cores.threads_per_task(three, cpus=16), 5)
    self.assertEqual(host_cores.threads_per_task(three, cpus=2), 1)

  def test_one_machines_names_for_itself_are_one_host(self):
    # As the duplicate-port check counts them: localhost and 127.0.0.1 are one machine.
    mixed = info(["localhost:1"], ["127.0.0.1:2", "LOCALHOST:3"])
    self.assertEqual(host_cores.threads_per_task(mixed, cpus=6), 2)
    self.assertLen(host_cores.tasks_on_host(mixed), 3)

  def test_a_task_alone_on_its_host_keeps_tf_defaults(self):
    alone = info(["h1:2222"], ["h2:2222", "h3:2222"], "ps", 0)
    self.assertEqual(host_cores.threads_per_task(alone, cpus=2), 0)
    self.assertEqual(
        server_lib.session_config(alone).intra_op_parallelism_threads, 0)


class CoresForTaskTest(absltest.TestCase):

  def all_cores(self, ps, workers, allowed):
    """{(job, index): cores} for every task of the cluster."""
    out = {}
    for job, hosts in (("ps", ps), ("worker", workers)):
      for index in range(len(hosts)):
        out[(job, index)] = host_cores.cores_for_task(
            info(ps, workers, job, index), allowed)
    return out

  def test_one_ps_and_one_worker_get_a_core_each(self):
    got = self.all_cores(["localhost:1"], ["localhost:2"], [0, 1])
    self.assertEqual(got, {("ps", 0): [0], ("worker", 0): [1]})

  def test_shares_are_equal_disjoint_and_cover_the_allowed_cores(self):
    allowed = [2, 3, 5, 7, 8, 9]  # A container's or taskset's mask.
    got = self.all_cores(["h:1", "h:2"], ["h:3"], allowed)
    cores = [c for share in got.values() for c in share]
    self.assertCountEqual(cores, allowed)
    self.assertEqual({len(share) for share in got.values()}, {2})

  def test_more_tasks_than_cores_leaves_them_to_the_os(self):
    got = self.all_cores(["h:1"], ["h:2", "h:3", "h:4"], [0, 1])
    self.assertEqual(set(got.values()), {None})

  def test_a_sparse_cluster_leaves_its_tasks_to_the_os(self):
    # Each worker sees only itself and the PS: both would take the core after the PS's.
    for index in (0, 1):
      worker = cluster_lib.parse_tf_config(json.dumps({
          "sparseCluster": {"worker": {str(index): f"127.0.0.1:{2 + index}"},
                            "ps": ["127.0.0.1:1"]},
          "task": {"type": "worker", "index": index}}), num_workers=2)
      self.assertIsNone(host_cores.cores_for_task(worker, [0, 1]))

  def test_tasks_on_other_hosts_do_not_count(self):
    got = self.all_cores(["ps0:1", "ps1:1"], ["w0:1", "w0:2"], [0, 1])
    self.assertIsNone(got[("ps", 0)])
    self.assertIsNone(got[("ps", 1)])
    self.assertEqual(got[("worker", 0)], [0])
    self.assertEqual(got[("worker", 1)], [1])


class PinTaskTest(absltest.TestCase):

  def test_an_evaluator_is_never_pinned(self):
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    evaluator = info(["localhost:1"], ["localhost:2"], "evaluator", 0)
    self.assertIsNone(host_cores.pin_task(evaluator))
    self.assertEqual(host_cores.pinned_note(), "")
    if before is not None:
      self.assertEqual(os.sched_getaffinity(0), before)


@absltest.skipIf(not hasattr(os, "sched_setaffinity") or
                 len(os.sched_getaffinity(0)) < 2, "needs 2 cores and Linux")
class ReleaseThreadsTest(absltest.TestCase):
  """release_threads on threads of this process, named as TF would name them."""

  def start_thread(self, name):
    """A thread that waits until the test ends, named `name` and kept on the
    first core, as a pinned task's thread would be. Returns its id."""
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    self.addCleanup(thread.join)
    self.addCleanup(done.set)
    with open(f"/proc/self/task/{thread.native_id}/comm", "w") as comm:
      comm.write(name)
    os.sched_setaffinity(thread.native_id, self.own)
    return thread.native_id

  def setUp(self):
    super().setUp()
    self.host = set(os.sched_getaffinity(0))
    self.own = {min(self.host)}

  def pinned(self):
    """As if pin_task had given this process the first core."""
    return mock.patch.multiple(host_cores, _pinned=tuple(self.own),
                               _host_share=tuple(sorted(self.host)))

  def test_a_pinned_task_frees_the_named_threads_at_the_lowest_priority(self):
    named = self.start_thread("tf_released")
    other = self.start_thread("tf_kept")
    with self.pinned():
      self.assertEqual(host_cores.release_threads("tf_released"), [named])
    self.assertEqual(os.sched_getaffinity(named), self.host)
    self.assertEqual(os.getpriority(os.PRIO_PROCESS, named),
                     host_cores.RELEASED_NICE)
    self.assertEqual(os.sched_getaffinity(other), self.own)
    self.assertEqual(os.getpriority(os.PRIO_PROCESS, other), 0)

  def test_an_unpinned_task_changes_nothing(self):
    named = self.start_thread("tf_released")
    self.assertEqual(host_cores.release_threads("tf_released"), [])
    self.assertEqual(os.sched_getaffinity(named), self.own)
    self.assertEqual(os.getpriority(os.PRIO_PROCESS, named), 0)


def _allowed_cores_of_every_thread(pid: int) -> set:
  lists = set()
  for thread in os.listdir(f"/proc/{pid}/task"):
    try:
      with open(f"/proc/{pid}/task/{thread}/status") as status:
        for line in status:
          if line.startswith("Cpus_allowed_list:"):
            lists.add(line.split(":", 1)[1].strip())
    except FileNotFoundError:
      pass  # The thread ended after the listing (seen in CI): nothing to check.
  return lists


@absltest.skipIf(not hasattr(os, "sched_setaffinity") or
                 len(os.sched_getaffinity(0)) < 2, "needs 2 cores and Linux")
class PinnedTaskTest(absltest.TestCase):
  """A real PS task of a 1 PS + 1 worker cluster on this host."""

  def start_ps(self, *extra):
    ps, worker = testutil.pick_free_ports(2)
    process = testutil.start(
        [sys.executable, "-m", "ps_trainer", "--job_name=ps", "--task_index=0",
         f"--ps_hosts=localhost:{ps}", f"--worker_hosts=localhost:{worker}",
         *extra], os.path.join(testutil.make_tempdir(self), "ps.log"),
        name="ps 0")
    self.addCleanup(process.kill_group)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
      self.log_text = process.read_log()
      if "serving on" in self.log_text:
        return process
      self.assertIsNone(process.returncode,
                        f"the PS exited early\n{process.log_tail()}")
      time.sleep(0.2)
    self.fail(f"the PS did not start serving within 60 s\n{process.log_tail()}")

  def stop(self, process):
    process.signal_group(signal.SIGTERM)
    process.wait(timeout=30)

  def test_every_thread_of_the_ps_runs_on_its_own_core(self):
    process = self.start_ps()
    threads = _allowed_cores_of_every_thread(process.pid)
    first = str(sorted(os.sched_getaffinity(0))[0])
    # TF's gRPC and op threads included: all on the PS's share, the first
    # of the allowed cores ("ps" sorts before "worker").
    self.assertEqual(threads, {first})
    self.assertIn(f"worker(s) to finish; on core {first} of a host shared",
                  self.log_text)
    self.stop(process)

  def test_nopin_cpus_leaves_the_task_on_every_core(self):
    process = self.start_ps("--nopin_cpus")
    threads = _allowed_cores_of_every_thread(process.pid)
    self.assertEqual(len(threads), 1)
    self.assertNotEqual(threads, {str(sorted(os.sched_getaffinity(0))[0])})
    self.assertNotIn("of a host shared", self.log_text)
    self.stop(process)


if __name__ == "__main__":
  absltest.main()
