"""The chief's claim on its --log_dir: one chief at a time, never a stale claim, never a traceback."""

import errno
import os
from unittest import mock

from absl.testing import absltest

from ps_trainer.console import output_dir
import testutil


class ClaimTest(absltest.TestCase):

  def test_a_second_claim_is_refused_naming_the_holder_until_the_first_is_released(self):
    log_dir = testutil.make_tempdir(self)
    first = output_dir.claim(log_dir, "--log_dir")
    with self.assertRaisesRegex(
        output_dir.OutputDirError,
        rf"^--log_dir={log_dir}: a chief trains into it now \(pid {os.getpid()} on \S+\); two "
        r"would overwrite each other's checkpoints: stop that one, or pass another --log_dir$"):
      output_dir.claim(log_dir, "--log_dir")
    first.close()  # As at the first chief's exit, however it ends.
    output_dir.claim(log_dir, "--log_dir").close()

  def test_a_claim_file_it_cannot_open_or_lock_leaves_the_directory_unclaimed(self):
    # Another user's claim file, or a network mount without locks: the run goes on.
    log_dir = testutil.make_tempdir(self)
    with mock.patch.object(output_dir, "open", create=True,
                           side_effect=PermissionError(errno.EACCES, "Permission denied")):
      self.assertIsNone(output_dir.claim(log_dir, "--log_dir"))
    with mock.patch.object(output_dir.fcntl, "flock",
                           side_effect=OSError(errno.ENOLCK, "No locks available")):
      self.assertIsNone(output_dir.claim(log_dir, "--log_dir"))


if __name__ == "__main__":
  absltest.main()
