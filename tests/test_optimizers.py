"""PerPsAdam: TF's Adam numbers and names, with less traffic between PS tasks."""

import functools

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from ps_trainer.datasets import data
from ps_trainer.graph import optimizers
from ps_trainer.graph import train_graph

from inprocess_cluster import InProcessCluster
import testutil

tf.compat.v1.disable_eager_execution()

NUM_PS = 3


def _ps(i):
  return f"/job:ps/task:{i}"


@functools.lru_cache(maxsize=None)
def _target():
  """Worker 0's target on a cluster of NUM_PS PS and 1 worker, started once:
  each test builds its variables under a scope of its own."""
  return InProcessCluster(num_ps=NUM_PS, num_workers=1).targets[0]


def _model(optimizer, scope):
  """Dense variables on PS 0 and 1 and a table on PS 2 (a sparse update),
  with fixed values; returns the train op and the model's variables."""
  with tf.compat.v1.variable_scope(scope):
    with tf.device(_ps(0)):
      w = tf.compat.v1.get_variable(
          "w", initializer=np.linspace(-1, 1, 12, dtype=np.float32)
          .reshape(4, 3))
    with tf.device(_ps(1)):
      b = tf.compat.v1.get_variable(
          "b", initializer=np.array([0.1, -0.2, 0.3], np.float32))
    with tf.device(_ps(2)):
      table = tf.compat.v1.get_variable(
          "table", initializer=np.linspace(0, 2, 20, dtype=np.float32)
          .reshape(5, 4))
    with tf.device("/job:worker/task:0"):
      rows = tf.gather(table, [0, 3, 3, 1])  # Its gradient is sparse.
      logits = tf.matmul(rows, w) + b
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=[0, 1, 2, 1], logits=logits))
  # Adam's two scalars go beside the first variable by name: b, on PS 1.
  return optimizer.minimize(loss), [w, b, table]


def _recvs_between_ps(session, fetches) -> int:
  """Tensors one PS receives from another in a step that runs fetches,
  counted in the partition graphs TF runs."""
  metadata = tf.compat.v1.RunMetadata()
  session.run(fetches,
              options=tf.compat.v1.RunOptions(output_partition_graphs=True),
              run_metadata=metadata)
  return sum(1 for graph in metadata.partition_graphs for node in graph.node
             if node.op == "_Recv" and b"/job:ps/" in node.attr["send_device"].s
             and b"/job:ps/" in node.attr["recv_device"].s)


class PerPsAdamTest(absltest.TestCase):

  def test_the_same_numbers_as_tfs_adam_across_ps(self):
    target = _target()
    graph = tf.Graph()
    with graph.as_default():
      ours, our_vars = _model(optimizers.PerPsAdam(0.1), "ours")
      tfs, tf_vars = _model(tf.compat.v1.train.AdamOptimizer(0.1), "tfs")
      with tf.compat.v1.Session(target) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
          session.run([ours, tfs])
        ours_now, tfs_now = session.run([our_vars, tf_vars])
    for mine, theirs in zip(ours_now, tfs_now):
      np.testing.assert_array_equal(mine, theirs)
    # Moved, not left alone: every variable, the table's rows too.
    self.assertFalse(np.allclose(ours_now[0], np.linspace(-1, 1, 12)
                                 .reshape(4, 3)))
    self.assertFalse(np.allclose(ours_now[2][0], np.linspace(0, 2, 20)[:4]))

  def test_dense_and_sparse_updates_share_one_read_per_ps(self):
    # PS 0 (dense w) and PS 2 (the table, a sparse update) each receive the
    # scalars once and send back one token; TF's Adam sends the scalars to
    # each as two tensors (6 in all).
    with tf.Graph().as_default():
      train, _ = _model(optimizers.PerPsAdam(0.1), "shared_reads")
      with tf.compat.v1.Session(_target()) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        self.assertEqual(_recvs_between_ps(session, train), 2 * (NUM_PS - 1))

  def test_one_optimizer_builds_updates_in_two_graphs(self):
    optimizer = optimizers.PerPsAdam(0.1)
    for _ in range(2):
      with tf.Graph().as_default():
        x = tf.compat.v1.get_variable("x", initializer=[1.0, 2.0])
        optimizer.minimize(tf.reduce_sum(x * x))

  def test_checkpoints_name_the_same_variables_as_tfs_adam(self):
    names = []
    for optimizer in (optimizers.PerPsAdam, tf.compat.v1.train.AdamOptimizer):
      with tf.Graph().as_default():
        _model(optimizer(0.1), "model")
        names.append(sorted(v.op.name
                            for v in tf.compat.v1.global_variables()))
    self.assertEqual(names[0], names[1])
    self.assertIn("beta1_power", names[0])
    self.assertIn("model/table/Adam_1", names[0])
    self.assertLen(names[0], 11)

  def test_the_trainers_step_crosses_between_ps_once_per_ps(self):
    """In the trainer's graph of a 12-variable MLP on 3 PS, one step moves 5
    tensors between PS tasks: each PS without Adam's scalars receives them
    once and sends back the token that orders their update, and one token
    reaches the global step. TF's own Adam moves 15: the scalars twice for
    each of the 6 variables on other PS."""
    target = _target()
    cfg = testutil.planned_config(
        "--model=mlp", "--hidden_units=16,16,16,16,16", "--dataset=synthetic",
        "--optimizer=adam", num_ps=NUM_PS, num_workers=1)
    tg = train_graph.build_graph(cfg, data.load("synthetic"))
    self.assertLen(tg.graph.get_collection("trainable_variables"), 12)
    with tg.graph.as_default(), tf.compat.v1.Session(target) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(tg.train_input.initializer)
      recvs = _recvs_between_ps(
          session, [tg.train_op, tg.loss, tg.global_step_read])
    self.assertEqual(recvs, 2 * (NUM_PS - 1) + 1)


if __name__ == "__main__":
  absltest.main()
