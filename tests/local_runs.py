"""A test case that trains in local mode, in the test's process, into a fresh --log_dir."""

import contextlib
import io
import os

from absl.testing import absltest

from ps_trainer.datasets import data
from ps_trainer.training import trainer
import testutil


class LocalRunTestCase(absltest.TestCase):
  """self.log_dir: a fresh directory for each test; train() and train_in() run the trainer."""

  def setUp(self):
    super().setUp()
    self.log_dir = testutil.make_tempdir(self)

  def train(self, *argv):
    cfg = testutil.make_config(f"--log_dir={self.log_dir}", "--log_every_steps=1000", *argv)
    return trainer.train(cfg, data.load(cfg.data.dataset))

  def modified_times(self):
    """{file name: mtime} of every file in the log dir."""
    return {name: os.path.getmtime(os.path.join(self.log_dir, name))
            for name in os.listdir(self.log_dir)}

  def train_in(self, log_dir, steps):
    """Trains in `log_dir` to `steps`; (result, what it printed)."""
    cfg = testutil.make_config(f"--log_dir={log_dir}", "--log_every_steps=1000",
                               f"--train_steps={steps}")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      result = trainer.train(cfg, data.load(cfg.data.dataset))
    return result, output.getvalue()
