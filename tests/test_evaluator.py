"""The evaluator task in this process: checkpoints scored, eval.json, summaries, exit.

Training runs in local mode (same graph, no servers) and writes checkpoints
into a log dir; the evaluator reads them as it would from a cluster's chief.
"""

import glob
import json
import os
import signal
import threading

from absl.testing import absltest
import tensorflow as tf

from ps_trainer.cluster import waits
from ps_trainer.datasets import data
from ps_trainer.faults import stops
from ps_trainer.training import evaluator
from ps_trainer.training import trainer
import testutil

tf.compat.v1.disable_eager_execution()

_DIGITS = data.load("digits")


class EvaluatorTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.log_dir = testutil.make_tempdir(self)

  def train(self, steps):
    cfg = testutil.make_config(
        f"--log_dir={self.log_dir}", "--log_every_steps=10000",
        "--save_checkpoints_steps=100", f"--train_steps={steps}")
    return trainer.train(cfg, _DIGITS)

  def evaluator_config(self, steps, *argv):
    # Flags as every task of a 1 PS + 1 worker job gets them, plus the role.
    return testutil.make_config(
        "--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223",
        "--job_name=evaluator", "--task_index=0", f"--log_dir={self.log_dir}",
        f"--train_steps={steps}", *argv)

  def evaluate(self, steps, *argv):
    evaluator.run(self.evaluator_config(steps, *argv), _DIGITS,
                  stops.StopRequest("evaluator"), poll_secs=0.05)
    return evaluator.read_scores(self.log_dir)

  def test_scores_the_final_checkpoint_as_the_chief_did_and_exits(self):
    result = self.train(300)
    scores = self.evaluate(300)
    self.assertEqual([s["global_step"] for s in scores], [300])
    self.assertEqual(scores[0]["checkpoint"], "model.ckpt-300")
    self.assertAlmostEqual(scores[0]["accuracy"], result["accuracy"], places=6)
    self.assertAlmostEqual(scores[0]["loss"], result["loss"], places=5)
    # TensorBoard finds the same figures under <log_dir>/eval/.
    values = {}
    for path in glob.glob(os.path.join(self.log_dir, "eval", "events.*")):
      for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
          values[(event.step, value.tag)] = value.simple_value
    self.assertAlmostEqual(values[(300, "accuracy")], result["accuracy"],
                           places=6)
    self.assertIn((300, "loss"), values)

  def test_follows_a_run_and_a_restart_scores_nothing_twice(self):
    self.train(100)
    thread = threading.Thread(target=self.evaluate, args=(300,), daemon=True)
    thread.start()
    # Wait for its score of step 100 before training on, so it sees both.
    waits.wait_until(
        lambda: any(s["global_step"] == 100
                    for s in evaluator.read_scores(self.log_dir)),
        "the evaluator's first score", timeout_secs=60, poll_secs=0.05)
    self.assertTrue(thread.is_alive(), "the evaluator exited before step 300")
    self.train(300)
    thread.join(timeout=60)
    self.assertFalse(thread.is_alive(), "the evaluator did not exit")
    steps = [s["global_step"] for s in evaluator.read_scores(self.log_dir)]
    self.assertEqual(steps[0], 100)
    self.assertEqual(steps[-1], 300)
    self.assertEqual(steps, sorted(set(steps)))
    # Restarted on a finished run: nothing new to score, so it just exits.
    self.assertEqual(self.evaluate(300), evaluator.read_scores(self.log_dir))
    self.assertEqual(
        [s["global_step"] for s in evaluator.read_scores(self.log_dir)], steps)

  def test_a_longer_run_in_the_same_log_dir_is_followed_to_its_end(self):
    self.train(100)
    self.evaluate(100)
    self.train(200)
    steps = [s["global_step"] for s in self.evaluate(200)]
    self.assertEqual(steps, [100, 200])

  def test_scores_edited_into_other_shapes_are_dropped_not_a_crash(self):
    kept = {"global_step": 100, "loss": 0.5, "accuracy": 0.8}
    with open(os.path.join(self.log_dir, evaluator.EVAL_JSON), "w") as f:
      f.write(f'[1, {{}}, {{"global_step": "100"}}, {json.dumps(kept)}]')
    self.assertEqual(evaluator.read_scores(self.log_dir), [kept])

  def test_checkpoints_of_another_model_stop_it_in_one_line(self):
    self.train(100)  # mlp 128,64 (the default)
    with self.assertRaisesRegex(
        evaluator.EvaluatorError,
        r"^the checkpoint .*model\.ckpt-100 does not hold this model "
        r"\(model/hidden0/kernel is \[64, 128\] there, \[64, 32\] here\); "
        r"start the evaluator with the training flags of the job$"):
      self.evaluate(100, "--hidden_units=32")
    self.assertEqual(evaluator.read_scores(self.log_dir), [])
    # Also once every checkpoint was scored: it used to exit 0 then, unchecked.
    scores = self.evaluate(100)
    with self.assertRaisesRegex(evaluator.EvaluatorError, r"does not hold this model"):
      self.evaluate(100, "--hidden_units=32")
    self.assertEqual(evaluator.read_scores(self.log_dir), scores)

  def test_gives_up_when_no_checkpoint_comes(self):
    with self.assertRaisesRegex(
        waits.WaitTimeout,
        rf"gave up after 1 s waiting for a new checkpoint in {self.log_dir}"):
      # Checkpoints by steps: no seconds interval stretches the bound.
      self.evaluate(300, "--wait_timeout_secs=1", "--save_checkpoints_steps=100")
    self.assertEqual(evaluator.read_scores(self.log_dir), [])

  def test_the_bound_covers_three_checkpoint_intervals(self):
    with self.assertRaisesRegex(waits.WaitTimeout, r"^gave up after 3 s waiting"):
      self.evaluate(300, "--wait_timeout_secs=1", "--save_checkpoints_secs=1")

  def test_a_stop_request_ends_the_wait(self):
    stop = stops.StopRequest("evaluator")
    stop.request(signal.SIGTERM)
    self.addCleanup(stop.ended)  # Else its grace period ends this process.
    with self.assertRaises(waits.Stopped):
      evaluator.run(self.evaluator_config(300), _DIGITS, stop, poll_secs=0.05)


if __name__ == "__main__":
  absltest.main()
