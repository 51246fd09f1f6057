"""Tests for ps_trainer.settings.config: flag values -> Config, on plain values (a dict like
FLAGS.flag_values_dict(): the defaults below, which FlagDefaultsTest keeps equal to what
flags.define_flags() gives, and the flags a test sets). The flags themselves, their validators
and the binary's one-line errors are in test_flags.py.
"""

import os
import time

from absl import flags as absl_flags
from absl.testing import absltest
from absl.testing import parameterized

from ps_trainer.settings import cluster
from ps_trainer.settings import config
from ps_trainer.settings import flags as flags_lib
import testutil

# The defaults of flags.py, as FLAGS.flag_values_dict() gives them after an
# empty command line. FlagDefaultsTest checks that they match define_flags().
_DEFAULTS = {
    "ps_hosts": "", "worker_hosts": "", "job_name": "", "task_index": None,
    "num_workers": None,
    "model": "mlp", "hidden_units": "128,64", "dataset": "digits",
    "input_fn": "", "params": "{}", "partition_min_bytes": 4 << 20,
    "vocab_size": 100_000, "embedding_dim": 16,
    "data_dir": "", "data_path": "",
    "batch_size": 64, "optimizer": "adam", "learning_rate": None,
    "train_steps": 1000, "sync_replicas": False, "replicas_to_aggregate": None,
    "seed": 0,
    "log_dir": "", "save_checkpoints_steps": None, "save_checkpoints_secs": None,
    "log_every_steps": 100,
    "wait_timeout_secs": 600, "trace_steps": 0, "wire_dtype": "float32",
    "factored_gradients": True, "record_steps": False,
    "pin_cpus": True,
}

# 1 PS + 2 workers on flags; worker 1 needs no --log_dir.
_WORKER_1 = dict(ps_hosts="ps0:2222", worker_hosts="w0:2222,w1:2222",
                 job_name="worker", task_index=1)
_WORKER_0 = dict(_WORKER_1, task_index=0)
_PS_0 = dict(_WORKER_1, job_name="ps", task_index=0)
_KF_CHIEF = ('{"cluster":{"chief":["c0:2222"],"ps":["ps0:2222"],'
             '"worker":["w0:2222","w1:2222"]},"task":{"type":"chief","index":0},'
             '"environment":"cloud"}')


def _values(**overrides):
  """Flag values as FLAGS.flag_values_dict() gives them: defaults + overrides."""
  unknown = set(overrides) - set(_DEFAULTS)
  if unknown:
    raise KeyError(f"not a flag of ps_trainer: {sorted(unknown)}")
  return dict(_DEFAULTS, **overrides)


class FlagDefaultsTest(absltest.TestCase):

  def test_defaults_match_define_flags(self):
    self.assertEqual(testutil.flag_values(), _DEFAULTS)

  def test_define_flags_leaves_global_flags_alone(self):
    before = set(absl_flags.FLAGS)
    flags_lib.define_flags(absl_flags.FlagValues())
    self.assertEqual(set(absl_flags.FLAGS), before)

  def test_defaults_make_a_local_config(self):
    cfg = config.from_flag_values(testutil.flag_values(), "", now=0)
    self.assertIsNone(cfg.cluster)
    self.assertEqual(cfg.model.hidden_units, (128, 64))
    self.assertEqual(cfg.train.learning_rate, 0.001)

  def test_good_values_parse(self):
    values = testutil.flag_values(
        "--ps_hosts=ps0:2222", "--worker_hosts=w0:2222,w1:2222",
        "--job_name=worker", "--task_index=1", "--model=cnn",
        "--dataset=synthetic", "--optimizer=momentum", "--learning_rate=0.5",
        "--sync_replicas", "--replicas_to_aggregate=1", "--num_workers=2",
        "--save_checkpoints_steps=10", "--log_dir=/tmp/x")
    self.assertEqual(values["task_index"], 1)
    self.assertTrue(values["sync_replicas"])
    self.assertEqual(values["learning_rate"], 0.5)
    cfg = config.from_flag_values(values, "")
    self.assertEqual(cfg.train.replicas_to_aggregate, 1)



class ConfigTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("sgd", "sgd", 0.1),
      ("momentum", "momentum", 0.05),
      ("adam", "adam", 0.001),
      ("adagrad", "adagrad", 0.1),
  )
  def test_default_learning_rate(self, optimizer, expected):
    cfg = config.from_flag_values(_values(optimizer=optimizer), "", now=0)
    self.assertEqual(cfg.train.optimizer, optimizer)
    self.assertEqual(cfg.train.learning_rate, expected)

  @parameterized.named_parameters(("sgd", "sgd"), ("adam", "adam"))
  def test_explicit_learning_rate_wins(self, optimizer):
    cfg = config.from_flag_values(
        _values(optimizer=optimizer, learning_rate=0.3), "", now=0)
    self.assertEqual(cfg.train.learning_rate, 0.3)

  def test_sync_aggregates_every_worker_by_default(self):
    cfg = config.from_flag_values(_values(sync_replicas=True, **_WORKER_1), "")
    self.assertEqual(cfg.train.replicas_to_aggregate, 2)

  def test_sync_local_mode_aggregates_one(self):
    cfg = config.from_flag_values(_values(sync_replicas=True), "", now=0)
    self.assertEqual(cfg.train.replicas_to_aggregate, 1)

  def test_sync_from_tf_config_counts_the_chief(self):
    cfg = config.from_flag_values(
        _values(sync_replicas=True, log_dir="/tmp/run"), _KF_CHIEF)
    self.assertEqual(cfg.train.replicas_to_aggregate, 3)

  def test_fewer_replicas_than_workers_is_backup_workers(self):
    cfg = config.from_flag_values(
        _values(sync_replicas=True, replicas_to_aggregate=1, **_WORKER_1), "")
    self.assertEqual(cfg.train.replicas_to_aggregate, 1)

  def test_async_has_no_replicas_to_aggregate(self):
    cfg = config.from_flag_values(_values(**_WORKER_1), "")
    self.assertFalse(cfg.train.sync_replicas)
    self.assertIsNone(cfg.train.replicas_to_aggregate)

  def test_replicas_to_aggregate_needs_sync(self):
    with self.assertRaisesRegex(
        config.ConfigError,
        r"^--replicas_to_aggregate=2 needs --sync_replicas; asynchronous "
        r"training applies every worker's gradients$") as raised:
      config.from_flag_values(_values(replicas_to_aggregate=2, **_WORKER_1), "")
    self.assertNotIn("\n", str(raised.exception))

  def test_replicas_to_aggregate_above_workers(self):
    with self.assertRaisesRegex(
        config.ConfigError,
        r"^--replicas_to_aggregate=3 exceeds the 2 worker\(s\); accepted: 1-2 "
        r"\(fewer than the workers makes the rest backups\)$") as raised:
      config.from_flag_values(
          _values(sync_replicas=True, replicas_to_aggregate=3, **_WORKER_1), "")
    self.assertNotIn("\n", str(raised.exception))

  def test_replicas_to_aggregate_above_one_in_local_mode(self):
    with self.assertRaisesRegex(config.ConfigError,
                                r"^--replicas_to_aggregate=2 .*accepted: 1-1 "):
      config.from_flag_values(
          _values(sync_replicas=True, replicas_to_aggregate=2), "", now=0)

  def test_checkpoint_every_n_secs_by_default(self):
    cfg = config.from_flag_values(_values(), "", now=0)
    self.assertIsNone(cfg.train.save_checkpoints_steps)
    self.assertEqual(cfg.train.save_checkpoints_secs, 60)

  def test_checkpoint_steps_replaces_secs(self):
    cfg = config.from_flag_values(_values(save_checkpoints_steps=50), "", now=0)
    self.assertEqual(cfg.train.save_checkpoints_steps, 50)
    self.assertIsNone(cfg.train.save_checkpoints_secs)

  def test_checkpoint_steps_and_secs_together_is_an_error(self):
    with self.assertRaisesRegex(
        config.ConfigError,
        r"--save_checkpoints_steps=50 and --save_checkpoints_secs=30 are both "
        r"set; pass one"):
      config.from_flag_values(
          _values(save_checkpoints_steps=50, save_checkpoints_secs=30), "",
          now=0)

  def test_local_log_dir_is_stamped_from_now(self):
    # mktime reads local time, so the stamp reads back the same in any zone.
    now = time.mktime((2024, 5, 17, 13, 45, 9, 0, 0, -1))
    cfg = config.from_flag_values(_values(), "", now=now)
    self.assertEqual(cfg.train.log_dir,
                     os.path.join("runs", "local-20240517-134509"))

  def test_explicit_log_dir_wins_in_local_mode(self):
    cfg = config.from_flag_values(_values(log_dir="/tmp/mine"), "", now=0)
    self.assertEqual(cfg.train.log_dir, "/tmp/mine")

  def test_a_log_dir_tf_would_read_as_a_pattern_is_refused(self):
    with self.assertRaises(config.ConfigError) as raised:
      config.from_flag_values(_values(log_dir="runs/lr[0.1]"), "", now=0)
    self.assertEqual(str(raised.exception), (
        "--log_dir=runs/lr[0.1]: TensorFlow finds checkpoints by pattern, so one under a path "
        "with [ in it is never found (a restart would start over); accepted: a path without "
        "* ? [ or \\"))

  @parameterized.named_parameters(
      ("worker_0", _WORKER_0, ""),
      ("tf_config_chief", {}, _KF_CHIEF),
  )
  def test_chief_needs_log_dir(self, overrides, tf_config):
    with self.assertRaisesRegex(
        config.ConfigError,
        r"^--log_dir is required for the chief: checkpoints and result\.json go "
        r"there") as raised:
      config.from_flag_values(_values(**overrides), tf_config)
    self.assertNotIn("\n", str(raised.exception))

  @parameterized.named_parameters(("worker_1", _WORKER_1), ("ps_0", _PS_0))
  def test_non_chief_needs_no_log_dir(self, overrides):
    cfg = config.from_flag_values(_values(**overrides), "")
    self.assertEqual(cfg.train.log_dir, "")

  def test_tracing_a_worker_needs_its_log_dir(self):
    with self.assertRaisesRegex(
        config.ConfigError,
        r"^--trace_steps=5 needs --log_dir on this worker too: it writes to "
        r"<log_dir>/traces/ \(on the chief's host, pass the chief's; on another, a directory "
        r"there; or leave the flag to the chief\)$"):
      config.from_flag_values(_values(trace_steps=5, **_WORKER_1), "")
    with self.assertRaisesRegex(
        config.ConfigError,
        r"^--record_steps needs --log_dir on this worker too: it writes to "
        r"<log_dir>/steps/ \("):
      config.from_flag_values(_values(record_steps=True, **_WORKER_1), "")

  def test_a_ps_ignores_trace_steps(self):
    cfg = config.from_flag_values(
        _values(trace_steps=5, record_steps=True, **_PS_0), "")
    self.assertEqual(cfg.train.trace_steps, 0)
    self.assertFalse(cfg.train.record_steps)

  def test_chief_keeps_its_log_dir(self):
    cfg = config.from_flag_values(_values(log_dir="/tmp/run", **_WORKER_0), "")
    self.assertEqual(cfg.train.log_dir, "/tmp/run")

  def test_local_mode_properties(self):
    cfg = config.from_flag_values(_values(), "", now=0)
    self.assertIsNone(cfg.cluster)
    self.assertEqual((cfg.num_workers, cfg.num_ps), (1, 0))
    self.assertTrue(cfg.is_chief)
    self.assertEqual(cfg.replica_index, 0)

  def test_cluster_mode_properties(self):
    cfg = config.from_flag_values(_values(**_WORKER_1), "")
    self.assertEqual(cfg.cluster.task_device, "/job:worker/task:1")
    self.assertEqual((cfg.num_workers, cfg.num_ps), (2, 1))
    self.assertFalse(cfg.is_chief)
    self.assertEqual(cfg.replica_index, 1)

  def test_cluster_mode_chief_properties(self):
    cfg = config.from_flag_values(_values(log_dir="/tmp/run", **_WORKER_0), "")
    self.assertTrue(cfg.is_chief)
    self.assertEqual(cfg.replica_index, 0)

  def test_tf_config_properties(self):
    cfg = config.from_flag_values(_values(log_dir="/tmp/run"), _KF_CHIEF)
    self.assertEqual(cfg.cluster.job_name, "chief")
    self.assertEqual((cfg.num_workers, cfg.num_ps), (3, 1))
    self.assertTrue(cfg.is_chief)
    self.assertEqual(cfg.replica_index, 0)

  def test_sparse_tf_config_takes_num_workers(self):
    cfg = config.from_flag_values(
        _values(num_workers=3),
        '{"sparseCluster":{"worker":{"1":"w1:2222"},"ps":["ps0:2222","ps1:2222"]},'
        '"task":{"type":"worker","index":1}}')
    self.assertEqual((cfg.num_workers, cfg.num_ps), (3, 2))
    self.assertEqual(cfg.replica_index, 1)

  def test_cluster_errors_pass_through(self):
    with self.assertRaisesRegex(cluster.ClusterError, r"^--task_index is missing"):
      config.from_flag_values(_values(ps_hosts="ps0:2222", worker_hosts="w0:2222",
                                      job_name="worker"), "")

  def test_data_and_model_sections(self):
    cfg = config.from_flag_values(
        _values(model="cnn", hidden_units="32", dataset="npz",
                data_path="/d/x.npz", batch_size=16, seed=7), "", now=0)
    self.assertEqual(cfg.model, config.ModelConfig("cnn", (32,)))
    self.assertEqual(cfg.data, config.DataConfig("npz", "", "/d/x.npz", 16))
    self.assertEqual(cfg.train.seed, 7)

  def test_wide_deep_section(self):
    cfg = config.from_flag_values(
        _values(model="wide_deep", dataset="tfrecord", data_dir="/clicks",
                vocab_size=200_000, embedding_dim=8, hidden_units="32"), "",
        now=0)
    self.assertEqual(cfg.model, config.ModelConfig("wide_deep", (32,),
                                                   200_000, 8))

  @parameterized.named_parameters(
      ("wide_deep_on_images", dict(model="wide_deep", dataset="digits"),
       r"^--model=wide_deep needs click records with sparse ids, but "
       r"--dataset=digits holds dense examples; use --dataset=tfrecord"),
      ("tfrecord_for_mlp", dict(model="mlp", dataset="tfrecord"),
       r"^--dataset=tfrecord holds click records .*, which --model=mlp "
       r"cannot read; use --model=wide_deep$"))
  def test_model_and_data_must_fit(self, overrides, pattern):
    with self.assertRaisesRegex(config.ConfigError, pattern):
      config.from_flag_values(_values(**overrides), "", now=0)

  def test_config_is_frozen(self):
    cfg = config.from_flag_values(_values(), "", now=0)
    with self.assertRaises(AttributeError):
      cfg.train.learning_rate = 1.0  # pytype: disable=not-writable

  def test_values_are_not_mutated(self):
    values = _values(sync_replicas=True, **_WORKER_1)
    before = dict(values)
    config.from_flag_values(values, "")
    self.assertEqual(values, before)


if __name__ == "__main__":
  absltest.main()
