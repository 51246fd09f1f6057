"""Tests for ps_trainer.flags and ps_trainer.config, and the binary's flag errors.

Three layers, fastest first:
  * parse_hidden_units and config.from_flag_values: pure functions on plain
    values (a dict like FLAGS.flag_values_dict()).
  * The validators that define_flags() registers, run in-process on a fresh
    absl FlagValues (never the global FLAGS, which pytest leaves unparsed).
  * `python -m ps_trainer <bad flag>` end to end: exit code, one clear line
    naming the flag, no traceback, and no TensorFlow import before failing.
"""

import functools
import os
import re
import subprocess
import time

from absl import flags as absl_flags
from absl.testing import absltest
from absl.testing import parameterized

from ps_trainer import cluster
from ps_trainer import config
from ps_trainer import flags as flags_lib
from ps_trainer import help_flags
import testutil

# The defaults of flags.py, as FLAGS.flag_values_dict() gives them after an
# empty command line. FlagDefaultsTest checks that they match define_flags().
_DEFAULTS = {
    "ps_hosts": "", "worker_hosts": "", "job_name": "", "task_index": None,
    "num_workers": None,
    "model": "mlp", "hidden_units": "128,64", "dataset": "digits",
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


def _defined_flags() -> absl_flags.FlagValues:
  """A fresh FlagValues holding exactly what flags_lib.define_flags() defines."""
  flag_values = absl_flags.FlagValues()
  flags_lib.define_flags(flag_values)
  return flag_values


def _parse(*argv) -> absl_flags.FlagValues:
  flag_values = _defined_flags()
  flag_values(["ps_trainer"] + list(argv))
  return flag_values


class ParseHiddenUnitsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("two_layers", "256,128", (256, 128)),
      ("one_layer", "64", (64,)),
      ("spaces", " 256 , 128 ", (256, 128)),
      ("three_layers", "512,256,128", (512, 256, 128)),
  )
  def test_valid(self, value, expected):
    self.assertEqual(flags_lib.parse_hidden_units(value), expected)

  @parameterized.named_parameters(
      ("empty", ""),
      ("blank", "   "),
      ("letter", "a"),
      ("zero", "0"),
      ("zero_layer", "128,0"),
      ("negative", "-1"),
      ("plus_sign", "+5"),
      ("empty_middle", "1,,2"),
      ("trailing_comma", "128,"),
      ("leading_comma", ",128"),
      ("decimal", "1.5"),
      ("exponent", "1e3"),
      ("space_separated", "128 64"),
      ("semicolons", "128;64"),
  )
  def test_malformed(self, value):
    with self.assertRaisesRegex(
        ValueError,
        r"^expected comma-separated positive whole numbers, e\.g\. 256,128$"):
      flags_lib.parse_hidden_units(value)


class FlagDefaultsTest(absltest.TestCase):

  def test_defaults_match_define_flags(self):
    self.assertEqual(_parse().flag_values_dict(), _DEFAULTS)

  def test_define_flags_leaves_global_flags_alone(self):
    before = set(absl_flags.FLAGS)
    _defined_flags()
    self.assertEqual(set(absl_flags.FLAGS), before)

  def test_defaults_make_a_local_config(self):
    cfg = config.from_flag_values(_parse().flag_values_dict(), "", now=0)
    self.assertIsNone(cfg.cluster)
    self.assertEqual(cfg.model.hidden_units, (128, 64))
    self.assertEqual(cfg.train.learning_rate, 0.001)

  def test_good_values_parse(self):
    values = _parse(
        "--ps_hosts=ps0:2222", "--worker_hosts=w0:2222,w1:2222",
        "--job_name=worker", "--task_index=1", "--model=cnn",
        "--dataset=synthetic", "--optimizer=momentum", "--learning_rate=0.5",
        "--sync_replicas", "--replicas_to_aggregate=1", "--num_workers=2",
        "--save_checkpoints_steps=10", "--log_dir=/tmp/x").flag_values_dict()
    self.assertEqual(values["task_index"], 1)
    self.assertTrue(values["sync_replicas"])
    self.assertEqual(values["learning_rate"], 0.5)
    cfg = config.from_flag_values(values, "")
    self.assertEqual(cfg.train.replicas_to_aggregate, 1)


# (name, argv, pattern): absl's message is "flag --NAME=VALUE: REASON".
_BAD_FLAGS = (
    ("model", ["--model=resnet"],
     r"flag --model=resnet: unknown value; accepted: linear, mlp, cnn, wide_deep"),
    ("optimizer", ["--optimizer=lbfgs"],
     r"flag --optimizer=lbfgs: unknown value; accepted: sgd, momentum, adam, "
     r"adagrad"),
    ("dataset", ["--dataset=imagenet"],
     r"flag --dataset=imagenet: unknown value; accepted: digits, synthetic, "
     r"mnist, npz"),
    ("job_name", ["--job_name=boss"],
     r"flag --job_name=boss: unknown job name; accepted: ps, worker, evaluator "
     r"\(chief comes from TF_CONFIG\)"),
    ("batch_size_0", ["--batch_size=0"], r"flag --batch_size=0: must be >= 1"),
    ("train_steps_0", ["--train_steps=0"], r"flag --train_steps=0: must be >= 1"),
    # TF would wrap a table size past int32 around: a smaller table, or a traceback.
    ("vocab_size_past_int32", ["--vocab_size=300000000000"],
     r"flag --vocab_size=300000000000: must be between 1 and 2147483647"),
    ("embedding_dim_0", ["--embedding_dim=0"],
     r"flag --embedding_dim=0: must be between 1 and 2147483647"),
    ("learning_rate_0", ["--learning_rate=0"],
     r"flag --learning_rate=0(\.0)?: must be a finite number > 0"),
    ("learning_rate_nan", ["--learning_rate=nan"],
     r"flag --learning_rate=nan: must be a finite number > 0"),
    ("learning_rate_inf", ["--learning_rate=inf"],
     r"flag --learning_rate=inf: must be a finite number > 0"),
    ("learning_rate_negative", ["--learning_rate=-1"],
     r"flag --learning_rate=-1(\.0)?: must be a finite number > 0"),
    ("replicas_to_aggregate_0", ["--replicas_to_aggregate=0"],
     r"flag --replicas_to_aggregate=0: must be >= 1"),
    ("hidden_units", ["--hidden_units=12,x"],
     r"flag --hidden_units=12,x: expected comma-separated positive whole numbers"),
    ("hidden_units_empty", ["--hidden_units="],
     r"flag --hidden_units=: expected comma-separated positive whole numbers"),
    ("task_index_negative", ["--task_index=-1"],
     r"flag --task_index=-1: must be >= 0"),
    ("num_workers_0", ["--num_workers=0"], r"flag --num_workers=0: must be >= 1"),
    ("save_checkpoints_steps_0", ["--save_checkpoints_steps=0"],
     r"flag --save_checkpoints_steps=0: must be >= 1"),
    ("save_checkpoints_secs_0", ["--save_checkpoints_secs=0"],
     r"flag --save_checkpoints_secs=0: must be >= 1"),
    ("log_every_steps_0", ["--log_every_steps=0"],
     r"flag --log_every_steps=0: must be >= 1"),
)


class ValidatorTest(parameterized.TestCase):
  """The validators define_flags() registers, on a fresh FlagValues."""

  @parameterized.named_parameters(*_BAD_FLAGS)
  def test_rejected(self, argv, pattern):
    with self.assertRaisesRegex(absl_flags.IllegalFlagValueError,
                                "^" + pattern) as raised:
      _parse(*argv)
    self.assertNotIn("\n", str(raised.exception))

  @parameterized.named_parameters(
      ("chief", "--job_name=chief"),  # From TF_CONFIG; flags reject it later.
      ("evaluator", "--job_name=evaluator"),
      ("task_index_0", "--task_index=0"),
      ("learning_rate_small", "--learning_rate=1e-6"),
      ("hidden_units_one", "--hidden_units=8"),
  )
  def test_accepted(self, arg):
    _parse(arg)


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
        r"^--trace_steps=5 needs --log_dir on this worker: it writes to "
        r"<log_dir>/traces/$"):
      config.from_flag_values(_values(trace_steps=5, **_WORKER_1), "")
    with self.assertRaisesRegex(
        config.ConfigError,
        r"^--record_steps needs --log_dir on this worker: it writes to "
        r"<log_dir>/steps/$"):
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


# `python -m ps_trainer` with a bad input: (name, argv, env, pattern). The
# pattern must match ONE line of stderr, naming the flag (or TF_CONFIG) and
# the reason.
_BINARY_CASES = (
    ("model", ["--model=resnet"], {},
     r"--model=resnet: unknown value; accepted: linear, mlp, cnn, wide_deep"),
    ("optimizer", ["--optimizer=lbfgs"], {},
     r"--optimizer=lbfgs: unknown value; accepted: sgd, momentum, adam, adagrad"),
    ("dataset", ["--dataset=imagenet"], {},
     r"--dataset=imagenet: unknown value; accepted: digits, synthetic, mnist, npz, tfrecord"),
    ("job_name", ["--job_name=boss"], {},
     r"--job_name=boss: unknown job name; accepted: ps, worker, evaluator "
     r"\(chief comes from TF_CONFIG\)"),
    ("batch_size", ["--batch_size=0"], {}, r"--batch_size=0: must be >= 1"),
    ("train_steps", ["--train_steps=0"], {}, r"--train_steps=0: must be >= 1"),
    ("learning_rate_0", ["--learning_rate=0"], {},
     r"--learning_rate=0(\.0)?: must be a finite number > 0"),
    ("learning_rate_nan", ["--learning_rate=nan"], {},
     r"--learning_rate=nan: must be a finite number > 0"),
    ("learning_rate_negative", ["--learning_rate=-1"], {},
     r"--learning_rate=-1(\.0)?: must be a finite number > 0"),
    ("replicas_to_aggregate", ["--replicas_to_aggregate=0"], {},
     r"--replicas_to_aggregate=0: must be >= 1"),
    ("hidden_units", ["--hidden_units=12,x"], {},
     r"--hidden_units=12,x: expected comma-separated positive whole numbers"),
    ("vocab_size", ["--vocab_size=0"], {}, r"--vocab_size=0: must be between 1 and 2147483647"),
    ("task_index", ["--task_index=-1"], {}, r"--task_index=-1: must be >= 0"),
    # What the flag accepts, not Python's words for the failed conversion.
    ("not_a_whole_number", ["--vocab_size=1e5"], {},
     r"^ps_trainer: error: flag --vocab_size=1e5: expected a whole number \(see --helpfull\)$"),
    ("not_a_number", ["--learning_rate=abc"], {},
     r"^ps_trainer: error: flag --learning_rate=abc: expected a number \(see --helpfull\)$"),
    ("not_a_boolean", ["--record_steps=maybe"], {},
     r"^ps_trainer: error: flag --record_steps=maybe: expected true or false \(or "
     r"--record_steps / --norecord_steps\) \(see --helpfull\)$"),
    ("ps_hosts_without_port",
     ["--ps_hosts=nohostport", "--worker_hosts=a:1", "--job_name=ps",
      "--task_index=0"], {},
     r"--ps_hosts: 'nohostport' is not host:port; expected e\.g\."),
    ("tf_config_not_json", [], {"TF_CONFIG": "not json"},
     r"TF_CONFIG is not valid JSON \("),
    ("second_evaluator",
     ["--ps_hosts=a:1", "--worker_hosts=b:1", "--job_name=evaluator", "--task_index=1"], {},
     r"^ps_trainer: error: --task_index=1: a job has one evaluator, task 0 \(two would write "
     r"the same eval\.json\)$"),
    ("positional_argument", ["stray"], {},
     r"unexpected arguments 'stray'; every setting is a --flag"),
)

_IMPORT_TIME = re.compile(r"^import time:")
_TF_IMPORT = re.compile(r"^import time:.*\|\s*tensorflow$", re.MULTILINE)


@functools.lru_cache(maxsize=None)
def _run_binary(argv, env_items):
  """Runs the real binary once per case; returns (code, stdout, stderr, imported_tf, secs).

  `-X importtime` makes Python list every module it imports on stderr, which
  tells whether TensorFlow was loaded before the error. Those lines are split
  off: the returned stderr is what a user sees.
  """
  start = time.monotonic()
  proc = subprocess.run(
      [testutil.PYTHON, "-X", "importtime", "-m", "ps_trainer", *argv],
      cwd=str(testutil.REPO_ROOT), env=testutil.trainer_env(dict(env_items)),
      stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
      check=False)
  secs = time.monotonic() - start
  lines = proc.stderr.splitlines()
  user_stderr = "\n".join(l for l in lines if not _IMPORT_TIME.match(l))
  imported_tf = bool(_TF_IMPORT.search(proc.stderr))
  return proc.returncode, proc.stdout, user_stderr, imported_tf, secs


def _binary(argv, env):
  return _run_binary(tuple(argv), tuple(sorted(env.items())))


class HelpAskedTest(parameterized.TestCase):

  @parameterized.parameters(
      (["prog", "--help"], "short"), (["prog", "-h"], "short"), (["prog", "-?"], "short"),
      (["prog", "--train_steps=5", "--helpshort"], "short"), (["prog", "--helpfull"], "full"),
      (["prog", "--train_steps=5"], None), (["prog", "--helpless=1"], None),
      (["prog", "--", "--help"], None), (["--help"], None))
  def test_which_help_argv_asks_for(self, argv, kind):
    self.assertEqual(help_flags.asked(argv), kind)


class BinaryFlagErrorTest(parameterized.TestCase):
  """`python -m ps_trainer` with a bad value: one clear line, no traceback."""

  def test_tensorflow_import_detector(self):
    # The line `python -X importtime -c "import tensorflow"` prints for TF.
    self.assertRegex("import time:      6963 |    4082144 | tensorflow",
                     _TF_IMPORT)
    self.assertNotRegex("import time:  1 |  2 |   tensorflow.python.x",
                        _TF_IMPORT)

  @parameterized.named_parameters(*_BINARY_CASES)
  def test_fails_with_one_clear_line(self, argv, env, pattern):
    code, stdout, stderr, _, secs = _binary(argv, env)
    where = f"\n--- stdout ---\n{stdout}\n--- stderr ({secs:.1f} s) ---\n{stderr}"
    self.assertNotEqual(code, 0, where)
    self.assertNotIn("Traceback", stdout + stderr, where)
    matching = [l for l in stderr.splitlines() if re.search(pattern, l)]
    self.assertLen(matching, 1, f"no single stderr line matches {pattern!r}{where}")

  def test_a_stray_argument_is_that_line_alone_and_status_2(self):
    # Not the whole --help first: a mistyped launch.sh command used to end up here.
    code, stdout, stderr, _, _ = _binary(["stray", "--train_steps=5"], {})
    self.assertEqual((code, stdout, stderr), (
        2, "", "ps_trainer: error: unexpected arguments 'stray'; every setting is a --flag "
        "(see --helpfull)"))

  @parameterized.named_parameters(*_BINARY_CASES)
  def test_fails_before_importing_tensorflow(self, argv, env, pattern):
    del pattern  # Checked above.
    _, _, stderr, imported_tf, secs = _binary(argv, env)
    self.assertFalse(
        imported_tf,
        f"the error came after importing TensorFlow ({secs:.1f} s); user errors "
        f"should fail before it\n--- stderr ---\n{stderr}")


if __name__ == "__main__":
  absltest.main()
