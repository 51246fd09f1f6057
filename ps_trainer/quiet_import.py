"""Imports TensorFlow without its native start-up notes on stderr."""

import os
import sys
import tempfile


def tensorflow():
  """Imports TensorFlow with its C++ start-up notes hidden.

  Its native libraries write CUDA probing and CPU-feature notes straight to
  file descriptor 2 before any log setting applies; they would bury the
  progress lines. If the import fails, the notes are shown after all.
  """
  saved = os.dup(2)
  with tempfile.TemporaryFile() as capture:
    os.dup2(capture.fileno(), 2)
    try:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
    except BaseException:
      os.dup2(saved, 2)
      capture.seek(0)
      sys.stderr.write(capture.read().decode(errors="replace"))
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)
  return tf
