"""`python -m ps_trainer` with bad input, as a user would run it: one clear line, exit 2.

A catalogue of the mistakes a user makes with flags, TF_CONFIG, data files, ports and the log
directory. Each case runs the real binary in a subprocess (cwd: a fresh temp dir, so a local run's
default runs/ directory lands there) and asserts:
  * exit status 2 (a user error), within a timeout, so a hang fails instead of blocking;
  * no "Traceback" anywhere;
  * stdout and stderr together hold exactly ONE line, on stderr, starting with
    "ps_trainer: error: " (TensorFlow's start-up noise is hidden by the trainer);
  * that line holds the case's key words: the flag, file or TF_CONFIG field, what was wrong and
    what is accepted.

Cases that fail on flags, TF_CONFIG, the log directory or a data file read whole (digits, mnist,
npz) answer before TensorFlow loads (~0.2 s), and are run so that an import of TensorFlow fails
them; TFRecord files, ports and another model's checkpoints are checked after it loads (~3 s
each). Cases that get that far run with --train_steps=2 in case a regression lets them train.
"""

import fcntl
import os
import signal
import socket
import subprocess
import time

from absl.testing import absltest
from absl.testing import parameterized

import testutil

_TIMEOUT_SECS = 120  # TF cases take ~3 s; this only turns a hang into a failure.
_PREFIX = "ps_trainer: error: "
# A small valid cluster: 1 PS + 2 workers (nothing listens: every case fails before connecting).
_PS = "--ps_hosts=127.0.0.1:2222"
_WORKERS = "--worker_hosts=127.0.0.1:2223,127.0.0.1:2224"
_WORKER_1 = [_PS, _WORKERS, "--job_name=worker", "--task_index=1"]
_SHORT = "--train_steps=2"
_NPZ_KEYS = "keys x_train, y_train, x_test, y_test"
_MNIST_NEEDS = "--dataset=mnist needs the four MNIST IDX files"


# Set-ups: (test, tmp) -> extra values for the case's {placeholders} ({tmp} is always there).
def _mnist_truncated_images(test, tmp):
  del test
  paths = testutil.write_mnist(os.path.join(tmp, "mnist"))
  path = paths["train-images-idx3-ubyte"]
  with open(path, "r+b") as f:
    f.truncate(16 + 14)  # the header, then 14 of the 72 pixel bytes
  return {"file": path}


def _mnist_bad_magic(test, tmp):
  del test
  paths = testutil.write_mnist(os.path.join(tmp, "mnist"))
  path = paths["train-labels-idx1-ubyte"]
  with open(path, "r+b") as f:
    f.write((0x899).to_bytes(4, "big"))  # neither the label (0x801) nor the image magic
  return {"file": path}


def _npz_missing_key(test, tmp):
  del test
  return {"npz": testutil.write_npz(os.path.join(tmp, "d.npz"), drop=("y_test",))}


def _npz_length_mismatch(test, tmp):
  del test
  return {"npz": testutil.write_npz(os.path.join(tmp, "d.npz"), y_train=[0, 1, 2, 0])}


def _click_dir(test, tmp):
  """A small click data set in {tmp}/clicks: 2 train files of 200 records."""
  del test
  from ps_trainer import clicks  # pylint: disable=g-import-not-at-top
  clicks.write_click_set(os.path.join(tmp, "clicks"), num_train=400, num_test=50,
                         vocab=100, dense_dim=2, num_shards=2)
  return {}


def _click_dir_without_train(test, tmp):
  _click_dir(test, tmp)
  for name in os.listdir(os.path.join(tmp, "clicks")):
    if name.startswith("train"):
      os.remove(os.path.join(tmp, "clicks", name))
  return {}


def _click_dir_with_negative_id(test, tmp):
  """{file}: a train file of {tmp}/clicks whose record 2 has the id -4."""
  _click_dir(test, tmp)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = os.path.join(tmp, "clicks", "train-00000-of-00002.tfrecord")
  # By hand: record_checks.write_examples refuses negative ids.
  with tf.io.TFRecordWriter(path) as writer:
    for ids, label in (([1, 2], 0), ([5], 1), ([3, -4, 7], 1)):
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
          "dense": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5, 1.0])),
          "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
      })).SerializeToString())
  return {"file": path}


def _port_in_use(test, tmp):
  del tmp
  # Held like a server holds it: every interface, listening, for the whole case.
  sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  test.addCleanup(sock.close)
  sock.bind(("", 0))
  sock.listen(1)
  return {"port": sock.getsockname()[1], "worker_port": testutil.pick_free_ports(1)[0]}


def _run_of_another_model(test, tmp):
  """{tmp}/run: checkpoints of a 2-step mlp 8,8 run (a real one: ~4 s)."""
  done = subprocess.run([testutil.PYTHON, "-m", "ps_trainer", "--hidden_units=8,8", _SHORT,
                         f"--log_dir={tmp}/run"], env=testutil.trainer_env(), cwd=tmp,
                        capture_output=True, text=True, timeout=_TIMEOUT_SECS)
  # Its output, should the set-up itself fail: otherwise only an exit status would show.
  test.assertEqual(done.returncode, 0,
                   f"the set-up run failed\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
  return {}


def _claimed_log_dir(test, tmp):
  """{tmp}/run, held as a live chief holds its --log_dir (output_dir.claim)."""
  os.makedirs(os.path.join(tmp, "run"))
  claim = open(os.path.join(tmp, "run", ".chief.lock"), "w")  # pylint: disable=consider-using-with
  test.addCleanup(claim.close)
  fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
  claim.write("pid 4242 on otherhost\n")
  claim.flush()
  return {}


def _regular_file(test, tmp):
  del test
  with open(os.path.join(tmp, "file"), "w", encoding="utf-8") as f:
    f.write("not a directory\n")
  return {}


# (name, set-up or None, argv, extra environment, key words of the error line). argv and key
# words are str.format()ed with the set-up's values and {tmp}; the environment is not.
_CASES = (
    # Cluster flags.
    ("unknown_job_name", None, [_PS, _WORKERS, "--job_name=boss", "--task_index=0"], {},
     ["--job_name=boss", "unknown job name",
      "accepted: ps, worker, evaluator (chief comes from TF_CONFIG)"]),
    ("job_name_chief_with_host_flags", None,
     [_PS, _WORKERS, "--job_name=chief", "--task_index=0"], {},
     ["--job_name='chief'", "is not a task type of a --ps_hosts/--worker_hosts cluster",
      "accepted: ps, worker"]),
    ("task_index_out_of_range", None, [_PS, _WORKERS, "--job_name=worker", "--task_index=2"], {},
     ["--task_index=2", "worker index out of range", "2 worker task(s)",
      "accepted indices are 0-1"]),
    ("task_index_negative", None, [_PS, _WORKERS, "--job_name=worker", "--task_index=-1"], {},
     ["--task_index=-1", "must be >= 0"]),
    ("host_without_port", None,
     ["--ps_hosts=ps0", _WORKERS, "--job_name=worker", "--task_index=0"], {},
     ["--ps_hosts", "'ps0' is not host:port", "expected e.g. 10.0.0.1:2222"]),
    ("port_out_of_range", None,
     [_PS, "--worker_hosts=127.0.0.1:70000", "--job_name=worker", "--task_index=0"], {},
     ["--worker_hosts", "port 70000", "out of range", "accepted ports are 1-65535"]),
    ("same_address_twice", None,
     [_PS, "--worker_hosts=127.0.0.1:2223,127.0.0.1:2222", "--job_name=worker",
      "--task_index=1"], {},
     ["--ps_hosts/--worker_hosts", "127.0.0.1:2222 appears twice",
      "every task needs its own host:port"]),
    ("missing_ps_hosts", None, [_WORKERS, "--job_name=worker", "--task_index=1"], {},
     ["--ps_hosts is empty", "at least one PS", "e.g. --ps_hosts="]),
    ("missing_worker_hosts", None, [_PS, "--job_name=ps", "--task_index=0"], {},
     ["--worker_hosts is empty", "at least one worker", "e.g. --worker_hosts="]),
    ("chief_without_log_dir", None, [_PS, _WORKERS, "--job_name=worker", "--task_index=0"], {},
     ["--log_dir is required for the chief"]),
    # Training flags.
    ("replicas_to_aggregate_0", None, ["--sync_replicas", "--replicas_to_aggregate=0"], {},
     ["--replicas_to_aggregate=0", "must be >= 1"]),
    ("replicas_to_aggregate_above_workers", None,
     _WORKER_1 + ["--sync_replicas", "--replicas_to_aggregate=3"], {},
     ["--replicas_to_aggregate=3", "exceeds the 2 worker(s)", "accepted: 1-2"]),
    ("batch_size_0", None, ["--batch_size=0"], {}, ["--batch_size=0", "must be >= 1"]),
    ("batch_size_negative", None, ["--batch_size=-8"], {}, ["--batch_size=-8", "must be >= 1"]),
    ("learning_rate_0", None, ["--learning_rate=0"], {},
     ["--learning_rate=0", "must be a finite number > 0"]),
    ("learning_rate_negative", None, ["--learning_rate=-0.1"], {},
     ["--learning_rate=-0.1", "must be a finite number > 0"]),
    ("learning_rate_nan", None, ["--learning_rate=nan"], {},
     ["--learning_rate=nan", "must be a finite number > 0"]),
    ("train_steps_0", None, ["--train_steps=0"], {}, ["--train_steps=0", "must be >= 1"]),
    ("unknown_model", None, ["--model=resnet"], {},
     ["--model=resnet", "unknown value", "accepted: linear, mlp, cnn, wide_deep"]),
    ("unknown_optimizer", None, ["--optimizer=lbfgs"], {},
     ["--optimizer=lbfgs", "unknown value", "accepted: sgd, momentum, adam, adagrad"]),
    ("unknown_dataset", None, ["--dataset=imagenet"], {},
     ["--dataset=imagenet", "unknown value", "accepted: digits, synthetic, mnist, npz, tfrecord"]),
    ("hidden_units_malformed", None, ["--hidden_units=128,x"], {},
     ["--hidden_units=128,x", "expected comma-separated positive whole numbers", "256,128"]),
    ("hidden_units_zero", None, ["--hidden_units=128,0"], {},
     ["--hidden_units=128,0", "expected comma-separated positive whole numbers"]),
    # Output.
    ("log_dir_under_a_file", _regular_file, ["--log_dir={tmp}/file/run", _SHORT], {},
     ["--log_dir={tmp}/file/run", "cannot write there (Not a directory)",
      "a directory this user can create and write"]),
    ("log_dir_a_file", _regular_file, ["--log_dir={tmp}/file", _SHORT], {},
     ["--log_dir={tmp}/file", "is a file, not a directory"]),
    ("worker_records_to_a_file", _regular_file,
     _WORKER_1 + ["--record_steps", "--log_dir={tmp}/file"], {},
     ["--log_dir={tmp}/file", "is a file, not a directory"]),
    ("worker_traces_under_a_file", _regular_file,
     _WORKER_1 + ["--trace_steps=5", "--log_dir={tmp}/file/run"], {},
     ["--log_dir={tmp}/file/run", "cannot write there (Not a directory)"]),
    ("evaluator_log_dir_under_a_file", _regular_file,
     [_PS, _WORKERS, "--job_name=evaluator", "--task_index=0", "--log_dir={tmp}/file/run"], {},
     ["--log_dir={tmp}/file/run", "cannot write there (Not a directory)"]),
    ("log_dir_in_use_by_another_chief", _claimed_log_dir, ["--log_dir={tmp}/run", _SHORT], {},
     ["--log_dir={tmp}/run: a chief trains into it now (pid 4242 on otherhost)",
      "overwrite each other's checkpoints", "pass another --log_dir"]),
    ("log_dir_of_another_model", _run_of_another_model,
     ["--hidden_units=8,4", _SHORT, "--log_dir={tmp}/run"], {},
     ["--log_dir={tmp}/run holds checkpoints of another model",
      "model/hidden1/kernel is [8, 8] there, [8, 4] here",
      "the training flags it was started with", "a new --log_dir", "nothing was changed"]),
    # TF_CONFIG.
    ("tf_config_not_json", None, [], {"TF_CONFIG": "{cluster: ps}"},
     ["TF_CONFIG is not valid JSON", "line 1 column 2"]),
    ("tf_config_unknown_task_type", None, [],
     {"TF_CONFIG": '{"cluster": {"ps": ["ps0:2222"], "worker": ["w0:2222"]}, '
                   '"task": {"type": "boss", "index": 0}}'},
     ['TF_CONFIG field "task.type"', "'boss'", "unknown task type",
      "accepted: chief, worker, ps, evaluator"]),
    ("tf_config_task_index_outside_cluster", None, [],
     {"TF_CONFIG": '{"cluster": {"ps": ["ps0:2222"], "worker": ["w0:2222", "w1:2222"]}, '
                   '"task": {"type": "worker", "index": 2}}'},
     ['TF_CONFIG field "task"', "worker 2", "the cluster does not list",
      "listed worker indices: [0, 1]"]),
    # Data files: the ones read whole before TensorFlow loads, TFRecord files after.
    ("mnist_data_dir_missing", None, ["--dataset=mnist", "--data_dir={tmp}/absent", _SHORT], {},
     ["--data_dir={tmp}/absent", "no such directory", _MNIST_NEEDS]),
    ("npz_data_path_missing", None, ["--dataset=npz", "--data_path={tmp}/absent.npz", _SHORT], {},
     ["--data_path={tmp}/absent.npz", "no such file", _NPZ_KEYS]),
    ("idx_truncated", _mnist_truncated_images,
     ["--dataset=mnist", "--data_dir={tmp}/mnist", _SHORT], {},
     ["{file}", "truncated", "header promises 6 images of 4x3 (72 bytes)", "holds 14 bytes"]),
    ("idx_bad_magic", _mnist_bad_magic, ["--dataset=mnist", "--data_dir={tmp}/mnist", _SHORT], {},
     ["{file}", "wrong magic number 0x00000899", "expected 0x00000801, an IDX label file"]),
    ("npz_missing_key", _npz_missing_key, ["--dataset=npz", "--data_path={npz}", _SHORT], {},
     ["--data_path={npz}", "missing key 'y_test'", _NPZ_KEYS]),
    ("npz_length_mismatch", _npz_length_mismatch,
     ["--dataset=npz", "--data_path={npz}", _SHORT], {},
     ["--data_path={npz}", "x_train has 3 examples but y_train has 4",
      "each example needs exactly one label"]),
    ("wide_deep_on_images", None, ["--model=wide_deep"], {},
     ["--model=wide_deep needs click records with sparse ids", "--dataset=digits",
      "use --dataset=tfrecord --data_dir=DIR"]),
    ("tfrecord_without_train_files", _click_dir_without_train,
     ["--model=wide_deep", "--dataset=tfrecord", "--data_dir={tmp}/clicks", _SHORT], {},
     ["--data_dir={tmp}/clicks", "train"]),
    # The served model drops negative ids (-1 pads its rows): training on them would not fail.
    ("tfrecord_negative_id", _click_dir_with_negative_id,
     ["--model=wide_deep", "--dataset=tfrecord", "--data_dir={tmp}/clicks", _SHORT], {},
     ["{file}: record 2: ids[1] is -4; expected ids >= 0 (the served model drops negative ids) "
      "(--dataset=tfrecord)"]),
    # Past int32, TF wrapped the table size around: a traceback (or a silently smaller table).
    ("tfrecord_vocab_size_past_int32", _click_dir,
     ["--model=wide_deep", "--dataset=tfrecord", "--data_dir={tmp}/clicks",
      "--vocab_size=300000000000", _SHORT], {},
     ["--vocab_size=300000000000: must be between 1 and 2147483647"]),
    # The data set's file flag, unset: refused before TensorFlow loads, so `launch.sh local`,
    # bench and compare refuse it before they start any task.
    ("mnist_without_data_dir", None, ["--dataset=mnist", _SHORT], {},
     ["--data_dir is not set", _MNIST_NEEDS, "train-images-idx3-ubyte[.gz]"]),
    ("tfrecord_without_data_dir", None, ["--model=wide_deep", "--dataset=tfrecord", _SHORT], {},
     ["--data_dir is not set", "--dataset=tfrecord"]),
    ("npz_without_data_path", None, ["--dataset=npz", _SHORT], {},
     ["--data_path is not set", _NPZ_KEYS]),
    # A data flag that the data set ignores: the run would train on something else and exit 0.
    ("data_path_without_dataset_npz", None, ["--data_path={tmp}/x.npz", _SHORT], {},
     ["--data_path={tmp}/x.npz", "--dataset=digits does not read it", "only --dataset=npz"]),
    ("data_dir_with_dataset_npz", None,
     ["--dataset=npz", "--data_path={tmp}/x.npz", "--data_dir={tmp}", _SHORT], {},
     ["--data_dir={tmp}", "--dataset=npz does not read it",
      "only --dataset=mnist or --dataset=tfrecord"]),
    ("npz_data_path_a_directory", None, ["--dataset=npz", "--data_path={tmp}", _SHORT], {},
     ["--data_path={tmp}", "is a directory, not a file", _NPZ_KEYS]),
    # Host lists that name fewer tasks, or one port twice, than the user meant.
    ("worker_hosts_empty_entry", None,
     [_PS, "--worker_hosts=127.0.0.1:2223,,127.0.0.1:2224", "--job_name=worker",
      "--task_index=0"], {},
     ["--worker_hosts=127.0.0.1:2223,,127.0.0.1:2224", "entry 2 of 3 is empty",
      "separated by single commas"]),
    ("one_port_by_two_loopback_names", None,
     ["--ps_hosts=localhost:2222", "--worker_hosts=127.0.0.1:2222", "--job_name=ps",
      "--task_index=0"], {},
     ["127.0.0.1:2222 and localhost:2222 are the same host:port",
      "every task needs its own host:port"]),
    # Ports: checked after TensorFlow loads, before the server starts.
    ("port_in_use", _port_in_use,
     ["--ps_hosts=127.0.0.1:{port}", "--worker_hosts=127.0.0.1:{worker_port}", "--job_name=ps",
      "--task_index=0"], {},
     ["ps 0 cannot listen on port {port}", "127.0.0.1:{port}", "Address already in use",
      "give this task a free port"]),
)


# The cases that get past what is checked before TensorFlow loads: a TFRecord set's files (read
# with TensorFlow), a port (its server's), another model's checkpoints. Every other case runs
# with testutil.tensorflow_blocked, so that an import of TensorFlow fails it: a user's mistake
# there is one line in a blink, not after TensorFlow's seconds of start-up.
_AFTER_TENSORFLOW = frozenset({"tfrecord_without_train_files", "tfrecord_negative_id",
                               "port_in_use", "log_dir_of_another_model"})


def _user_env(extra):
  """The environment of a user's shell: the checkout importable, no test-only settings.

  testutil.trainer_env() pins TF_CPP_MIN_LOG_LEVEL for the cluster tests; a user has no such
  setting, so the trainer's own default applies here. PS_TRAINER_TRACEBACK would show tracebacks.
  """
  env = testutil.trainer_env()
  for name in ("TF_CPP_MIN_LOG_LEVEL", "PS_TRAINER_TRACEBACK"):
    env.pop(name, None)
  env.update(extra)
  return env


class BadInputTest(parameterized.TestCase):
  """Each bad input: exit 2, no traceback, one `ps_trainer: error:` line with its key words."""

  def _run(self, argv, env, cwd):
    """Runs `python -m ps_trainer argv`; returns (code, stdout, stderr, secs). Fails on a hang."""
    args = [testutil.PYTHON, "-m", "ps_trainer", *argv]
    start = time.monotonic()
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
      stdout, stderr = proc.communicate(timeout=_TIMEOUT_SECS)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      stdout, stderr = proc.communicate()
      self.fail(f"still running after {_TIMEOUT_SECS} s (killed): {' '.join(args)}\n"
                f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}")
    return proc.returncode, stdout, stderr, time.monotonic() - start

  @parameterized.named_parameters(*((case[0],) + case for case in _CASES))
  def test_one_clear_line(self, name, setup, argv, extra_env, words):
    tmp = testutil.make_tempdir(self)
    values = {"tmp": tmp}
    if setup is not None:
      values.update(setup(self, tmp))
    argv = [a.format(**values) for a in argv]
    env = _user_env(extra_env)
    if name not in _AFTER_TENSORFLOW:
      env = testutil.tensorflow_blocked(self, env)
    code, stdout, stderr, secs = self._run(argv, env, cwd=tmp)
    where = (f"\ncommand: python -m ps_trainer {' '.join(argv)}  env: {extra_env}  ({secs:.1f} s)"
             f"\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}")
    self.assertNotIn("Traceback", stdout + stderr, where)
    self.assertNotEqual(code, testutil.TENSORFLOW_IMPORTED,
                        f"TensorFlow loaded before the error{where}")
    self.assertEqual(code, 2, f"exit status {code}, expected 2 (a user error){where}")
    self.assertEqual(stdout, "", f"expected nothing on stdout{where}")
    lines = stderr.splitlines()
    self.assertLen(lines, 1, f"expected exactly one line on stderr{where}")
    line = lines[0]
    self.assertTrue(line.startswith(_PREFIX), f"the line does not start with {_PREFIX!r}{where}")
    for word in words:
      self.assertIn(word.format(**values), line, where)
    # A local run that failed leaves no empty runs/local-<time> behind.
    self.assertFalse(os.path.exists(os.path.join(tmp, "runs")), where)

  def test_a_corrupt_record_met_while_training_is_named(self):
    # Past the records checked at start-up: found by the pipeline, then
    # named by a scan of the files (TF's own message names no file).
    tmp = testutil.make_tempdir(self)
    _click_dir(self, tmp)
    from ps_trainer import record_checks  # pylint: disable=g-import-not-at-top
    path = os.path.join(tmp, "clicks", "train-00001-of-00002.tfrecord")
    with open(path, "rb") as f:
      raw = bytearray(f.read())
    at = 0
    for _ in range(150):  # Skip 150 records: length (8), CRC (4), payload, CRC (4).
      at += 16 + int.from_bytes(raw[at:at + 8], "little")
    raw[at + 15] ^= 0xFF  # A payload byte of record 150.
    with open(path, "wb") as f:
      f.write(bytes(raw))
    record_checks.inspect(os.path.join(tmp, "clicks"))  # Start-up sees only 100: no error.
    argv = ["--model=wide_deep", "--dataset=tfrecord", f"--data_dir={tmp}/clicks",
            "--vocab_size=100", "--train_steps=20", f"--log_dir={tmp}/run"]
    code, stdout, stderr, secs = self._run(argv, _user_env({}), cwd=tmp)
    where = f"\n({secs:.1f} s)\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}"
    self.assertNotIn("Traceback", stdout + stderr, where)
    self.assertEqual(code, 2, where)
    lines = stderr.splitlines()
    self.assertLen(lines, 1, where)
    self.assertTrue(lines[0].startswith(_PREFIX), where)
    self.assertIn(path, lines[0], where)
    self.assertIn("record 150", lines[0], where)

  def test_a_full_log_dir_is_named_a_full_disk_not_a_large_model(self):
    # TF reports "No space left on device" as ResourceExhaustedError, its out-of-memory error.
    tmp = testutil.make_tempdir(self)
    full = os.path.join(tmp, "full")
    os.makedirs(full)
    argv = [testutil.PYTHON, "-m", "ps_trainer", "--dataset=synthetic", _SHORT,
            f"--log_dir={full}/run"]
    # A 96 KiB file system of its own, in a mount namespace of its own; exit 99: none here.
    script = f"mount -t tmpfs -o size=96k tmpfs {full} || exit 99; exec {' '.join(argv)}"
    try:
      probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True,
                             timeout=30, check=False)
    except FileNotFoundError:
      self.skipTest("no unshare here")
    if probe.returncode != 0:  # Not root, or a sandbox (Bazel's) that allows no namespace.
      self.skipTest(f"no mount namespace here: {probe.stderr.strip()}")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=tmp,
                          env=_user_env({}), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=_TIMEOUT_SECS, check=False)
    if proc.returncode == 99:
      self.skipTest(f"cannot mount a small file system here: {proc.stderr.strip()}")
    where = f"\n--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}"
    self.assertNotIn("Traceback", proc.stdout + proc.stderr, where)
    self.assertEqual(proc.returncode, 1, where)
    last = proc.stderr.splitlines()[-1]
    self.assertTrue(last.startswith(_PREFIX + "a file system is full ("), where)
    self.assertIn("No space left on device", last, where)
    self.assertIn("run the same command again", last, where)

  def _python_write_fails(self, error: str):
    """Runs a short local job whose result.json write raises OSError(`error`).

    Returns:
      (stderr's last line, the log dir).
    """
    tmp = testutil.make_tempdir(self)
    script = (
        "import errno, os, runpy, sys\n"
        "from ps_trainer import output_dir\n"
        "def fails(path, value):\n"
        f"  raise OSError(errno.{error}, os.strerror(errno.{error}), path)\n"
        "output_dir.write_json = fails\n"
        f"sys.argv = ['ps_trainer', '--dataset=synthetic', '{_SHORT}', '--log_dir={tmp}/run']\n"
        "runpy.run_module('ps_trainer', run_name='__main__')\n")
    proc = subprocess.run([testutil.PYTHON, "-c", script], cwd=tmp, env=_user_env({}),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=_TIMEOUT_SECS, check=False)
    where = f"\n--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}"
    self.assertNotIn("Traceback", proc.stdout + proc.stderr, where)
    self.assertEqual(proc.returncode, 1, where)
    return proc.stderr.splitlines()[-1], f"{tmp}/run"

  def test_a_full_disk_met_by_a_python_write_is_the_same_one_line(self):
    # result.json is written by Python, whose full disk is an OSError, not TF's error.
    last, log_dir = self._python_write_fails("ENOSPC")
    self.assertEqual(last, (
        f"{_PREFIX}a file system is full (No space left on device: {log_dir}/result.json); "
        "free space there (--log_dir holds the checkpoints, summaries and export) and run the "
        "same command again: it continues from the newest checkpoint"))

  def test_any_other_failed_python_write_is_one_line_naming_the_file(self):
    last, log_dir = self._python_write_fails("EIO")
    self.assertEqual(last, (
        f"{_PREFIX}the run stopped on a file error: {log_dir}/result.json: Input/output "
        "error (PS_TRAINER_TRACEBACK=1 shows the traceback)"))


if __name__ == "__main__":
  absltest.main()
