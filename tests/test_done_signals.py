"""A replica that leaves tells every PS it is done; one that cannot reach a PS leaves at once.

One worker's server in this process; its cluster names a PS that was never started.
"""

import threading

from absl.testing import absltest
import tensorflow as tf

from ps_trainer import cluster
from ps_trainer import server as server_lib
import testutil

tf.compat.v1.disable_eager_execution()


class DoneSignalsTest(absltest.TestCase):

  def test_a_worker_whose_ps_never_came_leaves_at_once(self):
    ps_port, worker_port = testutil.pick_free_ports(2)
    info = cluster.from_flags(f"127.0.0.1:{ps_port}", f"127.0.0.1:{worker_port}", "worker", 0)
    target = server_lib.start_server(info).target
    graph = tf.Graph()
    with graph.as_default():
      signals = server_lib.DoneSignals(info)
    # Before, creating the session waited for the PS without bound (a worker stopped while it
    # waited for its PS stayed until its 20 s grace ran out); a thread keeps this test bounded.
    leaving = threading.Thread(
        target=server_lib.signal_done, args=(target, info, signals, graph),
        kwargs={"timeout_secs": 5}, daemon=True)
    with self.assertLogs(level="WARNING") as logs:
      leaving.start()
      leaving.join(timeout=10)
    self.assertFalse(leaving.is_alive(), "signal_done still waits for the PS after 10 s")
    self.assertIn(f"not answering: ps 0 at 127.0.0.1:{ps_port}", "\n".join(logs.output))


if __name__ == "__main__":
  absltest.main()
