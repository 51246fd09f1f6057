"""A cluster of real TF gRPC servers inside the test process, for graph-mode unit tests.

tf.test.create_local_cluster needs the missing `portpicker`, and picking free ports then binding
them later is a race: another process (a parallel test, a TIME_WAIT reuse) can take a port in
between. So every test that wants servers in-process comes here, where a taken port means three
fresh tries, and servers start the way the trainer's own tasks start them (server.start_server,
with each task's session config). Kept apart from testutil so tests without TensorFlow stay
TF-free.

TF servers cannot be stopped: they live until the process exits, so a test that needs a clean PS
(no variables, tokens or queues left by the test before) makes a cluster of its own.
"""

from typing import List

from ps_trainer import testing
from ps_trainer.settings import cluster


class InProcessCluster:
  """num_ps PS tasks and num_workers workers on 127.0.0.1, each a server in this process.

  `ps_hosts` and `worker_hosts` are the flag values a trainer task would get; `info(job, i)` is
  that task's ClusterInfo, `targets[i]` worker i's session target. Each PS starts the way run_ps
  starts it (its done flags zeroed), so the trainer's end-of-run protocol works against it. The
  servers are ps_trainer.testing.local_cluster's, which users' tests start the same way.
  """

  def __init__(self, num_ps: int, num_workers: int):
    # The servers outlive the block: TF cannot stop them.
    with testing.local_cluster(num_ps, num_workers) as started:
      self._cluster = started
    self.ps_hosts = started.ps_hosts
    self.worker_hosts = started.worker_hosts
    self.ps_targets: List[str] = list(started.ps_targets)
    self.targets: List[str] = list(started.worker_targets)

  def info(self, job_name: str, task_index: int) -> cluster.ClusterInfo:
    return self._cluster.info(job_name, task_index)

  def host_flags(self) -> List[str]:
    """--ps_hosts and --worker_hosts, for testutil.make_config."""
    return [f"--ps_hosts={self.ps_hosts}", f"--worker_hosts={self.worker_hosts}"]
