"""Tests for ps_trainer.settings.flags and the binary's flag errors (flag values -> Config is in
test_config.py).

Three layers, fastest first:
  * parse_hidden_units: a pure function on a flag's value.
  * The validators that define_flags() registers, run in-process on a fresh
    absl FlagValues (never the global FLAGS, which pytest leaves unparsed).
  * `python -m ps_trainer <bad flag>` end to end: exit code, one clear line
    naming the flag, no traceback, and no TensorFlow import before failing.
"""

import functools
import re
import subprocess
import time

from absl import flags as absl_flags
from absl.testing import absltest
from absl.testing import parameterized

from ps_trainer.console import help_flags
from ps_trainer.settings import flags as flags_lib
import testutil


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
      testutil.flag_values(*argv)
    self.assertNotIn("\n", str(raised.exception))

  @parameterized.named_parameters(
      ("chief", "--job_name=chief"),  # From TF_CONFIG; flags reject it later.
      ("evaluator", "--job_name=evaluator"),
      ("task_index_0", "--task_index=0"),
      ("learning_rate_small", "--learning_rate=1e-6"),
      ("hidden_units_one", "--hidden_units=8"),
  )
  def test_accepted(self, arg):
    testutil.flag_values(arg)


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
