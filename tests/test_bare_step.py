"""The bench's bare step is the trainer's step: the same bytes each way, the
same placement, and an update that trains (graph-mode, no servers)."""

import json
import os
import subprocess
import sys

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from ps_trainer.experiments import bare_step
from ps_trainer.experiments import runs
from ps_trainer.experiments import yardstick_result
from ps_trainer.graph import packing
from ps_trainer.settings import cluster as cluster_lib
from ps_trainer.training import hooks
import testutil

tf.compat.v1.disable_eager_execution()


def _worker() -> cluster_lib.ClusterInfo:
  return cluster_lib.from_flags("127.0.0.1:2222", "127.0.0.1:2223", "worker", 0)


class BareStepTest(absltest.TestCase):

  def test_it_moves_what_the_trainers_step_moves(self):
    graph = tf.Graph()
    with graph.as_default():
      bare_step.build_step(_worker(), [256, 256], batch_size=64, learning_rate=0.01)
      (read,) = tf.compat.v1.get_collection(packing.READ_PACKS)
      (gradients,) = tf.compat.v1.get_collection(packing.GRADIENT_PACKS)
      variables = tf.compat.v1.global_variables()
    # The reference MLP's bytes as the bench's trace of the trainer counts them (and `./launch.sh
    # plan`): its variables and the global step in one tensor, the kernels' gradients as factors.
    self.assertEqual(read.shape.num_elements() * read.dtype.size, 1_077_376)
    self.assertEqual(gradients.shape.num_elements() * gradients.dtype.size, 409_664)
    self.assertEqual({v.device for v in variables}, {"/job:ps/task:0"})
    self.assertEqual(read.device, "/job:ps/task:0")
    self.assertEqual(gradients.device, "/job:worker/task:0")

  def _train(self, info, steps=30):
    """(first loss, last loss, global step) of `steps` bare steps in one process; a cluster's
    graph (`info` a task's) runs here with its devices cleared."""
    graph = tf.Graph()
    with graph.as_default():
      train_op, loss = bare_step.build_step(info, [32], batch_size=16, learning_rate=0.1)
      for op in graph.get_operations():
        op._set_device("")  # pylint: disable=protected-access
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        first = session.run(loss)
        for _ in range(steps):
          session.run(train_op)
        last, step = session.run([loss, tf.compat.v1.train.get_global_step()])
    return first, last, step

  def test_its_steps_lower_the_loss_on_its_batch(self):
    first, last, step = self._train(_worker())
    self.assertLess(last, 0.5 * first)
    self.assertEqual(step, 30)
    self.assertTrue(np.isfinite(last))

  def test_its_local_step_trains_the_same_model_unpacked(self):
    # The bench's bare local row: the trainer's local step, nothing packed, nothing placed.
    graph = tf.Graph()
    with graph.as_default():
      bare_step.build_step(None, [256, 256], batch_size=64, learning_rate=0.01)
      self.assertEmpty(tf.compat.v1.get_collection(packing.READ_PACKS))
      self.assertEmpty(tf.compat.v1.get_collection(packing.GRADIENT_PACKS))
      self.assertEqual({op.device for op in graph.get_operations()}, {""})
      self.assertEqual(sum(v.shape.num_elements() for v in tf.compat.v1.trainable_variables()),
                       784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10)
    first, last, step = self._train(None)
    self.assertLess(last, 0.5 * first)
    self.assertEqual(step, 30)

  def test_run_alone_it_writes_the_bench_its_speed(self):
    # The bench's bare local row, as the bench starts it: no --job_name, one process.
    log_dir = testutil.make_tempdir(self)
    done = subprocess.run(
        [sys.executable, "-m", "ps_trainer.experiments.bare_step", "--hidden_units=32",
         "--batch_size=16", "--train_steps=50", f"--log_dir={log_dir}"],
        env=testutil.trainer_env(), capture_output=True, text=True, timeout=120, check=False)
    self.assertEqual(done.returncode, 0, done.stderr[-2000:])
    with open(os.path.join(log_dir, "result.json")) as f:
      result = json.load(f)
    self.assertEqual((result["program"], result["global_step"]), ("bare_step", 50))
    self.assertGreater(result["steps_per_sec"], 0)
    self.assertAlmostEqual(result["examples_per_sec"], 16 * result["steps_per_sec"])
    self.assertGreater(result["measured_secs"], 0)

  def test_a_run_of_fewer_than_two_steps_has_no_speed(self):
    # Not 0 steps/s: the bench refuses such a run, as it does the trainer's, and says why.
    log_dir = testutil.make_tempdir(self)
    yardstick_result.write(log_dir, "bare_step", self._timed([(10.0, 1)], train_steps=1),
                           batch_size=64, global_step=1)
    with open(os.path.join(log_dir, "result.json")) as f:
      self.assertEqual(json.load(f), {"program": "bare_step", "steps_per_sec": None,
                                      "examples_per_sec": None, "measured_secs": None,
                                      "global_step": 1})
    with self.assertRaisesRegex(runs.RunFailed, "timed fewer than two steps"):
      runs._finish("bare step", log_dir, os.path.join(log_dir, "worker-0.log"), 0,  # pylint: disable=protected-access
                   started=0.0)
    # Two steps or more: 9 global steps in the 2 s after the first 10% of them.
    yardstick_result.write(log_dir, "bare_step",
                           self._timed([(0.0, 1), (1.0, 2), (3.0, 11)], train_steps=11),
                           batch_size=64, global_step=11)
    with open(os.path.join(log_dir, "result.json")) as f:
      result = json.load(f)
    self.assertEqual((result["steps_per_sec"], result["measured_secs"]), (4.5, 2.0))
    self.assertEqual(result["examples_per_sec"], 64 * 4.5)

  @staticmethod
  def _timed(marks, train_steps: int) -> hooks.Throughput:
    """The trainer's Throughput, as a yardstick's loop feeds it: (time, global step) after each
    step."""
    clock = testutil.ManualClock()
    throughput = hooks.Throughput(train_steps, clock=clock)
    for clock.now, step in marks:
      throughput.observe(step)
    return throughput

  def test_importing_it_leaves_the_trainers_flags_free(self):
    # The plain pattern's flags share names with the trainer's (--ps_hosts...): a pytest worker
    # that imported this module and then the trainer's flags failed with DuplicateFlagError.
    code = ("import ps_trainer.experiments.bare_step\n"
            "from ps_trainer.settings import flags\n"
            "flags.define_flags()\n")
    done = subprocess.run([sys.executable, "-c", code], env=testutil.trainer_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    self.assertEqual(done.returncode, 0, done.stderr[-2000:])


if __name__ == "__main__":
  absltest.main()
