"""ps_trainer.settings.cluster's errors: each bad host flag or TF_CONFIG gives one line naming the flag
or field and the reason or what is accepted (a ClusterError, a ValueError), and the bugs a
review once found stay fixed.
"""

import json

from absl.testing import absltest
from absl.testing import parameterized

from ps_trainer.settings import cluster
from tf_config_testlib import KF_WORKER_1, PS_WORKERS, SPARSE_PS_1, SPARSE_WORKER_1, tf_config


# (name, function, args, kwargs, pattern). Each pattern pins the flag or
# TF_CONFIG field AND the reason or the accepted values.
_ERRORS = (
    # --ps_hosts / --worker_hosts / --job_name / --task_index.
    ("host_without_port", cluster.from_flags,
     ("ps0", "w0:2222", "ps", 0), {},
     r"^--ps_hosts: 'ps0' is not host:port; expected e\.g\. 10\.0\.0\.1:2222"),
    ("port_0", cluster.from_flags,
     ("ps0:0", "w0:2222", "ps", 0), {},
     r"^--ps_hosts: port 0 in 'ps0:0' is out of range; accepted ports are 1-65535$"),
    ("port_70000", cluster.from_flags,
     ("ps0:2222", "w0:70000", "ps", 0), {},
     r"^--worker_hosts: port 70000 in 'w0:70000' is out of range; "
     r"accepted ports are 1-65535$"),
    ("duplicate_in_list", cluster.from_flags,
     ("ps0:2222", "w0:2222,w0:2222", "worker", 0), {},
     r"^--worker_hosts: w0:2222 appears twice; every task needs its own host:port$"),
    ("duplicate_across_ps_and_worker", cluster.from_flags,
     ("h:2222", "w0:2222,h:2222", "worker", 0), {},
     r"^--ps_hosts/--worker_hosts: h:2222 appears twice; every task needs its own"),
    ("empty_ps_hosts", cluster.from_flags,
     ("", "w0:2222", "worker", 0), {},
     r"^--ps_hosts is empty; a cluster task needs at least one PS"),
    # An empty entry is a host left out, not a smaller cluster.
    ("only_commas_ps_hosts", cluster.from_flags,
     (" , ,", "w0:2222", "worker", 0), {},
     r"^--ps_hosts=,,: entry 1 of 3 is empty; list every task's host:port, separated by "
     r"single commas$"),
    ("double_comma_in_worker_hosts", cluster.from_flags,
     ("ps0:2222", "w0:2222,,w1:2222", "worker", 0), {},
     r"^--worker_hosts=w0:2222,,w1:2222: entry 2 of 3 is empty;"),
    ("trailing_comma_in_ps_hosts", cluster.from_flags,
     ("ps0:2222,", "w0:2222", "worker", 0), {},
     r"^--ps_hosts=ps0:2222,: entry 2 of 2 is empty;"),
    # Read from a file, say: the message stays one line.
    ("trailing_comma_and_newline_in_ps_hosts", cluster.from_flags,
     ("ps0:2222,\n", "w0:2222", "worker", 0), {},
     r"^--ps_hosts=ps0:2222,: entry 2 of 2 is empty;"),
    # A TF server listens on every interface: these are one port of one machine.
    ("loopback_aliases_across_ps_and_worker", cluster.from_flags,
     ("localhost:45300", "127.0.0.1:45300", "ps", 0), {},
     r"^--ps_hosts/--worker_hosts: 127\.0\.0\.1:45300 and localhost:45300 are the same "
     r"host:port; every task needs its own host:port$"),
    ("hostnames_differing_in_case", cluster.from_flags,
     ("ps0:2222", "W0:2222,w0:2222", "worker", 0), {},
     r"^--worker_hosts: w0:2222 and W0:2222 are the same host:port;"),
    ("empty_worker_hosts", cluster.from_flags,
     ("ps0:2222", "", "ps", 0), {},
     r"^--worker_hosts is empty; a cluster task needs at least one worker"),
    ("job_name_chief_with_flags", cluster.from_flags,
     ("ps0:2222", "w0:2222", "chief", 0), {},
     r"^--job_name='chief' is not a task type of a --ps_hosts/--worker_hosts "
     r"cluster; accepted: ps, worker"),
    ("task_index_past_workers", cluster.from_flags,
     ("ps0:2222", "w0:2222,w1:2222", "worker", 2), {},
     r"^--task_index=2: worker index out of range; the cluster has 2 worker "
     r"task\(s\), so accepted indices are 0-1$"),
    ("task_index_past_ps", cluster.from_flags,
     ("ps0:2222", "w0:2222,w1:2222", "ps", 1), {},
     r"^--task_index=1: ps index out of range; .* so the accepted index is 0$"),
    ("task_index_negative", cluster.from_flags,
     ("ps0:2222", "w0:2222,w1:2222", "worker", -1), {},
     r"^--task_index=-1: worker index out of range; .* accepted indices are 0-1$"),
    # TF_CONFIG, document level.
    ("tf_config_not_json", cluster.parse_tf_config, ("{cluster: 1",), {},
     r"^TF_CONFIG is not valid JSON \(.* at line 1 column \d+\)$"),
    ("tf_config_not_an_object", cluster.parse_tf_config, ('["ps0:2222"]',), {},
     r"^TF_CONFIG must be a JSON object with \"cluster\" and \"task\" fields$"),
    ("tf_config_missing_cluster", cluster.parse_tf_config,
     ('{"task":{"type":"worker","index":0}}',), {},
     r"^TF_CONFIG field \"cluster\" is missing or empty; expected e\.g\. "),
    ("tf_config_empty_cluster", cluster.parse_tf_config,
     ('{"cluster":{},"task":{"type":"worker","index":0}}',), {},
     r"^TF_CONFIG field \"cluster\" is missing or empty"),
    ("tf_config_missing_task", cluster.parse_tf_config,
     (json.dumps({"cluster": PS_WORKERS}),), {},
     r"^TF_CONFIG field \"task\" is missing or not an object; expected e\.g\. "
     r"\{\"type\": \"worker\", \"index\": 0\}$"),
    # TF_CONFIG task.
    ("tf_config_unknown_task_type", cluster.parse_tf_config,
     (tf_config(PS_WORKERS, "boss"),), {},
     r"^TF_CONFIG field \"task\.type\" is 'boss', an unknown task type; "
     r"accepted: chief, worker, ps, evaluator$"),
    ("tf_config_task_type_missing", cluster.parse_tf_config,
     (json.dumps({"cluster": PS_WORKERS, "task": {"index": 0}}),), {},
     r"^TF_CONFIG field \"task\.type\" is None; accepted: chief, worker, ps, "
     r"evaluator$"),
    ("tf_config_index_not_integer", cluster.parse_tf_config,
     (tf_config(PS_WORKERS, "worker", "1"),), {},
     r"^TF_CONFIG field \"task\.index\" is '1'; expected a whole number >= 0$"),
    ("tf_config_index_float", cluster.parse_tf_config,
     (tf_config(PS_WORKERS, "worker", 1.5),), {},
     r"^TF_CONFIG field \"task\.index\" is 1\.5; expected a whole number >= 0$"),
    ("tf_config_index_bool", cluster.parse_tf_config,
     (tf_config(PS_WORKERS, "worker", True),), {},
     r"^TF_CONFIG field \"task\.index\" is True; expected a whole number >= 0$"),
    ("tf_config_index_outside_cluster", cluster.parse_tf_config,
     (tf_config(PS_WORKERS, "worker", 2),), {},
     r"^TF_CONFIG field \"task\" is worker 2, which the cluster does not list; "
     r"listed worker indices: \[0, 1\]$"),
    ("tf_config_index_negative", cluster.parse_tf_config,
     (tf_config(PS_WORKERS, "ps", -1),), {},
     r"^TF_CONFIG field \"task\" is ps -1, which the cluster does not list; "
     r"listed ps indices: \[0\]$"),
    ("tf_config_second_evaluator", cluster.parse_tf_config,
     (tf_config(dict(PS_WORKERS, evaluator=["e0:2222", "e1:2222"]),
                 "evaluator", 1),), {},
     r"^TF_CONFIG field \"task\" is evaluator 1: a job has one evaluator, "
     r"index 0 \(two would write the same eval\.json\)$"),
    ("tf_config_chief_task_without_chief_job", cluster.parse_tf_config,
     (tf_config(PS_WORKERS, "chief"),), {},
     r"^TF_CONFIG field \"task\" is chief 0, .* listed chief indices: none$"),
    # TF_CONFIG cluster.
    ("tf_config_unknown_job", cluster.parse_tf_config,
     (tf_config(dict(PS_WORKERS, driver=["d0:2222"])),), {},
     r"^TF_CONFIG field \"cluster\" names an unknown job 'driver'; "
     r"accepted: chief, worker, ps, evaluator, master$"),
    ("tf_config_two_chiefs", cluster.parse_tf_config,
     (tf_config(dict(PS_WORKERS, chief=["c0:2222", "c1:2222"]), "chief"),), {},
     r"^TF_CONFIG field \"cluster\.chief\" must list exactly one task; "
     r"it lists 2$"),
    ("tf_config_no_ps_job", cluster.parse_tf_config,
     (tf_config({"worker": ["w0:2222"]}),), {},
     r"^TF_CONFIG field \"cluster\" has no \"ps\" job; a parameter-server job "
     r"needs at least one PS$"),
    ("tf_config_no_replicas", cluster.parse_tf_config,
     (tf_config({"ps": ["ps0:2222"]}, "ps"),), {},
     r"^TF_CONFIG field \"cluster\" has neither \"chief\" nor \"worker\""),
    ("tf_config_host_without_port", cluster.parse_tf_config,
     (tf_config({"ps": ["ps0"], "worker": ["w0:2222"]}),), {},
     r"^TF_CONFIG field \"cluster\.ps\": 'ps0' is not host:port; expected e\.g\."),
    ("tf_config_port_out_of_range", cluster.parse_tf_config,
     (tf_config({"ps": ["ps0:2222"], "worker": ["w0:99999"]}),), {},
     r"^TF_CONFIG field \"cluster\.worker\": port 99999 in 'w0:99999' is out of "
     r"range; accepted ports are 1-65535$"),
    ("tf_config_address_not_a_string", cluster.parse_tf_config,
     (tf_config({"ps": [2222], "worker": ["w0:2222"]}),), {},
     r"^TF_CONFIG field \"cluster\.ps\": 2222 is not a \"host:port\" string$"),
    ("tf_config_job_not_a_list", cluster.parse_tf_config,
     (tf_config({"ps": ["ps0:2222"], "worker": "w0:2222"}),), {},
     r"^TF_CONFIG field \"cluster\.worker\" must be a list of \"host:port\" "
     r"strings$"),
    ("tf_config_same_address_twice", cluster.parse_tf_config,
     (tf_config({"ps": ["h:2222"], "worker": ["w0:2222", "h:2222"]}),), {},
     r"^TF_CONFIG field \"cluster\": h:2222 appears twice; every task needs its "
     r"own host:port$"),
    ("tf_config_num_workers_disagrees", cluster.parse_tf_config,
     (KF_WORKER_1,), {"num_workers": 3},
     r"^--num_workers=3 disagrees with TF_CONFIG, whose cluster has 2 training "
     r"replicas"),
    # Sparse TF_CONFIG.
    ("sparse_without_num_workers", cluster.parse_tf_config,
     (SPARSE_WORKER_1,), {},
     r"^TF_CONFIG has a \"sparseCluster\", which does not list every worker; "
     r"pass --num_workers=N"),
    ("sparse_ps_without_num_workers", cluster.parse_tf_config,
     (SPARSE_PS_1,), {},
     r"\"sparseCluster\".* pass --num_workers=N"),
    ("sparse_index_not_a_number", cluster.parse_tf_config,
     (tf_config({"ps": ["ps0:2222"], "worker": {"one": "w1:2222"}},
                 key="sparseCluster"),), {"num_workers": 2},
     r"^TF_CONFIG field \"cluster\.worker\": task index 'one' is not a whole "
     r"number >= 0$"),
    # resolve: flags against TF_CONFIG, and incomplete flags.
    ("resolve_job_name_disagrees", cluster.resolve,
     ("", "", "ps", None, KF_WORKER_1), {},
     r"^--job_name=ps disagrees with TF_CONFIG, which says task type worker; "
     r"pass one or the other, or make them agree$"),
    ("resolve_task_index_disagrees", cluster.resolve,
     ("", "", "", 0, KF_WORKER_1), {},
     r"^--task_index=0 disagrees with TF_CONFIG, which says task index 1;"),
    ("resolve_ps_hosts_disagree", cluster.resolve,
     ("ps9:2222", "", "", None, KF_WORKER_1), {},
     r"^--ps_hosts=ps9:2222 disagrees with TF_CONFIG, which says "
     r"mnist-ps-0\.kubeflow\.svc:2222;"),
    ("resolve_worker_hosts_in_other_order", cluster.resolve,
     ("", "mnist-worker-1.kubeflow.svc:2222,mnist-worker-0.kubeflow.svc:2222",
      "", None, KF_WORKER_1), {},
     r"^--worker_hosts=\S+ disagrees with TF_CONFIG, which says "
     r"mnist-worker-0\.kubeflow\.svc:2222,mnist-worker-1\.kubeflow\.svc:2222;"),
    ("resolve_bad_host_flag_with_tf_config", cluster.resolve,
     ("mnist-ps-0", "", "", None, KF_WORKER_1), {},
     r"^--ps_hosts: 'mnist-ps-0' is not host:port"),
    ("resolve_flags_without_job_name", cluster.resolve,
     ("ps0:2222", "w0:2222", "", None, ""), {},
     r"^--job_name is missing; a cluster task needs --job_name=ps\|worker\|evaluator and "
     r"--task_index$"),
    ("resolve_task_index_alone", cluster.resolve,
     ("", "", "", 0, ""), {},
     r"^--job_name is missing;"),
    ("resolve_job_name_without_task_index", cluster.resolve,
     ("ps0:2222", "w0:2222", "worker", None, ""), {},
     r"^--task_index is missing for --job_name=worker; pass the task's index in "
     r"its host list, from 0$"),
    ("resolve_num_workers_disagrees_with_worker_hosts", cluster.resolve,
     ("ps0:2222", "w0:2222,w1:2222", "worker", 0, ""), {"num_workers": 3},
     r"^--num_workers=3 disagrees with --worker_hosts, which lists 2$"),
    ("resolve_bad_tf_config", cluster.resolve,
     ("", "", "", None, "not json"), {},
     r"^TF_CONFIG is not valid JSON"),
)

# Bugs a review once found, each fixed; every case keeps its fix.
_BUGS = (
    # "master" was folded into "chief" by overwriting jobs["chief"], so a
    # config that listed both silently lost one chief.
    ("bug_chief_and_master_are_two_chiefs", cluster.parse_tf_config,
     (tf_config(dict(PS_WORKERS, chief=["c0:2222"], master=["m0:2222"]),
                 "chief"),), {},
     r"TF_CONFIG field \"cluster\" lists the chief job twice \(\"chief\" and \"master\""),
    # A sparse worker's index was not checked against --num_workers;
    # replica_index 5 of 2 replicas would read a shard that does not exist.
    ("bug_sparse_index_past_num_workers", cluster.parse_tf_config,
     (tf_config({"ps": ["ps0:2222"], "worker": {"5": "w5:2222"}}, "worker", 5,
                 key="sparseCluster"),), {"num_workers": 2},
     r"(?=.*worker 5, replica 5)(?=.*--num_workers says has 2 replicas)"),
    # A dense "cluster" may give a job as an {index: address} map; it was
    # counted by its length, so worker 1 became replica 1 of 1 replica.
    ("bug_dense_map_index_past_replicas", cluster.parse_tf_config,
     (tf_config({"ps": ["ps0:2222"], "worker": {"1": "w1:2222"}}, "worker", 1),),
     {}, r"(?=.*worker 1, replica 1)(?=.*\"cluster\" says has 1 replicas)"),
    # int("-1") was accepted as a sparse task index.
    ("bug_sparse_negative_index", cluster.parse_tf_config,
     (tf_config({"ps": ["ps0:2222"], "worker": {"-1": "w:2222"}}, "worker", -1,
                 key="sparseCluster"),), {"num_workers": 1},
     r"^TF_CONFIG field \"cluster\.worker\": task index '-1' .*(whole number|>= 0)"),
    # `$` also matches before a trailing newline, so "ps0:2222\n" passed the
    # host:port check and reached the ClusterSpec (host_ports.py now uses
    # fullmatch).
    ("bug_address_with_trailing_newline", cluster.parse_tf_config,
     (tf_config({"ps": ["ps0:2222\n"], "worker": ["w0:2222"]}),), {},
     r"TF_CONFIG field \"cluster\.ps\": 'ps0:2222\\n' is not host:port"),
    # The clash message embedded the raw flag value, so a value with a
    # newline (e.g. read from a file) made a two-line message.
    ("bug_clash_message_keeps_newline", cluster.resolve,
     ("ps9:2222\n", "", "", None, KF_WORKER_1), {},
     r"--ps_hosts=.*disagrees with TF_CONFIG"),
)


class ErrorsTest(parameterized.TestCase):

  @parameterized.named_parameters(*_ERRORS)
  def test_error(self, function, args, kwargs, pattern):
    with self.assertRaisesRegex(cluster.ClusterError, pattern) as raised:
      function(*args, **kwargs)
    self.assertNotIn("\n", str(raised.exception))

  @parameterized.named_parameters(*_BUGS)
  def test_known_bug(self, function, args, kwargs, pattern):
    with self.assertRaisesRegex(cluster.ClusterError, pattern) as raised:
      function(*args, **kwargs)
    self.assertNotIn("\n", str(raised.exception))

  def test_cluster_error_is_a_value_error(self):
    self.assertTrue(issubclass(cluster.ClusterError, ValueError))


if __name__ == "__main__":
  absltest.main()
