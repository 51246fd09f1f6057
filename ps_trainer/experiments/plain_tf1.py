"""The plain TF1 parameter-server pattern: the baseline `./launch.sh bench` beats.

What TF's old distributed-training tutorial taught and most TF1 PS code still
does: numpy batches through feed_dict, replica_device_setter's round-robin
placement, MonitoredTrainingSession, a PS that only serves. It trains
the bench's reference work (an MLP on MNIST-shaped synthetic data) so that
ps_trainer's steps/s can be compared with it on the same cluster and work.
It is a yardstick, not a trainer: its PS serves until it is stopped (the bench
stops it) or the process that started it is gone, and it has none of
ps_trainer's checks.

  python -m ps_trainer.experiments.plain_tf1 --ps_hosts=... --worker_hosts=...
      --job_name=ps|worker --task_index=N --log_dir=DIR [--train_steps=...]
      [--started_by=PID]

Worker 0 writes <log_dir>/result.json with `steps_per_sec`, measured after the
first 10% of steps as ps_trainer measures it.
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Who started this process, unless --started_by says: read before TensorFlow's
# import and the server's start (seconds), since a starter killed meanwhile
# would already have handed this process to another parent, and its PS would
# serve forever. Only a starter that names itself covers the interpreter's own
# start.
_PARENT_AT_START = os.getppid()

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import tensorflow as tf

from ps_trainer.datasets import synthetic
from ps_trainer.experiments import yardstick_result
from ps_trainer.training import hooks as hooks_lib

FLAGS = flags.FLAGS
flags.DEFINE_string("ps_hosts", "", "Comma-separated host:port of the PS tasks.")
flags.DEFINE_string("worker_hosts", "", "Comma-separated host:port of the workers.")
flags.DEFINE_string("job_name", "", "ps | worker; empty: one local process.")
flags.DEFINE_integer("task_index", 0, "Index within the job.")
flags.DEFINE_string("hidden_units", "256,256", "MLP hidden layer sizes.")
flags.DEFINE_integer("batch_size", 64, "Examples per step.")
flags.DEFINE_float("learning_rate", 0.01, "Plain SGD's learning rate.")
flags.DEFINE_integer("train_steps", 3000, "Global steps to train.")
if "log_dir" in FLAGS:  # absl.logging's own --log_dir (unused) would clash.
  delattr(FLAGS, "log_dir")
flags.DEFINE_string("log_dir", "", "Where worker 0 writes result.json.")
flags.DEFINE_integer("started_by", 0,
                     "The PID of the process that starts this one, its parent "
                     "(the bench passes its own): the PS ends once it is gone. "
                     "0: the parent this process finds as it starts.")

_EXAMPLES = 8192  # Fed in order, batch after batch, as tutorials slice arrays.


def _mlp(features, hidden_units):
  net = tf.reshape(features, [-1, 784])
  sizes = [784] + hidden_units + [10]
  for i, (fan_in, units) in enumerate(zip(sizes, sizes[1:])):
    kernel = tf.compat.v1.get_variable(
        f"kernel{i}", [fan_in, units],
        initializer=tf.compat.v1.glorot_uniform_initializer())
    bias = tf.compat.v1.get_variable(
        f"bias{i}", [units], initializer=tf.compat.v1.zeros_initializer())
    net = tf.linalg.matmul(net, kernel) + bias
    if i < len(hidden_units):
      net = tf.nn.relu(net)
  return net


class _FinalGlobalStep(tf.compat.v1.train.SessionRunHook):
  """Reads the global step once the loop has ended. The step's own fetch of
  it races the increment (the pattern's `run([train_op, global_step])` often
  returns the value from before the update), so the last one fetched can be
  one short."""

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()
    self.value = None

  def end(self, session):
    self.value = int(session.run(self._global_step))


def serve_while_parent_lives(starter: int, program: str = "plain_tf1"):
  """The pattern's PS calls server.join() and never ends. This one serves as
  long, but also ends once the process that started it (`starter`, its parent)
  is gone: a bench killed with SIGKILL cannot stop it, and it would serve
  nobody forever. The step never sees the difference (the server runs on its
  own threads)."""
  while os.getppid() == starter:
    time.sleep(0.5)
  print(f"{program}: ps {FLAGS.task_index}: the process that started it "
        f"(pid {starter}) is gone; ending", flush=True)
  # Exit at once: tearing the server down may block on its threads.
  os._exit(0)  # pylint: disable=protected-access


def main(unused_argv):
  tf.compat.v1.disable_eager_execution()
  hidden_units = [int(u) for u in FLAGS.hidden_units.split(",")]
  target, device_fn, is_chief = "", None, True
  if FLAGS.job_name:
    cluster = tf.train.ClusterSpec({"ps": FLAGS.ps_hosts.split(","),
                                    "worker": FLAGS.worker_hosts.split(",")})
    server = tf.distribute.Server(cluster, job_name=FLAGS.job_name,
                                  task_index=FLAGS.task_index)
    if FLAGS.job_name == "ps":
      serve_while_parent_lives(FLAGS.started_by or _PARENT_AT_START)
    target = server.target
    is_chief = FLAGS.task_index == 0
    device_fn = tf.compat.v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{FLAGS.task_index}", cluster=cluster)
  x_train, y_train = synthetic.arrays(_EXAMPLES, seed=FLAGS.task_index)
  with tf.compat.v1.device(device_fn):
    features = tf.compat.v1.placeholder(tf.float32, [None, 28, 28, 1])
    labels = tf.compat.v1.placeholder(tf.int64, [None])
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=_mlp(features, hidden_units)))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(
        FLAGS.learning_rate).minimize(loss, global_step=global_step)
  final_step = _FinalGlobalStep()
  hooks = [tf.compat.v1.train.StopAtStepHook(last_step=FLAGS.train_steps),
           final_step]
  throughput = hooks_lib.Throughput(FLAGS.train_steps)  # As the trainer times it.
  with tf.compat.v1.train.MonitoredTrainingSession(
      master=target, is_chief=is_chief, hooks=hooks,
      save_checkpoint_secs=None, save_summaries_steps=None,
      log_step_count_steps=None) as session:
    batch = 0
    while not session.should_stop():
      start = batch * FLAGS.batch_size % (_EXAMPLES - FLAGS.batch_size)
      _, step = session.run([train_op, global_step], feed_dict={
          features: x_train[start:start + FLAGS.batch_size],
          labels: y_train[start:start + FLAGS.batch_size]})
      throughput.observe(int(step))
      batch += 1
  if is_chief and FLAGS.log_dir:
    yardstick_result.write(FLAGS.log_dir, "plain_tf1", throughput,
                           FLAGS.batch_size, global_step=final_step.value)


if __name__ == "__main__":
  app.run(main)
