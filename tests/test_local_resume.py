"""Local-mode training continued from its --log_dir: a restore, a moved or copied directory, a
checkpoint file naming what is not there, checkpoints with files gone, another model's checkpoints.
"""

import os
import shutil

from absl.testing import absltest
import tensorflow as tf

from ps_trainer.training import checkpoints
import local_runs
import testutil

tf.compat.v1.disable_eager_execution()


class ResumeTest(local_runs.LocalRunTestCase):

  def test_restart_restores_instead_of_reinitializing(self):
    first = self.train("--train_steps=120")
    again = self.train("--train_steps=120")  # Nothing left to train.
    self.assertEqual(again["global_step"], 120)
    # Same weights as the first run's end: restored, not freshly initialized.
    self.assertEqual(again["accuracy"], first["accuracy"])
    self.assertAlmostEqual(again["loss"], first["loss"], places=6)
    more = self.train("--train_steps=180")
    self.assertEqual(more["global_step"], 180)

  def test_a_moved_log_dir_continues_from_its_checkpoints(self):
    self.train("--train_steps=30")
    with open(os.path.join(self.log_dir, "checkpoint")) as f:
      self.assertNotIn(self.log_dir, f.read())  # Names relative to the directory.
    moved = self.log_dir + "-moved"
    os.rename(self.log_dir, moved)
    self.addCleanup(shutil.rmtree, moved)
    result, output = self.train_in(moved, 60)
    self.assertIn(f"local: restored {moved}/model.ckpt-30\n", output)
    self.assertIn("starting at global step 30 of 60", output)
    self.assertEqual(result["global_step"], 60)

  def test_a_checkpoint_file_naming_another_directory_is_rewritten_not_followed(self):
    # As TF's savers wrote it for an absolute --log_dir: the original's paths, in a copy.
    self.train("--train_steps=30")
    copy = testutil.make_tempdir(self) + "/copy"
    shutil.copytree(self.log_dir, copy)
    tf.compat.v1.train.update_checkpoint_state(
        copy, os.path.join(self.log_dir, "model.ckpt-30"),
        [os.path.join(self.log_dir, name) for name in ("model.ckpt-0", "model.ckpt-30")])
    # What the evaluator and the export read, which change nothing: the copy's own.
    self.assertEqual(checkpoints.latest(copy), os.path.join(copy, "model.ckpt-30"))
    # Its checkpoints (its summaries' writer may still flush meanwhile).
    checkpoint_times = lambda: {name: time for name, time in self.modified_times().items()
                                if name.startswith(("checkpoint", "model.ckpt"))}
    original = checkpoint_times()
    result, output = self.train_in(copy, 60)
    self.assertIn(f"local: the checkpoint file of --log_dir named {self.log_dir} (the directory "
                  f"was moved or copied); it now names the checkpoints in {copy}", output)
    self.assertIn("starting at global step 30 of 60", output)
    self.assertEqual(result["global_step"], 60)
    self.assertEqual(checkpoint_times(), original)  # The original is left alone.
    self.assertEqual(tf.train.get_checkpoint_state(copy).all_model_checkpoint_paths,
                     [os.path.join(copy, name) for name in ("model.ckpt-0", "model.ckpt-30",
                                                            "model.ckpt-60")])

  def test_a_checkpoint_file_naming_a_checkpoint_it_lacks_is_one_line(self):
    self.train("--train_steps=30")
    elsewhere = testutil.make_tempdir(self)
    shutil.copy(os.path.join(self.log_dir, "checkpoint"), elsewhere)
    tf.compat.v1.train.update_checkpoint_state(
        elsewhere, os.path.join(self.log_dir, "model.ckpt-30"))
    with self.assertRaises(checkpoints.MissingCheckpointError) as raised:
      self.train_in(elsewhere, 60)
    self.assertEqual(str(raised.exception), (
        f"--log_dir={elsewhere}: its checkpoint file names {self.log_dir}/model.ckpt-30, and "
        "model.ckpt-30 is not in --log_dir (moved or copied without it?); put it there, or "
        "give a new --log_dir; nothing was changed"))
    self.assertEqual(os.listdir(elsewhere), ["checkpoint"])

  def test_a_newest_checkpoint_with_files_gone_is_one_line_naming_the_one_to_go_on_from(self):
    self.train("--train_steps=30")  # model.ckpt-0 and model.ckpt-30
    # The data file's shard count is in its own name: with its only shard gone, it is "data-*".
    for gone, named in ((".index", ".index"), (".data-00000-of-00001", ".data-*")):
      with self.subTest(gone=gone):
        log_dir = testutil.make_tempdir(self) + "/run"
        shutil.copytree(self.log_dir, log_dir)
        os.remove(os.path.join(log_dir, "model.ckpt-30" + gone))
        before = sorted(os.listdir(log_dir))
        with self.assertRaises(checkpoints.MissingCheckpointError) as raised:
          self.train_in(log_dir, 60)
        self.assertEqual(str(raised.exception), (
            f"--log_dir={log_dir}: its newest checkpoint, model.ckpt-30, is missing files "
            f"(model.ckpt-30{named}); the newest whole one is model.ckpt-0: to continue from "
            f"it, make model_checkpoint_path \"model.ckpt-0\" in {log_dir}/checkpoint; "
            "nothing was changed"))
        self.assertEqual(sorted(os.listdir(log_dir)), before)
        self.assertIsNone(checkpoints.latest(log_dir))  # Nor do the evaluator and export use it.
    for name in os.listdir(self.log_dir):
      if name.startswith("model.ckpt-"):
        os.remove(os.path.join(self.log_dir, name))
    with self.assertRaises(checkpoints.MissingCheckpointError) as raised:
      self.train_in(self.log_dir, 60)
    self.assertEqual(str(raised.exception), (
        f"--log_dir={self.log_dir}: its newest checkpoint, model.ckpt-30, is missing files "
        "(model.ckpt-30.index, model.ckpt-30.data-*); no whole checkpoint is left: give a new "
        f"--log_dir, or remove {self.log_dir}/checkpoint to start over there; nothing was "
        "changed"))

  def test_a_log_dir_of_another_model_is_refused_and_left_as_it_was(self):
    self.train("--train_steps=30", "--hidden_units=32,32")
    before = self.modified_times()
    # TF's restore checks names, not shapes: this once trained a [32, 32]
    # kernel as [32, 16] and saved the mix into the other run's directory.
    with self.assertRaisesRegex(
        checkpoints.ForeignCheckpointError,
        r"holds checkpoints of another model \(model/hidden1/kernel is "
        r"\[32, 32\] there, \[32, 16\] here; .*model\.ckpt-30\)"):
      self.train("--train_steps=60", "--hidden_units=32,16")
    with self.assertRaisesRegex(checkpoints.ForeignCheckpointError,
                                r"it has no model/hidden2/kernel"):
      self.train("--train_steps=60", "--hidden_units=32,32,8")
    # A layer fewer: what it has fits (the logits kernel is [32, 10] either way), and a restore
    # would go on, but the chief's saves would then replace the other run's checkpoints.
    with self.assertRaisesRegex(checkpoints.ForeignCheckpointError,
                                r"\(it holds model/hidden1/bias, which this model has not, nor 5 "
                                r"more; .*model\.ckpt-30\)"):
      self.train("--train_steps=60", "--hidden_units=32")
    self.assertEqual(self.modified_times(), before)
    # The evaluator and the export hold the model alone: the optimizer's variables may be
    # beyond theirs, another model's may not.
    checkpoint = checkpoints.latest(self.log_dir)
    with tf.Graph().as_default():
      mlp = [tf.compat.v1.get_variable(f"model/{layer}/{part}", shape)
             for layer, inputs, units in (("hidden0", 64, 32), ("hidden1", 32, 32),
                                          ("logits", 32, 10))
             for part, shape in (("kernel", [inputs, units]), ("bias", [units]))]
    self.assertIsNone(checkpoints.mismatch(checkpoint, mlp))
    self.assertEqual(checkpoints.mismatch(checkpoint, mlp[2:]),
                     "it holds model/hidden0/bias, which this model has not, nor 5 more")
    self.assertRegex(checkpoints.mismatch(checkpoint, mlp, exact=True),
                     r"^it holds beta1_power, which this model has not, nor \d+ more$")
    # The flags it was started with still continue it.
    self.assertEqual(
        self.train("--train_steps=60", "--hidden_units=32,32")["global_step"], 60)


if __name__ == "__main__":
  absltest.main()
