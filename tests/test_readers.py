"""Tests of reading MNIST's IDX files and keras-layout npz files through data.load.

Readers run on tiny files written into temp dirs (testutil.make_tempdir:
absltest's create_tempdir needs parsed absl flags, which pytest lacks).
"""

import contextlib
import gzip
import io
import os
import re
import shutil
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from ps_trainer.datasets import data
from ps_trainer.datasets import readers
import testutil


def _idx_bytes(magic, dims, payload):
  header = magic.to_bytes(4, "big") + b"".join(
      d.to_bytes(4, "big") for d in dims)
  return header + payload.tobytes()


def _write(path, content, gz=False):
  with open(path, "wb") as f:
    f.write(gzip.compress(content) if gz else content)
  return path


def _write_mnist(directory, gz=False, dotted=False, n_train=6, n_test=4,
                 rows=4, cols=3):
  """Writes four small IDX files; returns the arrays they hold."""
  rng = np.random.default_rng(0)
  arrays = {}
  for split, n in (("train", n_train), ("t10k", n_test)):
    images = rng.integers(0, 256, (n, rows, cols), dtype=np.uint8)
    labels = rng.integers(0, 7, n, dtype=np.uint8)
    for kind, magic, dims, payload in (
        ("images-idx3-ubyte", 0x803, (n, rows, cols), images),
        ("labels-idx1-ubyte", 0x801, (n,), labels)):
      name = f"{split}-{kind}"
      if dotted:
        name = name.replace("-idx", ".idx")
      name += ".gz" if gz else ""
      _write(os.path.join(directory, name), _idx_bytes(magic, dims, payload),
             gz)
    arrays[split] = (images, labels)
  return arrays


class MnistTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("plain", False, False), ("gzipped", True, False),
      ("dotted", False, True), ("dotted_gzipped", True, True))
  def test_round_trip(self, gz, dotted):
    directory = testutil.make_tempdir(self)
    arrays = _write_mnist(directory, gz=gz, dotted=dotted)
    ds = data.load("mnist", data_dir=directory)
    self.assertEqual(ds.input_shape, (4, 3, 1))
    self.assertEqual(ds.x_train.shape, (6, 4, 3, 1))
    self.assertEqual(ds.x_test.shape, (4, 4, 3, 1))
    self.assertEqual(ds.x_train.dtype, np.float32)
    self.assertEqual(ds.y_train.dtype, np.int64)
    np.testing.assert_allclose(ds.x_train[..., 0], arrays["train"][0] / 255,
                               rtol=1e-6)
    np.testing.assert_array_equal(ds.y_test, arrays["t10k"][1])
    labels = np.concatenate([arrays["train"][1], arrays["t10k"][1]])
    self.assertEqual(ds.num_classes, labels.max() + 1)

  def test_gzip_content_without_gz_name_still_reads(self):
    path = _write(os.path.join(testutil.make_tempdir(self), "labels"),
                  _idx_bytes(0x801, (3,), np.array([1, 0, 2], np.uint8)),
                  gz=True)
    np.testing.assert_array_equal(readers.read_idx_labels(path), [1, 0, 2])

  def test_no_data_dir_flag(self):
    with self.assertRaisesRegex(data.DataError,
                                r"^--data_dir is not set; --dataset=mnist"):
      data.load("mnist")

  def test_missing_dir(self):
    missing = os.path.join(testutil.make_tempdir(self), "nope")
    with self.assertRaisesRegex(
        data.DataError, rf"^--data_dir={re.escape(missing)}: no such "
        r"directory; --dataset=mnist needs .*train-images-idx3-ubyte\[\.gz\]"):
      data.load("mnist", data_dir=missing)

  def test_missing_file_lists_names_looked_for(self):
    directory = testutil.make_tempdir(self)
    _write_mnist(directory)
    os.remove(os.path.join(directory, "t10k-labels-idx1-ubyte"))
    with self.assertRaisesRegex(
        data.DataError,
        r": missing t10k-labels-idx1-ubyte \(looked for each as it is, gzipped "
        r"\(t10k-labels-idx1-ubyte\.gz\) and with a dot \(t10k-labels\.idx1-ubyte\[\.gz\]\)\); "
        r"--dataset=mnist needs all four MNIST IDX files$") as cm:
      data.load("mnist", data_dir=directory)
    self.assertNotIn("train-images-idx3-ubyte", str(cm.exception))

  @parameterized.named_parameters(("plain", False), ("gzipped", True))
  def test_wrong_magic(self, gz):
    directory = testutil.make_tempdir(self)
    _write_mnist(directory, gz=gz)
    suffix = ".gz" if gz else ""
    images = os.path.join(directory, "train-images-idx3-ubyte" + suffix)
    labels = os.path.join(directory, "train-labels-idx1-ubyte" + suffix)
    shutil.copyfile(labels, images)  # a label file where images belong
    with self.assertRaisesRegex(
        data.DataError, rf"^{re.escape(images)}: wrong magic number "
        r"0x00000801 \(that is an IDX label file\); expected 0x00000803"):
      data.load("mnist", data_dir=directory)

  @parameterized.named_parameters(("plain", False), ("gzipped", True))
  def test_truncated_images(self, gz):
    path = _write(os.path.join(testutil.make_tempdir(self), "images"),
                  _idx_bytes(0x803, (10, 28, 28), np.zeros(1000, np.uint8)),
                  gz)
    with self.assertRaisesRegex(
        data.DataError, rf"^{re.escape(path)}: truncated: header promises 10 "
        r"images of 28x28 \(7840 bytes\) but the file holds 1000 bytes \(1 "
        r"whole images\) \(--dataset=mnist\)$"):
      readers.read_idx_images(path)

  def test_truncated_labels(self):
    path = _write(os.path.join(testutil.make_tempdir(self), "labels"),
                  _idx_bytes(0x801, (5,), np.zeros(3, np.uint8)))
    with self.assertRaisesRegex(
        data.DataError, rf"^{re.escape(path)}: truncated: header promises 5 "
        r"labels \(5 bytes\) but the file holds 3"):
      readers.read_idx_labels(path)

  def test_truncated_header(self):
    path = _write(os.path.join(testutil.make_tempdir(self), "images"),
                  b"\0\0\x08\x03\0\0")
    with self.assertRaisesRegex(
        data.DataError, rf"^{re.escape(path)}: truncated: 6 bytes, shorter "
        r"than the 16-byte IDX image header"):
      readers.read_idx_images(path)

  def test_count_mismatch(self):
    directory = testutil.make_tempdir(self)
    _write_mnist(directory)
    labels = os.path.join(directory, "train-labels-idx1-ubyte")
    _write(labels, _idx_bytes(0x801, (5,), np.zeros(5, np.uint8)))
    with self.assertRaisesRegex(
        data.DataError, rf"^{re.escape(labels)}: holds 5 labels but "
        r".*train-images-idx3-ubyte holds 6 images; each image needs exactly "
        r"one label"):
      data.load("mnist", data_dir=directory)

  @parameterized.named_parameters(("cut_short", "cut"), ("bit_flip", "flip"))
  def test_corrupt_gzip(self, how):
    directory = testutil.make_tempdir(self)
    _write_mnist(directory, gz=True)
    path = os.path.join(directory, "t10k-images-idx3-ubyte.gz")
    raw = bytearray(open(path, "rb").read())
    if how == "cut":
      raw = raw[:len(raw) // 2]
    else:
      raw[-6] ^= 0xFF  # inside the CRC-32 trailer
    _write(path, bytes(raw))
    with self.assertRaisesRegex(
        data.DataError, rf"^{re.escape(path)}: corrupt gzip data \(.+\); "
        r"expected a plain or intact gzipped IDX file"):
      data.load("mnist", data_dir=directory)


def _write_npz(path, **arrays):
  np.savez_compressed(path, **arrays)
  return path


def _layout(x_train, x_test, y_train=None, y_test=None):
  return dict(
      x_train=x_train, x_test=x_test,
      y_train=np.arange(len(x_train)) % 3 if y_train is None else y_train,
      y_test=np.arange(len(x_test)) % 3 if y_test is None else y_test)


class NpzTest(parameterized.TestCase):

  def _npz(self, **arrays):
    return _write_npz(
        os.path.join(testutil.make_tempdir(self), "d.npz"), **arrays)

  @parameterized.named_parameters(
      ("rank2_uint8", (5, 7), np.uint8, (7,)),
      ("rank3_uint8", (5, 4, 3), np.uint8, (4, 3, 1)),
      ("rank4_float64", (5, 4, 3, 2), np.float64, (4, 3, 2)),
      ("rank3_float32", (5, 4, 3), np.float32, (4, 3, 1)))
  def test_round_trip(self, shape, dtype, input_shape):
    rng = np.random.default_rng(1)
    if dtype == np.uint8:
      x = rng.integers(0, 256, shape).astype(np.uint8)
      expected = x / 255
    else:
      x = expected = rng.uniform(size=shape).astype(dtype)
    path = self._npz(**_layout(x, x[:2]))
    ds = data.load("npz", data_path=path)
    self.assertEqual(ds.input_shape, input_shape)
    self.assertEqual(ds.x_train.shape, (5,) + input_shape)
    self.assertEqual(ds.x_test.shape, (2,) + input_shape)
    self.assertEqual(ds.x_train.dtype, np.float32)
    np.testing.assert_allclose(ds.x_train.reshape(shape), expected, rtol=1e-6)
    np.testing.assert_array_equal(ds.y_train, [0, 1, 2, 0, 1])
    self.assertEqual(ds.y_train.dtype, np.int64)
    self.assertEqual(ds.num_classes, 3)

  def test_labels_n_by_1_and_integral_floats_accepted(self):
    x = np.zeros((4, 2), np.float32)
    path = self._npz(**_layout(x, x, y_train=np.array([[0], [1], [4], [1]]),
                               y_test=np.array([1.0, 0.0, 2.0, 1.0])))
    ds = data.load("npz", data_path=path)
    np.testing.assert_array_equal(ds.y_train, [0, 1, 4, 1])
    self.assertEqual(ds.num_classes, 5)

  def test_one_class_still_gives_two(self):
    x = np.zeros((3, 2), np.float32)
    zeros = np.zeros(3, np.int64)
    ds = data.load("npz", data_path=self._npz(**_layout(x, x, zeros, zeros)))
    self.assertEqual(ds.num_classes, 2)

  def test_no_data_path_flag(self):
    with self.assertRaisesRegex(
        data.DataError, r"^--data_path is not set; --dataset=npz needs "
        r"--data_path=FILE\.npz with keys x_train, y_train, x_test, y_test$"):
      data.load("npz")

  def test_missing_file(self):
    path = os.path.join(testutil.make_tempdir(self), "absent.npz")
    with self.assertRaisesRegex(
        data.DataError, rf"^--data_path={re.escape(path)}: no such file; "
        r"--dataset=npz needs a keras-layout \.npz with keys x_train"):
      data.load("npz", data_path=path)

  def test_labels_that_skip_class_ids_are_named_in_a_warning(self):
    x = np.zeros((4, 2), np.float32)
    path = self._npz(**_layout(x, x, np.array([0, 1000, 2000, 0]), np.array([0, 0, 0, 0])))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
      ds = data.load("npz", data_path=path)
    self.assertEqual(ds.num_classes, 2001)
    self.assertEqual(stderr.getvalue(), (
        f"ps_trainer: warning: --data_path={path}: the labels use 3 of the class ids 0-2000 "
        "(not 1, 2, 3 and 1995 more), so the model gets 2001 outputs; number the classes 0-2 "
        "if there are 3\n"))
    # Hashed ids in the billions are named without a range of every id.
    with contextlib.redirect_stderr(io.StringIO()) as huge:
      data.load("npz", data_path=self._npz(**_layout(x, x, np.array([0, 10**12, 0, 0]),
                                                       np.array([0, 0, 0, 0]))))
    self.assertIn("(not 1, 2, 3 and 999999999996 more)", huge.getvalue())
    with contextlib.redirect_stderr(io.StringIO()) as quiet:
      data.load("npz", data_path=self._npz(**_layout(x, x, np.array([0, 1, 2, 1]),
                                                       np.array([2, 2, 1, 0]))))
    self.assertEqual(quiet.getvalue(), "")

  def test_unreadable_file(self):
    # Tests run as root, whom no file mode keeps out: the refusal is faked.
    x = np.zeros((3, 2), np.float32)
    path = self._npz(**_layout(x, x))
    denied = PermissionError(13, "Permission denied", path)
    with mock.patch.object(readers, "open", side_effect=denied, create=True):
      with self.assertRaisesRegex(
          data.DataError, rf"^--data_path={re.escape(path)}: cannot read "
          r"\(Permission denied\); --dataset=npz needs a keras-layout \.npz"):
        data.load("npz", data_path=path)

  @parameterized.named_parameters(
      ("text", b"hello, not an archive\n",
       r"not an \.npz archive \(not a zip file\)"),
      ("cut_zip", None, r"not a valid \.npz archive \(.+\)"))
  def test_not_an_npz(self, content, reason):
    directory = testutil.make_tempdir(self)
    path = os.path.join(directory, "bad.npz")
    if content is None:  # a real archive cut in half
      x = np.zeros((50, 4), np.float32)
      _write_npz(path, **_layout(x, x))
      content = open(path, "rb").read()[:200]
    _write(path, content)
    with self.assertRaisesRegex(
        data.DataError,
        rf"^--data_path={re.escape(path)}: {reason}; --dataset=npz needs"):
      data.load("npz", data_path=path)

  def test_single_npy(self):
    path = os.path.join(testutil.make_tempdir(self), "x.npy")
    np.save(path, np.zeros(3))
    with self.assertRaisesRegex(data.DataError,
                                r"holds a single \.npy array, not an \.npz"):
      data.load("npz", data_path=path)

  def test_missing_key(self):
    x = np.zeros((3, 2), np.float32)
    arrays = _layout(x, x)
    del arrays["y_test"]
    path = self._npz(**arrays)
    with self.assertRaisesRegex(
        data.DataError, rf"^--data_path={re.escape(path)}: missing key "
        r"'y_test' \(found .*\); --dataset=npz needs a keras-layout \.npz with "
        r"keys x_train, y_train, x_test, y_test$"):
      data.load("npz", data_path=path)

  @parameterized.named_parameters(
      ("length_mismatch", dict(y_train=np.arange(4)),
       r"x_train has 3 examples but y_train has 4"),
      ("negative_label", dict(y_test=np.array([0, -1, 2])),
       r"y_test holds value -1; labels must be non-negative integer"),
      ("fractional_label", dict(y_train=np.array([0.5, 1, 2])),
       r"y_train holds value 0.5; labels must be non-negative integer"),
      ("nan_label", dict(y_train=np.array([0, np.nan, 2])),
       r"y_train holds value nan; labels must be non-negative integer"),
      ("text_label", dict(y_train=np.array(["a", "b", "c"])),
       r"y_train holds <U1 values; labels must be non-negative integer"),
      ("label_rank", dict(y_train=np.zeros((3, 2), np.int64)),
       r"y_train has shape \(3, 2\); accepted: \[N\] or \[N, 1\]"),
      ("shapes_differ", dict(x_test=np.zeros((3, 5), np.float32)),
       r"x_train examples have shape \(2,\) but x_test examples have shape "
       r"\(5,\)"),
      ("empty_split", dict(x_test=np.zeros((0, 2), np.float32),
                           y_test=np.zeros(0, np.int64)),
       r"x_test is empty; each split needs at least one example"),
      ("x_rank", dict(x_train=np.zeros(3, np.float32)),
       r"x_train has shape \(3,\); accepted: \[N, D\], \[N, H, W\] or "
       r"\[N, H, W, C\]"),
      ("x_dtype", dict(x_train=np.zeros((3, 2), np.int32)),
       r"x_train has dtype int32; accepted: uint8 \(scaled by 1/255\) or a "
       r"float type"),
      ("x_nan", dict(x_test=np.full((3, 2), np.nan, np.float32)),
       r"x_test contains NaN or Inf"))
  def test_bad_arrays(self, override, reason):
    x = np.zeros((3, 2), np.float32)
    arrays = _layout(x, x)
    arrays.update(override)
    path = self._npz(**arrays)
    with self.assertRaisesRegex(
        data.DataError, rf"^--data_path={re.escape(path)}: {reason}"):
      data.load("npz", data_path=path)


if __name__ == "__main__":
  absltest.main()
