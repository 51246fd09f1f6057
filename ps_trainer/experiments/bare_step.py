"""The bare step: ps_trainer's own training step with nothing around it.

What TensorFlow's distributed runtime alone lets 1 PS + 1 worker reach on this
machine, for the bench to set the trainer's speed against. It builds the step
from the trainer's own parts, on the trainer's cluster settings (cores, threads,
device filters, placement): the MLP of models/networks.py, the packed reads
and packed, factored gradients of packing.py, plain SGD on the PS. It leaves out everything
a real run needs around that step: the input pipeline (one constant batch, drawn
once), MonitoredSession and its hooks, the NaN check, the run signature and
done flags, checkpoints. So its step is a floor for the trainer's: what the
trainer's step costs beyond it is its own (input, hooks, checks); what is left
below it is TF's runtime and the model.

Without --job_name it runs the trainer's local step the same way, in one
process: the bench's like-for-like ratio of the two is what 1 PS + 1 worker
costs this step (TF's runtime, and one core per task where local mode's ops
use both), with nothing around it on either side.

  python -m ps_trainer.experiments.bare_step [--ps_hosts=... --worker_hosts=...
      --job_name=ps|worker --task_index=0] --log_dir=DIR [--train_steps=...]
      [--started_by=PID]

It takes plain_tf1.py's flags and PS lifecycle (a yardstick's PS serves until
its starter stops it or is gone), and worker 0 writes the same result.json.
Its step is the trainer's with the trainer's defaults: float32 on the wire,
factored gradients, plain SGD; for one worker (it counts its own steps).
"""

import os

# Who started this process, read before TensorFlow loads (plain_tf1.py: why).
_PARENT_AT_START = os.getppid()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # As plain_tf1's logs.

import functools  # pylint: disable=g-import-not-at-top,g-bad-import-order
from typing import Optional, Tuple  # pylint: disable=g-import-not-at-top

from absl import app  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from ps_trainer import models
from ps_trainer.cluster import host_cores
from ps_trainer.cluster import server as server_lib
from ps_trainer.datasets import synthetic
from ps_trainer.experiments import yardstick_result
from ps_trainer.graph import packing
from ps_trainer.graph import placement
from ps_trainer.settings import cluster as cluster_lib
from ps_trainer.training import hooks


def build_step(info: Optional[cluster_lib.ClusterInfo], hidden_units,
               batch_size: int, learning_rate: float
               ) -> Tuple[tf.Operation, tf.Tensor]:
  """The trainer's step for the reference MLP in the default graph: packed
  reads from the PS, the model on one constant batch, packed (factored)
  gradients, the SGD apply and the global step's increment on the PS. With no
  `info`, its local step: the same model and SGD, every op in this process and
  nothing packed (train_graph.py packs only for a cluster).
  Returns the train op and the loss."""
  features, labels = synthetic.arrays(batch_size,
                                      seed=info.task_index if info else 0)
  # Its learning rate is made in apply_gradients, so in the cluster it lands
  # on the PS with the apply, as the trainer's does (train_graph._update).
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
  if info is None:
    global_step = tf.compat.v1.train.get_or_create_global_step()
    loss, _ = models.loss_and_accuracy(
        _logits(tf.constant(features), hidden_units), tf.constant(labels))
    return optimizer.minimize(loss, global_step=global_step), loss
  with tf.compat.v1.device(placement.device_function(info)):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    features, labels = tf.constant(features), tf.constant(labels)
    _logits(features, hidden_units)  # The variables, which the reads need.
    trainable = tf.compat.v1.trainable_variables()
    reads = packing.PackedReads(trainable, tf.float32, global_step)
    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                     custom_getter=reads.variable_getter()):
      loss, _ = models.loss_and_accuracy(_logits(features, hidden_units),
                                         labels)
    grads_and_vars = packing.pack_gradients(
        packing.gradients(loss, trainable, reads), tf.float32, factored=True)
    with tf.device(global_step.device):
      train_op = optimizer.apply_gradients(grads_and_vars,
                                           global_step=global_step)
  return train_op, loss


def _logits(features: tf.Tensor, hidden_units) -> tf.Tensor:
  return models.build_logits("mlp", features, synthetic.SHAPE,
                             synthetic.CLASSES, tuple(hidden_units))


def main(plain_tf1, unused_argv):
  """The bare step's task; `plain_tf1` is that module, whose flags it takes."""
  FLAGS = plain_tf1.FLAGS  # pylint: disable=invalid-name
  tf.compat.v1.disable_eager_execution()
  # Local as the trainer's local mode is: no pinning and TF's own session
  # settings (main.py pins only a cluster's tasks; trainer.py's config is None).
  info, target, config = None, "", None
  if FLAGS.job_name:
    info = cluster_lib.from_flags(FLAGS.ps_hosts, FLAGS.worker_hosts,
                                  FLAGS.job_name, FLAGS.task_index)
    host_cores.pin_task(info)  # Every thread so far; the server's inherit it.
    server = server_lib.start_server(info, warn_if_exposed=False)
    if info.is_ps:
      plain_tf1.serve_while_parent_lives(FLAGS.started_by or _PARENT_AT_START,
                                         program="bare_step")
    target, config = server.target, server_lib.session_config(info)
  train_op, _ = build_step(info, [int(u) for u in FLAGS.hidden_units.split(",")],
                        FLAGS.batch_size, FLAGS.learning_rate)
  # One worker, so its own count is the global step.
  throughput = hooks.Throughput(FLAGS.train_steps)
  with tf.compat.v1.Session(target, config=config) as session:
    session.run(tf.compat.v1.global_variables_initializer())
    step = session.make_callable(train_op)
    for count in range(1, FLAGS.train_steps + 1):
      step()
      throughput.observe(count)
    global_step = int(session.run(tf.compat.v1.train.get_global_step()))
  if FLAGS.log_dir and FLAGS.task_index == 0:
    yardstick_result.write(FLAGS.log_dir, "bare_step", throughput,
                           FLAGS.batch_size, global_step=global_step)


def run():
  """The program. plain_tf1's flags are defined here, not when build_step is
  imported: a process that also loads the trainer's flags (a test's) would
  otherwise define --ps_hosts twice."""
  from ps_trainer.experiments import plain_tf1  # pylint: disable=g-import-not-at-top
  app.run(functools.partial(main, plain_tf1))


if __name__ == "__main__":
  run()
