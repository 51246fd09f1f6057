"""Imports TensorFlow without its native start-up notes on stderr, and
without Keras; numpy without its BLAS library's."""

import contextlib
import os
import sys
import tempfile

# TF 2.21 routes tf.keras to Keras 3 unless told to use the legacy tf_keras
# package (Keras 2), the one whose layers build TF1 graphs for a user's
# model_fn. ps_trainer/__init__.py sets the same switch first.
_KERAS_SWITCH = "TF_USE_LEGACY_KERAS"


def tensorflow():
  """Imports TensorFlow with its C++ start-up notes hidden.

  Its native libraries write CUDA probing and CPU-feature notes straight to
  file descriptor 2 before any log setting applies; they would bury the
  progress lines. If the import fails, the notes are shown after all.
  A value of TF_USE_LEGACY_KERAS set by the user is kept.
  """
  os.environ.setdefault(_KERAS_SWITCH, "1")
  with _native_notes_hidden():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf


def numpy():
  """Imports numpy with its BLAS library's start-up notes hidden.

  Imported first by data_sets.py, before TensorFlow, numpy loads outside
  tensorflow()'s capture, and OpenBLAS writes to file descriptor 2 on some
  hosts (that it cannot tell the L2 cache size): a line before the one line of
  an error.
  """
  with _native_notes_hidden():
    import numpy as np  # pylint: disable=g-import-not-at-top
  return np


@contextlib.contextmanager
def _native_notes_hidden():
  """File descriptor 2 into a temporary file for the block; what it holds is
  written out after all if the block fails (not if Ctrl-C cut it short)."""
  saved = os.dup(2)
  with tempfile.TemporaryFile() as capture:
    os.dup2(capture.fileno(), 2)
    try:
      yield
    except Exception:
      os.dup2(saved, 2)
      capture.seek(0)
      sys.stderr.write(capture.read().decode(errors="replace"))
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)
