"""The data sets read whole into memory (digits, mnist, npz), with numpy alone.

No TensorFlow here: main.py reads these before TensorFlow loads, so a missing
or bad file answers in a blink, not after the seconds TensorFlow's import takes.
The data sets that need TensorFlow (synthetic, drawn in-graph, and tfrecord,
whose records TensorFlow parses) are data.py's; a TFRecord set's files are
looked for here all the same.
"""

import dataclasses
import os
from typing import Any, Optional

from ps_trainer.console import quiet_import

# Before anything here imports it plainly: this module loads before TensorFlow,
# outside the capture that hides TensorFlow's native notes, and numpy's BLAS
# library writes its own to stderr on some hosts (quiet_import.numpy).
np = quiet_import.numpy()

# pylint: disable=g-import-not-at-top,wrong-import-position
from ps_trainer.datasets import readers
from ps_trainer.datasets.data_files import NPZ_KEYS
from ps_trainer.datasets.readers import DataError
# pylint: enable=g-import-not-at-top,wrong-import-position

__all__ = ["DIGITS_PATH", "DataError", "DataSet", "read"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS_PATH = os.path.join(_PACKAGE_DIR, "assets", "digits.npz")


@dataclasses.dataclass(frozen=True, eq=False)  # eq on arrays is ambiguous
class DataSet:
  """A data set in memory.

  Attributes:
    name: one of data.DATASETS.
    input_shape: shape of one example, e.g. (8, 8, 1), (28, 28, 1) or (D,).
    num_classes: number of classes; labels are in [0, num_classes).
    x_train: float32 [N, *input_shape]; None for synthetic (generated
      in-graph) and tfrecord (streamed).
    y_train: int64 [N]; None for synthetic and tfrecord.
    x_test: float32 [M, *input_shape]; None for tfrecord.
    y_test: int64 [M]; None for tfrecord.
    records: the TFRecord files of tfrecord (a record_checks.RecordSet),
      else None.
  """
  name: str
  input_shape: tuple
  num_classes: int
  x_train: Optional[np.ndarray]
  y_train: Optional[np.ndarray]
  x_test: Optional[np.ndarray]
  y_test: Optional[np.ndarray]
  records: Any = None


def read(name: str, data_dir: str = "",
         data_path: str = "") -> Optional[DataSet]:
  """Reads and checks data set `name` if it is one of these; else None.
  Of a TFRecord set, streamed once TensorFlow has loaded, only checks that
  its train* and test* files are there.

  Raises:
    DataError: a missing or bad file, in one line.
  """
  if name == "tfrecord" and data_dir:
    readers.list_tfrecord_files(data_dir)
    return None
  if name == "mnist" and data_dir:
    splits = readers.read_mnist(data_dir)
  elif name == "digits":
    splits = _npz_splits(DIGITS_PATH, DIGITS_PATH,
                         "--dataset=digits (the bundled file)")
  elif name == "npz" and data_path:
    splits = _npz_splits(data_path, f"--data_path={data_path}", "--dataset=npz")
  else:  # Not read here, or its file flag unset (data.load says so).
    return None
  return _from_arrays(name, *splits)


def _npz_splits(path, label, context):
  arrays = readers.read_npz(path, label, context)
  return [arrays[key] for key in NPZ_KEYS]


def _from_arrays(name, x_train, y_train, x_test, y_test):
  """Builds a DataSet from checked arrays: float32 examples, int64 labels."""
  x_train, x_test = _examples(x_train), _examples(x_test)
  y_train, y_test = y_train.astype(np.int64), y_test.astype(np.int64)
  # At least 2 so a model always has a real decision to make, even on a
  # split that happens to hold one class.
  num_classes = max(2, int(max(y_train.max(), y_test.max())) + 1)
  return DataSet(name, tuple(int(d) for d in x_train.shape[1:]), num_classes,
                 x_train, y_train, x_test, y_test)


def _examples(x):
  """uint8 -> float32 /255; floats -> float32; [N, H, W] -> [N, H, W, 1]."""
  if x.dtype == np.uint8:
    x = np.true_divide(x, 255, dtype=np.float32)  # one allocation, exact
  else:
    x = x.astype(np.float32, copy=False)
  return x[..., np.newaxis] if x.ndim == 3 else x


def from_input_fn(input_fn: str) -> DataSet:
  """The stand-in DataSet of a run whose input a user's input_fn makes: it
  holds no arrays, and its shape and classes are the model's business."""
  return DataSet(f"input_fn {input_fn}", (), 0, None, None, None, None)
