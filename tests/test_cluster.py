"""Tests for ps_trainer.settings.cluster: host flags and TF_CONFIG -> ClusterInfo.

Pure Python and graph-free. Only ClusterSpecTest imports TensorFlow (through
ClusterInfo.cluster_spec), once for the whole file. The one-line errors for bad
hosts and TF_CONFIG are in test_cluster_errors.py.

TF_CONFIG strings (tf_config_testlib.py) are copied from what Kubeflow's TFJob
operator writes (lower-case task types, "environment": "cloud", and its
"sparseCluster" form), plus the Estimator-era "chief"/"master" variants.
"""

from absl.testing import absltest

from ps_trainer.settings import cluster
from tf_config_testlib import (KF_CHIEF, KF_CHIEF_WORKER_0, KF_PS_0, KF_WORKER_0, KF_WORKER_1,
                               SPARSE_PS_1, SPARSE_WORKER_1, tf_config)


class FromFlagsTest(absltest.TestCase):

  def test_worker_of_one_ps_two_workers(self):
    info = cluster.from_flags("ps0:2222", "w0:2222,w1:2222", "worker", 1)
    self.assertEqual(info.jobs, {"ps": {0: "ps0:2222"},
                                 "worker": {0: "w0:2222", 1: "w1:2222"}})
    self.assertEqual((info.job_name, info.task_index), ("worker", 1))
    self.assertEqual((info.num_workers, info.num_ps), (2, 1))
    self.assertFalse(info.is_chief)
    self.assertTrue(info.is_worker)
    self.assertFalse(info.is_ps)
    self.assertFalse(info.has_chief_job)
    self.assertEqual(info.replica_index, 1)
    self.assertEqual(info.task_device, "/job:worker/task:1")
    self.assertEqual(info.replica_name(0), "worker 0")
    self.assertEqual(info.address, "w1:2222")
    self.assertEqual(info.device_filters(), ["/job:ps", "/job:worker/task:1"])

  def test_worker_0_is_the_chief(self):
    info = cluster.from_flags("ps0:2222", "w0:2222,w1:2222", "worker", 0)
    self.assertTrue(info.is_chief)
    self.assertEqual(info.replica_index, 0)
    self.assertEqual(info.device_filters(), ["/job:ps", "/job:worker/task:0"])

  def test_ps_sees_only_itself(self):
    info = cluster.from_flags("ps0:2222,ps1:2222", "w0:2222,w1:2222", "ps", 1)
    self.assertTrue(info.is_ps)
    self.assertFalse(info.is_chief)
    self.assertFalse(info.is_worker)
    self.assertEqual(info.num_ps, 2)
    self.assertEqual(info.address, "ps1:2222")
    self.assertEqual(info.task_device, "/job:ps/task:1")
    self.assertEqual(info.device_filters(), ["/job:ps/task:1"])
    with self.assertRaisesRegex(ValueError, "not a training replica"):
      _ = info.replica_index

  def test_spaces_around_hosts_and_ipv6(self):
    info = cluster.from_flags(" [::1]:2222 ", "10.0.0.2:2222 , host_3.example:2223",
                              "worker", 1)
    self.assertEqual(info.jobs["ps"], {0: "[::1]:2222"})
    self.assertEqual(info.jobs["worker"],
                     {0: "10.0.0.2:2222", 1: "host_3.example:2223"})

  def test_one_machine_by_two_names_on_two_ports(self):
    info = cluster.from_flags("localhost:2222", "127.0.0.1:2223,[::1]:2224", "worker", 1)
    self.assertEqual(info.jobs["worker"], {0: "127.0.0.1:2223", 1: "[::1]:2224"})

  def test_info_is_frozen(self):
    info = cluster.from_flags("ps0:2222", "w0:2222", "worker", 0)
    with self.assertRaises(AttributeError):
      info.task_index = 1  # pytype: disable=not-writable


class ParseTfConfigTest(absltest.TestCase):

  def test_kubeflow_worker_1(self):
    info = cluster.parse_tf_config(KF_WORKER_1)
    self.assertEqual(info.jobs, {
        "ps": {0: "mnist-ps-0.kubeflow.svc:2222"},
        "worker": {0: "mnist-worker-0.kubeflow.svc:2222",
                   1: "mnist-worker-1.kubeflow.svc:2222"}})
    self.assertEqual((info.job_name, info.task_index), ("worker", 1))
    self.assertEqual((info.num_workers, info.num_ps), (2, 1))
    self.assertFalse(info.is_chief)
    self.assertEqual(info.replica_index, 1)
    self.assertEqual(info.address, "mnist-worker-1.kubeflow.svc:2222")
    self.assertEqual(info.device_filters(), ["/job:ps", "/job:worker/task:1"])
    self.assertFalse(info.sparse)

  def test_kubeflow_worker_0_is_the_chief(self):
    info = cluster.parse_tf_config(KF_WORKER_0)
    self.assertTrue(info.is_chief)
    self.assertEqual(info.replica_index, 0)
    self.assertEqual(info.replica_name(0), "worker 0")

  def test_kubeflow_ps(self):
    info = cluster.parse_tf_config(KF_PS_0)
    self.assertTrue(info.is_ps)
    self.assertEqual(info.device_filters(), ["/job:ps/task:0"])
    self.assertEqual((info.num_workers, info.num_ps), (2, 1))

  def test_chief_job_is_replica_0_and_the_chief(self):
    info = cluster.parse_tf_config(KF_CHIEF)
    self.assertEqual((info.job_name, info.task_index), ("chief", 0))
    self.assertTrue(info.has_chief_job)
    self.assertTrue(info.is_chief)
    self.assertTrue(info.is_worker)
    self.assertEqual(info.replica_index, 0)
    self.assertEqual(info.num_workers, 2)  # chief + 1 worker
    self.assertEqual(info.task_device, "/job:chief/task:0")
    self.assertEqual(info.replica_name(0), "chief")
    self.assertEqual(info.device_filters(), ["/job:ps", "/job:chief/task:0"])

  def test_replica_name_is_the_inverse_of_replica_index(self):
    # What a PS calls the replicas it still waits for must be the task that reads that shard.
    for spec in ({"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"]},
                 {"worker": ["w0:1", "w1:1", "w2:1"], "ps": ["p:1"]}):
      tasks = [(job, i) for job in ("chief", "worker") for i in range(len(spec.get(job, [])))]
      for job, index in tasks:
        info = cluster.parse_tf_config(tf_config(spec, job, index))
        self.assertEqual(info.replica_name(info.replica_index),
                         "chief" if job == "chief" else f"worker {index}", (spec, job, index))

  def test_worker_0_follows_the_chief_job(self):
    info = cluster.parse_tf_config(KF_CHIEF_WORKER_0)
    self.assertFalse(info.is_chief)
    self.assertEqual(info.replica_index, 1)
    self.assertEqual(info.task_device, "/job:worker/task:0")
    self.assertEqual(info.replica_name(0), "chief")

  def test_master_is_an_alias_of_chief(self):
    info = cluster.parse_tf_config(
        '{"cluster":{"master":["m0:2222"],"ps":["ps0:2222"],'
        '"worker":["w0:2222"]},"task":{"type":"master","index":0},'
        '"environment":"cloud"}')
    self.assertEqual(info.job_name, "chief")
    self.assertEqual(info.jobs["chief"], {0: "m0:2222"})
    self.assertNotIn("master", info.jobs)
    self.assertTrue(info.is_chief)
    self.assertEqual(info.task_device, "/job:chief/task:0")

  def test_evaluator_is_outside_the_training_cluster(self):
    info = cluster.parse_tf_config(
        '{"cluster":{"chief":["c0:2222"],"ps":["ps0:2222"],"worker":["w0:2222"],'
        '"evaluator":["e0:2222"]},"task":{"type":"evaluator","index":0},'
        '"environment":"cloud"}')
    self.assertEqual(info.job_name, "evaluator")
    self.assertNotIn("evaluator", info.jobs)
    self.assertEqual(set(info.jobs), {"chief", "ps", "worker"})
    self.assertFalse(info.is_chief)
    self.assertFalse(info.is_worker)
    self.assertFalse(info.is_ps)
    self.assertEqual(info.num_workers, 2)

  def test_evaluator_job_dropped_for_training_tasks(self):
    info = cluster.parse_tf_config(
        '{"cluster":{"ps":["ps0:2222"],"worker":["w0:2222"],'
        '"evaluator":["e0:2222"]},"task":{"type":"worker","index":0}}')
    self.assertEqual(set(info.jobs), {"ps", "worker"})
    self.assertEqual(info.num_workers, 1)

  def test_missing_task_index_means_0(self):
    info = cluster.parse_tf_config(
        '{"cluster":{"ps":["ps0:2222"],"worker":["w0:2222"]},'
        '"task":{"type":"worker"}}')
    self.assertEqual(info.task_index, 0)

  def test_sparse_worker_view(self):
    info = cluster.parse_tf_config(SPARSE_WORKER_1, num_workers=3)
    self.assertEqual(info.jobs, {"worker": {1: "w1:2222"},
                                 "ps": {0: "ps0:2222", 1: "ps1:2222"}})
    self.assertEqual((info.num_workers, info.num_ps), (3, 2))
    self.assertFalse(info.is_chief)
    self.assertEqual(info.replica_index, 1)
    self.assertEqual(info.address, "w1:2222")
    self.assertEqual(info.device_filters(), ["/job:ps", "/job:worker/task:1"])
    self.assertTrue(info.sparse)

  def test_sparse_ps_view_puts_its_address_at_its_index(self):
    info = cluster.parse_tf_config(SPARSE_PS_1, num_workers=2)
    self.assertEqual(info.jobs["ps"], {1: "ps-1:2222"})
    self.assertEqual(info.address, "ps-1:2222")
    self.assertEqual((info.job_name, info.task_index), ("ps", 1))
    self.assertEqual(info.num_workers, 2)
    self.assertEqual(info.device_filters(), ["/job:ps/task:1"])


class ResolveTest(absltest.TestCase):

  def test_nothing_given_is_local_mode(self):
    self.assertIsNone(cluster.resolve("", "", "", None, ""))

  def test_blank_tf_config_is_local_mode(self):
    self.assertIsNone(cluster.resolve("", "", "", None, "  \n"))

  def test_flags_alone(self):
    info = cluster.resolve("ps0:2222", "w0:2222,w1:2222", "worker", 1, "")
    self.assertEqual(info, cluster.from_flags("ps0:2222", "w0:2222,w1:2222",
                                              "worker", 1))

  def test_flags_with_matching_num_workers(self):
    info = cluster.resolve("ps0:2222", "w0:2222,w1:2222", "ps", 0, "",
                           num_workers=2)
    self.assertEqual(info.num_workers, 2)

  def test_tf_config_alone(self):
    self.assertEqual(cluster.resolve("", "", "", None, KF_WORKER_1),
                     cluster.parse_tf_config(KF_WORKER_1))

  def test_flags_that_repeat_tf_config_are_accepted(self):
    info = cluster.resolve(
        "mnist-ps-0.kubeflow.svc:2222",
        "mnist-worker-0.kubeflow.svc:2222,mnist-worker-1.kubeflow.svc:2222",
        "worker", 1, KF_WORKER_1, num_workers=2)
    self.assertEqual(info, cluster.parse_tf_config(KF_WORKER_1))

  def test_chief_job_name_repeats_master(self):
    info = cluster.resolve(
        "", "", "chief", 0,
        '{"cluster":{"master":["m0:2222"],"ps":["ps0:2222"]},'
        '"task":{"type":"master","index":0}}')
    self.assertTrue(info.is_chief)


class ClusterSpecTest(absltest.TestCase):
  """Round trips through tf.train.ClusterSpec (the one place TF is imported)."""

  def test_from_flags(self):
    info = cluster.from_flags("ps0:2222", "w0:2222,w1:2222", "worker", 1)
    self.assertEqual(info.cluster_spec().as_dict(),
                     {"ps": ["ps0:2222"], "worker": ["w0:2222", "w1:2222"]})

  def test_chief_job_without_evaluator(self):
    info = cluster.parse_tf_config(
        '{"cluster":{"chief":["c0:2222"],"ps":["ps0:2222"],"worker":["w0:2222"],'
        '"evaluator":["e0:2222"]},"task":{"type":"worker","index":0}}')
    self.assertEqual(info.cluster_spec().as_dict(),
                     {"chief": ["c0:2222"], "ps": ["ps0:2222"],
                      "worker": ["w0:2222"]})

  def test_sparse_worker_view(self):
    info = cluster.parse_tf_config(SPARSE_WORKER_1, num_workers=3)
    spec = info.cluster_spec()
    self.assertEqual(spec.as_dict(), {"worker": {1: "w1:2222"},
                                      "ps": ["ps0:2222", "ps1:2222"]})
    self.assertEqual(spec.task_address("worker", 1), "w1:2222")

  def test_sparse_ps_view(self):
    spec = cluster.parse_tf_config(SPARSE_PS_1, num_workers=2).cluster_spec()
    self.assertEqual(spec.task_address("ps", 1), "ps-1:2222")
    self.assertEqual(spec.task_indices("ps"), [1])


if __name__ == "__main__":
  absltest.main()
