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

import tensorflow as tf

from ps_trainer import cluster
from ps_trainer import ps_flags
from ps_trainer import server as server_lib
import testutil

_SERVERS: List[tf.distribute.Server] = []  # Referenced, so nothing tears one down early.
_PORT_ATTEMPTS = 3


class InProcessCluster:
  """num_ps PS tasks and num_workers workers on 127.0.0.1, each a server in this process.

  `ps_hosts` and `worker_hosts` are the flag values a trainer task would get; `info(job, i)` is
  that task's ClusterInfo, `targets[i]` worker i's session target. Each PS starts the way run_ps
  starts it (its done flags zeroed), so the trainer's end-of-run protocol works against it.
  """

  def __init__(self, num_ps: int, num_workers: int):
    for attempt in range(_PORT_ATTEMPTS):
      hosts = [f"127.0.0.1:{p}" for p in testutil.pick_free_ports(num_ps + num_workers)]
      self.ps_hosts = ",".join(hosts[:num_ps])
      self.worker_hosts = ",".join(hosts[num_ps:])
      try:
        # Quiet: one warning per server would bury a failing test's output.
        servers = [server_lib.start_server(self.info(job, i), warn_if_exposed=False)
                   for job, count in (("ps", num_ps), ("worker", num_workers))
                   for i in range(count)]
      except server_lib.ServerError:  # A port taken between picking and binding it.
        if attempt == _PORT_ATTEMPTS - 1:
          raise
        continue
      _SERVERS.extend(servers)
      self.ps_targets = [s.target for s in servers[:num_ps]]
      self.targets = [s.target for s in servers[num_ps:]]
      for i, target in enumerate(self.ps_targets):
        ps_flags.init_done_flags(target, self.info("ps", i))
      return

  def info(self, job_name: str, task_index: int) -> cluster.ClusterInfo:
    return cluster.from_flags(self.ps_hosts, self.worker_hosts, job_name, task_index)

  def host_flags(self) -> List[str]:
    """--ps_hosts and --worker_hosts, for testutil.make_config."""
    return [f"--ps_hosts={self.ps_hosts}", f"--worker_hosts={self.worker_hosts}"]
