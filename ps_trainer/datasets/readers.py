"""File readers for data_sets.py: MNIST IDX files and keras-layout .npz, and
the listing of a TFRecord set's directory (its records are record_checks.py's).

numpy only (no TensorFlow), so files are checked, and bad ones reported, before
any graph is built. Every bad input raises DataError with a one-line message
that names the file or flag, says what is wrong and what is accepted.
"""

import gzip
import os
import zipfile
import zlib

import numpy as np

from ps_trainer.console import errors
from ps_trainer.datasets.data_files import MNIST_FILES, MNIST_NEEDS, NPZ_KEYS
from ps_trainer.datasets.data_files import TFRECORD_NEEDS, missing_file_flag


class DataError(ValueError):
  """Bad data input.

  str(e) is one line naming the flag or file, what was wrong and what is
  accepted.
  """


def check_positive(value, flag):
  """Raises DataError unless value is an integer >= 1."""
  if not isinstance(value, (int, np.integer)) or value < 1:
    raise DataError(f"{flag}={value}: must be a positive integer")


def check_shard(num_shards, shard_index):
  """Raises DataError unless shard_index is one of num_shards (>= 1) shards."""
  check_positive(num_shards, "num_shards")
  if not 0 <= shard_index < num_shards:
    raise DataError(f"shard_index={shard_index}: must be in [0, {num_shards})")


_IDX_IMAGES_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
_IDX_LABELS_MAGIC = 0x00000801  # unsigned byte, 1 dimension

_GZIP_MAGIC = b"\x1f\x8b"


def _reason(error: Exception) -> str:
  return errors.first_line(str(error), type(error).__name__)


def mnist_candidates(name):
  """Returns the file names accepted for one MNIST file, in lookup order.

  Args:
    name: a base name from MNIST_FILES, e.g. "train-images-idx3-ubyte".

  Returns:
    The base name, the same gzipped, then the common "train-images.idx3-ubyte"
    spelling (some mirrors and archives use it) plain and gzipped.
  """
  dotted = name.replace("-idx", ".idx")
  return (name, name + ".gz", dotted, dotted + ".gz")


def find_mnist_files(data_dir):
  """Finds the four MNIST IDX files in data_dir.

  Args:
    data_dir: the --data_dir value.

  Returns:
    Four paths, in the order of MNIST_FILES.

  Raises:
    DataError: data_dir is not a directory, or some file is in none of its
      accepted spellings.
  """
  if not os.path.isdir(data_dir):
    raise DataError(f"--data_dir={data_dir}: no such directory; {MNIST_NEEDS}")
  paths, missing = [], []
  for name in MNIST_FILES:
    found = [c for c in mnist_candidates(name)
             if os.path.isfile(os.path.join(data_dir, c))]
    if found:
      paths.append(os.path.join(data_dir, found[0]))
    else:
      missing.append(name)
  if missing:
    # Each name once: the four spellings of each made a line of 900 characters.
    _, gzipped, dotted, _ = mnist_candidates(missing[0])
    raise DataError(
        f"--data_dir={data_dir}: missing {', '.join(missing)} (looked for "
        f"each as it is, gzipped ({gzipped}) and with a dot ({dotted}[.gz])); "
        "--dataset=mnist needs all four MNIST IDX files")
  return paths


def _read_maybe_gzipped(path, context):
  """Returns the bytes of a file, decompressed if its content is gzip.

  The content decides, not the name: a ".gz" that was already unpacked, or a
  gzipped file renamed without ".gz", both still read.
  """
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise DataError(f"{path}: cannot read ({e.strerror}) ({context})") from e
  if not raw.startswith(_GZIP_MAGIC):
    return raw
  try:
    return gzip.decompress(raw)
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(
        f"{path}: corrupt gzip data ({_reason(e)}); expected a plain or "
        f"intact gzipped IDX file ({context})") from e


def _magic(path, data, expected, what, context):
  """Checks an IDX header's magic number; returns the header's first count."""
  header = 16 if expected == _IDX_IMAGES_MAGIC else 8
  magic = int.from_bytes(data[:4], "big")
  # The magic first: a wrong file is named as such even when it is short.
  if len(data) >= 4 and magic != expected:
    hint = {_IDX_IMAGES_MAGIC: " (that is an IDX image file)",
            _IDX_LABELS_MAGIC: " (that is an IDX label file)"}.get(magic, "")
    raise DataError(
        f"{path}: wrong magic number 0x{magic:08x}{hint}; expected "
        f"0x{expected:08x}, an IDX {what} file ({context})")
  if len(data) < header:
    raise DataError(
        f"{path}: truncated: {len(data)} bytes, shorter than the {header}-byte "
        f"IDX {what} header ({context})")
  return int.from_bytes(data[4:8], "big")


def read_idx_images(path, context="--dataset=mnist"):
  """Reads an IDX3 unsigned-byte image file, plain or gzipped.

  Args:
    path: the file.
    context: what the file is for, appended to error messages.

  Returns:
    uint8 array [count, rows, cols], shaped by the file's header.

  Raises:
    DataError: unreadable, corrupt gzip, wrong magic, empty or truncated.
  """
  data = _read_maybe_gzipped(path, context)
  count = _magic(path, data, _IDX_IMAGES_MAGIC, "image", context)
  rows = int.from_bytes(data[8:12], "big")
  cols = int.from_bytes(data[12:16], "big")
  if count == 0 or rows == 0 or cols == 0:
    raise DataError(f"{path}: header says {count} images of {rows}x{cols}; "
                    f"need at least one non-empty image ({context})")
  need, have = count * rows * cols, len(data) - 16
  if have < need:
    raise DataError(
        f"{path}: truncated: header promises {count} images of {rows}x{cols} "
        f"({need} bytes) but the file holds {have} bytes "
        f"({have // (rows * cols)} whole images) ({context})")
  return np.frombuffer(data, np.uint8, need, 16).reshape(count, rows, cols)


def read_idx_labels(path, context="--dataset=mnist"):
  """Reads an IDX1 unsigned-byte label file, plain or gzipped.

  Args:
    path: the file.
    context: what the file is for, appended to error messages.

  Returns:
    uint8 array [count].

  Raises:
    DataError: unreadable, corrupt gzip, wrong magic, empty or truncated.
  """
  data = _read_maybe_gzipped(path, context)
  count = _magic(path, data, _IDX_LABELS_MAGIC, "label", context)
  if count == 0:
    raise DataError(f"{path}: header says 0 labels; need at least one "
                    f"({context})")
  if len(data) - 8 < count:
    raise DataError(
        f"{path}: truncated: header promises {count} labels ({count} bytes) "
        f"but the file holds {len(data) - 8} ({context})")
  return np.frombuffer(data, np.uint8, count, 8)


def read_mnist(data_dir):
  """Reads the four MNIST IDX files in data_dir.

  Args:
    data_dir: the --data_dir value.

  Returns:
    (x_train, y_train, x_test, y_test): uint8 images [N, rows, cols] and
    uint8 labels [N], as stored.

  Raises:
    DataError: any file missing or bad, or image and label counts differ.
  """
  paths = find_mnist_files(data_dir)
  arrays = []
  for images_path, labels_path in (paths[:2], paths[2:]):
    images = read_idx_images(images_path)
    labels = read_idx_labels(labels_path)
    if len(images) != len(labels):
      raise DataError(
          f"{labels_path}: holds {len(labels)} labels but {images_path} holds "
          f"{len(images)} images; each image needs exactly one label "
          f"(--dataset=mnist)")
    arrays += [images, labels]
  return tuple(arrays)


def list_tfrecord_files(data_dir):
  """Returns (train files, test files) of a TFRecord set's --data_dir: sorted
  full paths. Their records are read with TensorFlow (record_checks.py); a
  missing directory or split is named before it loads."""
  if not data_dir:
    raise DataError(missing_file_flag("tfrecord", data_dir, ""))
  if not os.path.isdir(data_dir):
    raise DataError(f"--data_dir={data_dir}: no such directory; "
                    f"{TFRECORD_NEEDS}")
  try:
    names = sorted(os.listdir(data_dir))
  except OSError as e:
    raise DataError(f"--data_dir={data_dir}: cannot list ({e.strerror}); "
                    f"{TFRECORD_NEEDS}") from e
  # Subdirectories are not searched: a train/ directory is not a file.
  files = [n for n in names if os.path.isfile(os.path.join(data_dir, n))]
  split = {}
  for prefix in ("train", "test"):
    split[prefix] = tuple(os.path.join(data_dir, n) for n in files
                          if n.startswith(prefix))
    if not split[prefix]:
      shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
      raise DataError(f"--data_dir={data_dir}: no {prefix}* files (found: "
                      f"{shown or 'nothing'}); {TFRECORD_NEEDS}")
  return split["train"], split["test"]


def read_npz(path, label, context):
  """Reads and checks a keras-layout .npz (x_train, y_train, x_test, y_test).

  Args:
    path: the file.
    label: how messages name the file, e.g. "--data_path=/d/x.npz".
    context: what the file is for, e.g. "--dataset=npz".

  Returns:
    Dict with the four keys. x arrays as stored (uint8 or floating, rank 2 to
    4, the same example shape in both splits); y arrays int64 [N], >= 0.

  Raises:
    DataError: missing or unreadable file, not an npz, a missing key, or
      arrays that break the layout.
  """
  needs = f"{context} needs a keras-layout .npz with keys {', '.join(NPZ_KEYS)}"
  if os.path.isdir(path):
    raise DataError(f"{label}: is a directory, not a file; {needs}")
  if not os.path.isfile(path):
    raise DataError(f"{label}: no such file; {needs}")
  try:
    magic = _magic_of(path)
  except OSError as e:
    raise DataError(f"{label}: cannot read ({e.strerror}); {needs}") from e
  if magic not in (b"PK\x03\x04", b"\x93NUM"):
    # np.load would guess "pickled data" for any other bytes.
    raise DataError(f"{label}: not an .npz archive (not a zip file); {needs}")
  try:
    archive = np.load(path, allow_pickle=False)
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
    raise DataError(f"{label}: not a valid .npz archive ({_reason(e)}); "
                    f"{needs}") from e
  if not isinstance(archive, np.lib.npyio.NpzFile):
    raise DataError(f"{label}: holds a single .npy array, not an .npz "
                    f"archive; {needs}")
  with archive:
    missing = [k for k in NPZ_KEYS if k not in archive.files]
    if missing:
      raise DataError(
          f"{label}: missing key {', '.join(repr(k) for k in missing)} "
          f"(found {', '.join(repr(k) for k in archive.files) or 'none'}); "
          f"{needs}")
    arrays = {}
    for key in NPZ_KEYS:
      try:
        arrays[key] = archive[key]
      except (OSError, ValueError, EOFError, zipfile.BadZipFile,
              zlib.error) as e:
        raise DataError(f"{label}: cannot read array {key!r} "
                        f"({_reason(e)}); {needs}") from e
  for split in ("train", "test"):
    x, y = arrays["x_" + split], arrays["y_" + split]
    arrays["x_" + split] = _check_images(x, f"x_{split}", label)
    arrays["y_" + split] = _check_labels(y, f"y_{split}", label)
    if len(x) != len(y):
      raise DataError(f"{label}: x_{split} has {len(x)} examples but y_{split} "
                      f"has {len(y)}; each example needs exactly one label")
  train_shape = arrays["x_train"].shape[1:]
  test_shape = arrays["x_test"].shape[1:]
  if train_shape != test_shape:
    raise DataError(
        f"{label}: x_train examples have shape {train_shape} but x_test "
        f"examples have shape {test_shape}; both splits need the same shape")
  _note_unused_class_ids(arrays["y_train"], arrays["y_test"], label)
  return arrays


def _note_unused_class_ids(y_train, y_test, label):
  """Warns when the labels skip class ids: the model gets one output per id
  up to the largest, so labels 1-3 add an unused class 0, and 0/1000/2000
  make 2001 outputs where 3 were meant."""
  used = np.union1d(np.unique(y_train), np.unique(y_test)).astype(np.int64)
  num_ids = int(used[-1]) + 1
  if len(used) == num_ids:
    return
  # The first few unused ids, without a range of every id (labels can be
  # hashed ids in the billions).
  present = set(used.tolist())
  first = []
  candidate = 0
  while len(first) < 3 and candidate < num_ids:
    if candidate not in present:
      first.append(candidate)
    candidate += 1
  unused = num_ids - len(used)
  shown = ", ".join(str(i) for i in first)
  more = f" and {unused - len(first)} more" if unused > len(first) else ""
  errors.warn(f"{label}: the labels use {len(used)} of the class ids "
              f"0-{num_ids - 1} (not {shown}{more}), so the model gets "
              f"{num_ids} outputs; number the classes 0-{len(used) - 1} if "
              f"there are {len(used)}")


def _magic_of(path):
  with open(path, "rb") as f:
    return f.read(4)


def _check_images(x, key, label):
  """Checks one x array of an npz; returns it unchanged."""
  if x.ndim not in (2, 3, 4):
    raise DataError(
        f"{label}: {key} has shape {x.shape}; accepted: [N, D], [N, H, W] or "
        f"[N, H, W, C]")
  if len(x) == 0:
    raise DataError(f"{label}: {key} is empty; each split needs at least one "
                    f"example")
  if x.dtype != np.uint8 and not np.issubdtype(x.dtype, np.floating):
    raise DataError(
        f"{label}: {key} has dtype {x.dtype}; accepted: uint8 (scaled by "
        f"1/255) or a float type (used as is)")
  if x.dtype != np.uint8 and not np.isfinite(x).all():
    raise DataError(f"{label}: {key} contains NaN or Inf; values must be "
                    f"finite")
  return x


def _check_labels(y, key, label):
  """Checks one y array of an npz; returns it as int64 [N]."""
  # keras' cifar10/100 store labels as [N, 1]: accept that too.
  if y.ndim == 2 and y.shape[1] == 1:
    y = y[:, 0]
  if y.ndim != 1:
    raise DataError(f"{label}: {key} has shape {y.shape}; accepted: [N] or "
                    f"[N, 1] integer class ids")
  if len(y) == 0:
    raise DataError(f"{label}: {key} is empty; each split needs at least one "
                    f"example")
  floating = np.issubdtype(y.dtype, np.floating)
  # Whole-valued floats pass as labels.
  whole = (np.isfinite(y) & (y == np.round(y))) if floating else None
  integral = np.issubdtype(y.dtype, np.integer) or (
      floating and bool(whole.all()))
  if not integral or y.min() < 0:
    if integral:
      bad = f"value {y.min()}"
    elif floating:
      bad = f"value {y[~whole][0]:g}"
    else:
      bad = f"{y.dtype} values"
    raise DataError(f"{label}: {key} holds {bad}; labels must be non-negative "
                    f"integer class ids")
  return y.astype(np.int64)
