"""Whole clusters started task by task, as users start them on real hosts.

Multi-process and slow (~20 s each of TensorFlow start-up on 2 cores), so
there are few, each covering several promises: per-host launch.sh, the PS that
exits by itself, sync with a backup worker, Kubeflow's sparse TF_CONFIG, and a
click model's tables split over three PS. (The TF_CONFIG the operator writes
for a chief, workers, a PS and an evaluator: test_tfjob.py.)
"""

import json
import os
import time

from absl.testing import absltest

import testutil

TIMEOUT_SECS = 300


class ClusterRunTest(absltest.TestCase):

  def start_tasks(self, log_dir, tasks):
    """Starts (name, argv, env) tasks; returns {name: Process}."""
    procs = {}
    for name, argv, env in tasks:
      proc = testutil.start(argv, os.path.join(log_dir, "logs", f"{name}.log"),
                            env=env, name=name)
      self.addCleanup(proc.kill_group)
      procs[name] = proc
    return procs

  def wait_all(self, procs):
    """Every task must exit 0 within TIMEOUT_SECS (one bound for all).

    A failure shows every task's log: the task that hangs is often not the
    one that is stuck (a PS waits for a worker that never says done).
    """
    deadline = time.monotonic() + TIMEOUT_SECS
    outcomes = {}
    for name, proc in procs.items():
      try:
        outcomes[name] = proc.wait(timeout=max(1, deadline - time.monotonic()))
      except AssertionError as e:  # Timed out; its group is killed.
        outcomes[name] = str(e).splitlines()[0]
    failed = {name: outcome for name, outcome in outcomes.items() if outcome != 0}
    self.assertEqual(failed, {}, "\n".join(
        f"{name}: {outcome}\n{procs[name].log_tail()}"
        for name, outcome in outcomes.items()))

  def test_per_host_sync_with_a_backup_worker_ends_cleanly(self):
    """1 PS + 3 workers via `launch.sh <flags>`, 2 gradients per step."""
    log_dir = testutil.make_tempdir(self)
    hosts = testutil.cluster_hosts(num_ps=1, num_workers=3)
    common = [testutil.LAUNCH_SH, f"--ps_hosts={hosts['ps_hosts']}",
              f"--worker_hosts={hosts['worker_hosts']}", f"--log_dir={log_dir}",
              "--train_steps=150", "--sync_replicas",
              "--replicas_to_aggregate=2", "--log_every_steps=50"]
    tasks = [("ps-0", common + ["--job_name=ps", "--task_index=0"], None)]
    tasks += [(f"worker-{i}", common + ["--job_name=worker", f"--task_index={i}"],
               None) for i in range(3)]
    procs = self.start_tasks(log_dir, tasks)
    self.wait_all(procs)

    result = testutil.read_result_json(log_dir)
    self.assertEqual(result["global_step"], 150)
    self.assertTrue(result["sync_replicas"])
    self.assertEqual(result["replicas_to_aggregate"], 2)
    self.assertEqual((result["num_workers"], result["num_ps"]), (3, 1))
    self.assertGreater(result["accuracy"], 0.5)
    self.assertIn("every worker is done; exiting", procs["ps-0"].read_log())
    testutil.assert_no_leftover(marker=log_dir)

  def test_kubeflow_sparse_cluster_trains_in_sync_and_exits(self):
    """enableDynamicWorker: each task sees only itself and the PS list."""
    log_dir = testutil.make_tempdir(self)
    ps, *workers = [f"127.0.0.1:{p}" for p in testutil.pick_free_ports(3)]

    def env(task_type, index, sparse_cluster):
      tf_config = {"sparseCluster": sparse_cluster,
                   "task": {"type": task_type, "index": index}}
      return testutil.trainer_env({"TF_CONFIG": json.dumps(tf_config)})

    argv = [testutil.PYTHON, "-m", "ps_trainer", "--num_workers=2",
            f"--log_dir={log_dir}", "--train_steps=150", "--sync_replicas",
            "--log_every_steps=50"]
    procs = self.start_tasks(log_dir, [
        ("ps-0", argv, env("ps", 0, {"worker": {}, "ps": [ps]})),
        ("worker-0", argv,
         env("worker", 0, {"worker": {"0": workers[0]}, "ps": [ps]})),
        ("worker-1", argv,
         env("worker", 1, {"worker": {"1": workers[1]}, "ps": [ps]}))])
    self.wait_all(procs)

    result = testutil.read_result_json(log_dir)
    self.assertEqual(result["global_step"], 150)
    self.assertEqual((result["num_workers"], result["num_ps"]), (2, 1))
    self.assertIn("\nworker 1: done: the run reached --train_steps=150\n",
                  procs["worker-1"].read_log())
    testutil.assert_no_leftover(marker=log_dir)

  def test_worker_with_other_flags_than_the_chief_says_so_and_exits(self):
    """A sync chief and an async worker would hang; the worker refuses. On
    two PS, with another model: the chief's flags must be where the worker
    looks for them whatever the model (train_graph._signature_variable)."""
    log_dir = testutil.make_tempdir(self)
    hosts = testutil.cluster_hosts(num_ps=2, num_workers=2)
    common = [testutil.PYTHON, "-m", "ps_trainer",
              f"--ps_hosts={hosts['ps_hosts']}",
              f"--worker_hosts={hosts['worker_hosts']}", f"--log_dir={log_dir}"]
    procs = self.start_tasks(log_dir, [
        ("ps-0", common + ["--job_name=ps", "--task_index=0"], None),
        ("ps-1", common + ["--job_name=ps", "--task_index=1"], None),
        ("worker-0", common + ["--job_name=worker", "--task_index=0",
                               "--sync_replicas"], None),
        ("worker-1", common + ["--job_name=worker", "--task_index=1",
                               "--hidden_units=64,128"], None)])
    worker = procs["worker-1"]
    self.assertEqual(worker.wait(timeout=TIMEOUT_SECS), 2, worker.log_tail())
    log = worker.read_log()
    self.assertIn("this worker's settings differ from the chief's", log)
    self.assertIn("hidden_units: 64,128 here but 128,64 on the chief", log)
    self.assertIn("sync_replicas: False here but True on the chief", log)
    self.assertNotIn("Traceback", log)

  def test_wide_deep_on_three_ps_learns_clicks_in_sync(self):
    """Tables in parts on 3 PS, sparse sync updates, TFRecord shards."""
    from ps_trainer.datasets import clicks  # pylint: disable=g-import-not-at-top
    log_dir = testutil.make_tempdir(self)
    data_dir = os.path.join(log_dir, "clicks")
    stats = clicks.write_click_set(data_dir, num_train=20_000, num_test=2_000,
                                   vocab=1_000, num_shards=4, seed=3)
    hosts = testutil.cluster_hosts(num_ps=3, num_workers=2)
    common = [testutil.PYTHON, "-m", "ps_trainer",
              f"--ps_hosts={hosts['ps_hosts']}",
              f"--worker_hosts={hosts['worker_hosts']}", f"--log_dir={log_dir}",
              "--model=wide_deep", "--dataset=tfrecord", f"--data_dir={data_dir}",
              "--vocab_size=1000", "--optimizer=adagrad", "--sync_replicas",
              "--train_steps=300", "--log_every_steps=100"]
    tasks = [(f"ps-{i}", common + ["--job_name=ps", f"--task_index={i}"], None)
             for i in range(3)]
    tasks += [(f"worker-{i}", common + ["--job_name=worker", f"--task_index={i}"],
               None) for i in range(2)]
    self.wait_all(self.start_tasks(log_dir, tasks))

    result = testutil.read_result_json(log_dir)
    self.assertEqual(result["global_step"], 300)
    self.assertEqual((result["num_workers"], result["num_ps"]), (2, 3))
    # Learned, not guessed: clearly above always answering the common label
    # (300 steps reach 0.753 against a majority rate of 0.644, run after run).
    self.assertGreater(result["accuracy"], stats["majority_rate"] + 0.05,
                       (result, stats))
    testutil.assert_no_leftover(marker=log_dir)


if __name__ == "__main__":
  absltest.main()
