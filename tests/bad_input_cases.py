"""The catalogue of bad input that tests/test_bad_input.py runs `python -m ps_trainer` on.

Each case: (name, set-up or None, argv, extra environment, key words of its one error line).
A set-up, (test, tmp) -> values, writes what the case needs under tmp and returns the values of
its {placeholders}; argv and key words are str.format()ed with them and {tmp}.
"""

import fcntl
import os
import socket
import subprocess

import testutil

# A set-up that trains (run_of_another_model): ~4 s, bounded so a hang fails.
_SETUP_TIMEOUT_SECS = 120

# A small valid cluster: 1 PS + 2 workers (nothing listens: every case fails before connecting).
_PS = "--ps_hosts=127.0.0.1:2222"
_WORKERS = "--worker_hosts=127.0.0.1:2223,127.0.0.1:2224"
_WORKER_1 = [_PS, _WORKERS, "--job_name=worker", "--task_index=1"]
# For the cases that get past TensorFlow's start, in case a regression lets them train.
SHORT = "--train_steps=2"
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


def click_dir(test, tmp):
  """A small click data set in {tmp}/clicks: 2 train files of 200 records."""
  del test
  from ps_trainer.datasets import clicks  # pylint: disable=g-import-not-at-top
  clicks.write_click_set(os.path.join(tmp, "clicks"), num_train=400, num_test=50,
                         vocab=100, dense_dim=2, num_shards=2)
  return {}


def _click_dir_without_train(test, tmp):
  click_dir(test, tmp)
  for name in os.listdir(os.path.join(tmp, "clicks")):
    if name.startswith("train"):
      os.remove(os.path.join(tmp, "clicks", name))
  return {}


def _click_dir_with_negative_id(test, tmp):
  """{file}: a train file of {tmp}/clicks whose record 2 has the id -4."""
  click_dir(test, tmp)
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


def run_of_another_model(test, tmp):
  """{tmp}/run: checkpoints of a 2-step mlp 8,8 run (a real one: ~4 s)."""
  done = subprocess.run([testutil.PYTHON, "-m", "ps_trainer", "--hidden_units=8,8", SHORT,
                         f"--log_dir={tmp}/run"], env=testutil.trainer_env(), cwd=tmp,
                        capture_output=True, text=True, timeout=_SETUP_TIMEOUT_SECS)
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


# argv and key words are str.format()ed with the set-up's values and {tmp}; the environment is not.
CASES = (
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
    ("num_workers_without_a_cluster", None, ["--num_workers=2", "--sync_replicas"], {},
     ["--num_workers=2: no cluster to size", "this process would train alone",
      "./launch.sh local --num_workers=2 starts a cluster here"]),
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
    ("log_dir_under_a_file", _regular_file, ["--log_dir={tmp}/file/run", SHORT], {},
     ["--log_dir={tmp}/file/run", "cannot write there (Not a directory)",
      "a directory this user can create and write"]),
    ("log_dir_a_file", _regular_file, ["--log_dir={tmp}/file", SHORT], {},
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
    ("log_dir_in_use_by_another_chief", _claimed_log_dir, ["--log_dir={tmp}/run", SHORT], {},
     ["--log_dir={tmp}/run: a chief trains into it now (pid 4242 on otherhost)",
      "overwrite each other's checkpoints", "pass another --log_dir"]),
    ("log_dir_of_another_model", run_of_another_model,
     ["--hidden_units=8,4", SHORT, "--log_dir={tmp}/run"], {},
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
    ("mnist_data_dir_missing", None, ["--dataset=mnist", "--data_dir={tmp}/absent", SHORT], {},
     ["--data_dir={tmp}/absent", "no such directory", _MNIST_NEEDS]),
    ("npz_data_path_missing", None, ["--dataset=npz", "--data_path={tmp}/absent.npz", SHORT], {},
     ["--data_path={tmp}/absent.npz", "no such file", _NPZ_KEYS]),
    # numpy loads before TensorFlow now, outside its capture; its OpenBLAS writes to stderr on some
    # hosts (that it cannot tell the L2 cache size), and here when asked to name its core.
    ("npz_data_path_missing_with_blas_notes", None,
     ["--dataset=npz", "--data_path={tmp}/absent.npz", SHORT], {"OPENBLAS_VERBOSE": "2"},
     ["--data_path={tmp}/absent.npz", "no such file", _NPZ_KEYS]),
    ("idx_truncated", _mnist_truncated_images,
     ["--dataset=mnist", "--data_dir={tmp}/mnist", SHORT], {},
     ["{file}", "truncated", "header promises 6 images of 4x3 (72 bytes)", "holds 14 bytes"]),
    ("idx_bad_magic", _mnist_bad_magic, ["--dataset=mnist", "--data_dir={tmp}/mnist", SHORT], {},
     ["{file}", "wrong magic number 0x00000899", "expected 0x00000801, an IDX label file"]),
    ("npz_missing_key", _npz_missing_key, ["--dataset=npz", "--data_path={npz}", SHORT], {},
     ["--data_path={npz}", "missing key 'y_test'", _NPZ_KEYS]),
    ("npz_length_mismatch", _npz_length_mismatch,
     ["--dataset=npz", "--data_path={npz}", SHORT], {},
     ["--data_path={npz}", "x_train has 3 examples but y_train has 4",
      "each example needs exactly one label"]),
    ("wide_deep_on_images", None, ["--model=wide_deep"], {},
     ["--model=wide_deep needs click records with sparse ids", "--dataset=digits",
      "use --dataset=tfrecord --data_dir=DIR"]),
    ("tfrecord_without_train_files", _click_dir_without_train,
     ["--model=wide_deep", "--dataset=tfrecord", "--data_dir={tmp}/clicks", SHORT], {},
     ["--data_dir={tmp}/clicks", "train"]),
    # The served model drops negative ids (-1 pads its rows): training on them would not fail.
    ("tfrecord_negative_id", _click_dir_with_negative_id,
     ["--model=wide_deep", "--dataset=tfrecord", "--data_dir={tmp}/clicks", SHORT], {},
     ["{file}: record 2: ids[1] is -4; expected ids >= 0 (the served model drops negative ids) "
      "(--dataset=tfrecord)"]),
    # Past int32, TF wrapped the table size around: a traceback (or a silently smaller table).
    ("tfrecord_vocab_size_past_int32", click_dir,
     ["--model=wide_deep", "--dataset=tfrecord", "--data_dir={tmp}/clicks",
      "--vocab_size=300000000000", SHORT], {},
     ["--vocab_size=300000000000: must be between 1 and 2147483647"]),
    # The data set's file flag, unset: refused before TensorFlow loads, so `launch.sh local`,
    # bench and compare refuse it before they start any task.
    ("mnist_without_data_dir", None, ["--dataset=mnist", SHORT], {},
     ["--data_dir is not set", _MNIST_NEEDS, "train-images-idx3-ubyte[.gz]"]),
    ("tfrecord_without_data_dir", None, ["--model=wide_deep", "--dataset=tfrecord", SHORT], {},
     ["--data_dir is not set", "--dataset=tfrecord"]),
    ("npz_without_data_path", None, ["--dataset=npz", SHORT], {},
     ["--data_path is not set", _NPZ_KEYS]),
    # A data flag that the data set ignores: the run would train on something else and exit 0.
    ("data_path_without_dataset_npz", None, ["--data_path={tmp}/x.npz", SHORT], {},
     ["--data_path={tmp}/x.npz", "--dataset=digits does not read it", "only --dataset=npz"]),
    ("data_dir_with_dataset_npz", None,
     ["--dataset=npz", "--data_path={tmp}/x.npz", "--data_dir={tmp}", SHORT], {},
     ["--data_dir={tmp}", "--dataset=npz does not read it",
      "only --dataset=mnist or --dataset=tfrecord"]),
    ("npz_data_path_a_directory", None, ["--dataset=npz", "--data_path={tmp}", SHORT], {},
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


# The cases that get past what is checked before TensorFlow loads: a TFRecord set's records (read
# with TensorFlow), a port (its server's), another model's checkpoints. Every other case runs
# with testutil.tensorflow_blocked, so that an import of TensorFlow fails it: a user's mistake
# there is one line in a blink, not after TensorFlow's seconds of start-up.
AFTER_TENSORFLOW = frozenset({"tfrecord_negative_id", "port_in_use", "log_dir_of_another_model"})
