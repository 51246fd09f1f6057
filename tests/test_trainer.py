"""Training end to end in this process: local runs (result.json, checkpoints, sync alone, a stop
at the last step, traced steps, NaN), a stopped worker's last line, and a chief started again on
an in-process cluster, with the bound on the end of its run.

A run continued from its --log_dir: test_local_resume.py.
"""

import contextlib
import io
import json
import os
import re
import signal
import threading
import time
from unittest import mock

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from ps_trainer.cluster import ps_flags
from ps_trainer.datasets import data
from ps_trainer.faults import peers
from ps_trainer.faults import stops
from ps_trainer.faults import sync_end
from ps_trainer.training import sync
from ps_trainer.training import trainer

from inprocess_cluster import InProcessCluster
import local_runs
import testutil

tf.compat.v1.disable_eager_execution()

RESULT_KEYS = {"global_step", "loss", "accuracy", "examples_per_sec",
               "steps_per_sec", "wall_secs", "sync_replicas", "num_workers",
               "num_ps", "measured_from_step", "measured_secs"}


class LocalTrainingTest(local_runs.LocalRunTestCase):

  def test_digits_run_writes_result_json_and_checkpoint(self):
    result = self.train("--train_steps=150")
    with open(os.path.join(self.log_dir, "result.json")) as f:
      written = json.load(f)
    self.assertEqual(written, json.loads(json.dumps(result)))
    self.assertContainsSubset(RESULT_KEYS, written)
    self.assertEqual(written["global_step"], 150)
    self.assertGreater(written["accuracy"], 0.8)
    self.assertLess(written["loss"], 1.0)
    self.assertGreater(written["steps_per_sec"], 0)
    self.assertAlmostEqual(written["examples_per_sec"],
                           written["steps_per_sec"] * 64, places=3)
    self.assertEqual((written["num_workers"], written["num_ps"]), (1, 0))
    self.assertFalse(written["sync_replicas"])
    self.assertEqual(tf.train.latest_checkpoint(self.log_dir),
                     os.path.join(self.log_dir, "model.ckpt-150"))

  def test_sync_replicas_alone_trains_to_the_step(self):
    result = self.train("--train_steps=60", "--sync_replicas")
    self.assertTrue(result["sync_replicas"])
    self.assertEqual(result["replicas_to_aggregate"], 1)
    self.assertEqual(result["global_step"], 60)

  def test_a_sync_chief_stops_aggregating_before_its_final_checkpoint(self):
    """session.py ends the chief's own hooks before the checkpoint saver, so
    the sync hook's guard must be among them (test_sync_end.py tests what
    the guard does)."""
    cfg = testutil.planned_config(
        "--sync_replicas", "--replicas_to_aggregate=2",
        f"--log_dir={self.log_dir}", num_ps=1, num_workers=3)
    self.assertTrue(cfg.is_chief)
    tg = trainer.build(cfg, data.load(cfg.data.dataset))
    stop = stops.StopRequest(cfg.task_name)
    hooks = trainer._hooks(  # pylint: disable=protected-access
        cfg, tg, "", None, stop, peers.Peers(cfg, tg, "", None, stop))
    (sync_hook,) = [h for h in hooks.every_replica
                    if isinstance(h, sync.SyncReplicasHook)]
    (guard,) = [h for h in hooks.chief_only
                if isinstance(h, sync_end.FinalCheckpointGuard)]
    self.assertIs(guard.sync_hook, sync_hook)

  def test_a_stop_that_finds_the_run_at_its_last_step_leaves_it_finished(self):
    self.train("--train_steps=20")
    cfg = testutil.make_config(f"--log_dir={self.log_dir}", "--train_steps=20")
    stop = stops.StopRequest(cfg.task_name, grace_secs=600)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      stop.request(signal.SIGINT)
      self.addCleanup(stop.ended)
      result = trainer.train(cfg, data.load(cfg.data.dataset), stop=stop)
    # main exports it and exits 0; nothing is left for "the same command".
    self.assertEqual(result["global_step"], 20)
    self.assertNotIn("continues from it", output.getvalue())

  def test_the_speed_leaves_the_traced_steps_out_and_says_when_it_cannot(self):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
      result = self.train("--train_steps=80", "--trace_steps=5")
    # Traced: this worker's steps 21-25 (after 20), the trace written as the last one ends.
    # Steps are seen by the global step they read (0 first), so the window starts at the end of
    # the first step that read 25 or more past the first one seen, not at 10% of the run (8). In
    # one process nothing orders that read before the step's own increment, so a step may read
    # the value it makes: once, under Bazel, the window started at 26 (which step read late is
    # not known; in 3,000 steps under load here none did). Either way no traced step is in it.
    self.assertIn(result["measured_from_step"], (25, 26))
    self.assertGreater(result["measured_secs"], 0)
    # Under Bazel absl logs TF's notes to stderr too: only the trainer's own lines count.
    self.assertNotIn("ps_trainer: warning", stderr.getvalue())
    stderr = io.StringIO()
    for steps in (27, 26):
      short = testutil.make_config(f"--train_steps={steps}", "--trace_steps=5")
      with contextlib.redirect_stderr(stderr):
        self.assertEqual(trainer._traced_steps(short), 25)  # pylint: disable=protected-access
    # 27 leaves steps 26 and 27 after the 25 traced ones: a window. 26 leaves none.
    self.assertEqual(stderr.getvalue(), (
        "ps_trainer: warning: --trace_steps=5 traces about the first 25 global steps, and "
        "--train_steps=26 leaves none after them: steps_per_sec in result.json counts the "
        "slower traced steps; with --train_steps=250 or more it would not\n"))
    # Two sync workers make one global step together; two async ones, one each.
    hosts = ("--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2,127.0.0.1:3",
             "--job_name=worker", "--task_index=1", "--trace_steps=5", f"--log_dir={self.log_dir}")
    self.assertEqual(trainer._traced_steps(testutil.make_config(*hosts)), 50)  # pylint: disable=protected-access
    self.assertEqual(trainer._traced_steps(testutil.make_config(*hosts, "--sync_replicas")), 25)  # pylint: disable=protected-access

  def test_cnn_on_digits_learns(self):
    result = self.train("--train_steps=150", "--model=cnn")
    self.assertGreater(result["accuracy"], 0.5)
    self.assertEqual(result["test_examples"], 360)  # The digits' whole test split.

  def test_examples_per_global_step_counts_aggregated_replicas(self):
    async_cfg = testutil.make_config("--batch_size=32")
    self.assertEqual(trainer.examples_per_global_step(async_cfg), 32)
    sync_cfg = testutil.make_config(
        "--batch_size=32", "--sync_replicas", "--replicas_to_aggregate=2",
        "--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2,127.0.0.1:3",
        "--job_name=worker", "--task_index=1")
    self.assertEqual(trainer.examples_per_global_step(sync_cfg), 64)


class StoppedWorkerLineTest(absltest.TestCase):
  """A stopped worker's last line says where it stopped and what comes next."""

  def test_mid_run_the_same_command_rejoins_at_the_end_nothing_is_left(self):
    cfg = testutil.make_config("--train_steps=600")
    self.assertEqual(trainer._where_stopped(None, cfg),  # pylint: disable=protected-access
                     "; the same command rejoins the run")
    self.assertEqual(trainer._where_stopped(349, cfg),  # pylint: disable=protected-access
                     " at global step 349; the same command rejoins the run")
    # Its last step read 599 and made step 600: the run is over, there is nothing to rejoin.
    self.assertEqual(trainer._where_stopped(599, cfg),  # pylint: disable=protected-access
                     " at global step 600, the run's last; nothing is left to train")


class DivergenceTest(absltest.TestCase):
  """A NaN or Inf loss stops the run before it spoils the model or a checkpoint."""

  def test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(self):
    log_dir = testutil.make_tempdir(self)
    cfg = testutil.make_config(f"--log_dir={log_dir}", "--optimizer=sgd",
                               "--learning_rate=1e30", "--train_steps=500",
                               "--save_checkpoints_steps=1")
    with contextlib.redirect_stdout(io.StringIO()):
      with self.assertRaises(trainer.Diverged) as raised:
        trainer.train(cfg, data.load("digits"))
    newest = tf.train.latest_checkpoint(log_dir)
    self.assertIsNotNone(newest)
    self.assertRegex(
        str(raised.exception),
        r"^the training loss became NaN or Inf at global step \d+; training stopped before "
        r"that step changed any variable\. Lower --learning_rate \(now 1e\+30\); the last "
        rf"good checkpoint is {newest}$")
    self.assertFalse(os.path.exists(os.path.join(log_dir, "result.json")))
    # Every value in the newest checkpoint is a number: training can go on from it.
    reader = tf.train.load_checkpoint(newest)
    for name in reader.get_variable_to_shape_map():
      value = reader.get_tensor(name)
      if hasattr(value, "dtype") and value.dtype.kind == "f":
        self.assertTrue(np.isfinite(value).all(), name)


class ChiefRestartTest(absltest.TestCase):
  """A chief restarted while the PS kept running (in-process servers)."""

  def setUp(self):
    # A fresh cluster per test: servers cannot be stopped, and a PS that
    # already holds a model would change what the test sees.
    super().setUp()
    self.cluster = InProcessCluster(num_ps=1, num_workers=1)

  def train(self, log_dir, steps, stop=None):
    cfg = testutil.make_config(
        *self.cluster.host_flags(), "--job_name=worker", "--task_index=0",
        f"--log_dir={log_dir}", f"--train_steps={steps}",
        "--log_every_steps=1000")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      result = trainer.train(cfg, data.load("digits"),
                             self.cluster.targets[0], stop)
    return result, output.getvalue()

  def chief_flag(self) -> int:
    """The chief's done flag on PS 0."""
    return int(ps_flags.run_on_ps(
        self.cluster.targets[0], self.cluster.info("worker", 0), [0], 10,
        lambda: ps_flags.done_flags(0, 1)[0]))

  def test_it_tells_the_ps_whether_it_finished_the_run_or_was_stopped_before_its_end(self):
    # The PS keeps the model for a chief stopped before the end (ps_task.ChiefKeep).
    log_dir = testutil.make_tempdir(self)
    stop = stops.StopRequest("chief", grace_secs=600)
    self.addCleanup(stop.ended)
    signal_soon = threading.Timer(2.0, stop.request, args=(signal.SIGTERM,))
    signal_soon.start()
    self.addCleanup(signal_soon.cancel)
    with contextlib.redirect_stderr(io.StringIO()):
      result, output = self.train(log_dir, 10**9, stop)
    self.assertIsNone(result)
    stopped_at = int(re.search(r"chief: stopped on SIGTERM; final checkpoint "
                               r"\S+/model\.ckpt-(\d+);", output).group(1))
    self.assertEqual(self.chief_flag(), ps_flags.STOPPED)
    result, _ = self.train(log_dir, stopped_at + 10)  # Started again, to the end.
    self.assertEqual(result["global_step"], stopped_at + 10)
    self.assertEqual(self.chief_flag(), ps_flags.FINISHED)

  def test_keeps_the_model_the_ps_holds_over_an_older_checkpoint(self):
    log_dir = testutil.make_tempdir(self)
    self.train(log_dir, 40)
    self.train(log_dir, 70)
    # As if the chief died before saving step 70: the newest checkpoint is 40.
    tf.compat.v1.train.update_checkpoint_state(
        log_dir, os.path.join(log_dir, "model.ckpt-40"))
    result, output = self.train(log_dir, 90)
    self.assertIn("the PS tasks still hold the model at global step 70", output)
    self.assertIn("starting at global step 70 of 90", output)
    self.assertEqual(result["global_step"], 90)

  def test_keeps_the_model_the_ps_holds_when_there_is_no_checkpoint(self):
    self.train(testutil.make_tempdir(self), 50)
    # A chief restarted on a host without the old --log_dir: no checkpoint.
    result, output = self.train(testutil.make_tempdir(self), 80)
    self.assertIn("the PS tasks still hold the model at global step 50", output)
    self.assertIn("starting at global step 50 of 80", output)
    self.assertEqual(result["global_step"], 80)


class _ReleasedByAForcedExit(stops.StopRequest):
  """A StopRequest whose forced exit is recorded and releases `blocked`, not the process."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.forced = []
    self.blocked = threading.Event()

  def force_exit(self, reason, status, resorts=None):
    self.forced.append((reason, status))
    self.blocked.set()


class EndOfRunBoundTest(absltest.TestCase):
  """A chief whose PS stops serving as the run ends (in-process servers)."""

  def test_telling_a_ps_that_does_not_serve_it_is_done_ends_the_task(self):
    cluster = InProcessCluster(num_ps=1, num_workers=1)
    cfg = testutil.make_config(
        *cluster.host_flags(), "--job_name=worker", "--task_index=0",
        f"--log_dir={testutil.make_tempdir(self)}", "--train_steps=20",
        "--log_every_steps=1000", "--wait_timeout_secs=1")
    stop = _ReleasedByAForcedExit("chief")
    # As TF's session creation for the done flags does with a PS stopped by SIGSTOP.
    with mock.patch.object(peers.Peers, "leave", lambda *_: stop.blocked.wait(60)), \
        contextlib.redirect_stdout(io.StringIO()):
      started = time.monotonic()
      result = trainer.train(cfg, data.load("digits"), cluster.targets[0], stop)
      took = time.monotonic() - started
    (reason, status), = stop.forced
    self.assertEqual(status, 1)
    self.assertRegex(reason, r"^gave up after \d+ s waiting for TensorFlow at the end of the run .*"
                     r"\(at most 4 s, 4 x --wait_timeout_secs\): ps 0 at \S+ may not be serving")
    self.assertLess(took, 40)  # Not the 60 s the blocked call would take.
    self.assertEqual(result["global_step"], 20)  # The run itself had finished.


if __name__ == "__main__":
  absltest.main()
