"""The synthetic data set: MNIST-shaped noisy class templates.

Ten fixed templates, each a sum of Gaussian blobs, scaled by a random
contrast and covered in uniform noise. Training batches are drawn in the graph
(`batch`), so a worker needs no data on disk and never runs out; the held-out
split and the bench's plain TF1 baseline draw the same distribution with numpy
(`arrays`).
"""

import numpy as np
import tensorflow as tf

SHAPE = (28, 28, 1)
CLASSES = 10
TEST_SIZE = 1000
TEST_SEED = 7
# Templates come from a fixed seed, so every worker and the held-out split
# agree on them; only the per-example draws are per worker.
_TEMPLATE_SEED = 20240101
# Noise of standard deviation 0.5 keeps the task learnable without it being
# solved by the first few steps. It is uniform, not Gaussian: a batch of 64
# draws 50 K noise values, and TF draws uniform ones 2.6 times as fast as
# normal ones (Box-Muller). A Gaussian batch cost 0.5-0.9 ms of a core, as
# much as half the reference model's step; on a host whose cores the PS and
# the worker share, the bench then measured the random numbers as much as the
# cluster (docs/performance.md, item 6).
_NOISE_STDDEV = 0.5
_NOISE_HALF_WIDTH = _NOISE_STDDEV * 3 ** 0.5  # U(-a, a) has std a / sqrt(3).
_CONTRAST_RANGE = (0.5, 1.0)


def _templates():
  """Returns the fixed class templates, float32 [classes, 28, 28, 1] in [0, 1].

  Each class is a sum of three Gaussian blobs at seeded places: smooth, image
  like, and far enough apart between classes for a linear model.
  """
  rng = np.random.default_rng(_TEMPLATE_SEED)
  rows, cols = np.mgrid[0:SHAPE[0], 0:SHAPE[1]]
  templates = np.zeros((CLASSES,) + SHAPE[:2])
  for c in range(CLASSES):
    for _ in range(3):
      row, col = rng.uniform(6, SHAPE[0] - 6, 2)
      width = rng.uniform(1.5, 3.5)
      templates[c] += np.exp(-((rows - row)**2 + (cols - col)**2) /
                             (2 * width**2))
  templates /= templates.max(axis=(1, 2), keepdims=True)
  return templates.astype(np.float32)[..., np.newaxis]


def arrays(n, seed):
  """Draws n examples with numpy: features float32 [n, 28, 28, 1] in [0, 1]
  and int64 labels."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, CLASSES, n)
  contrast = rng.uniform(*_CONTRAST_RANGE, n).astype(np.float32)
  noise = rng.uniform(-_NOISE_HALF_WIDTH, _NOISE_HALF_WIDTH,
                      (n,) + SHAPE).astype(np.float32)
  x = _templates()[labels] * contrast[:, None, None, None]
  x = np.clip(x + noise, 0.0, 1.0).astype(np.float32)
  return x, labels.astype(np.int64)


def batch(step, batch_size, seed):
  """Draws one batch in-graph, the same distribution as `arrays`.

  Stateless random ops keyed by (seed, step): a worker's stream depends only
  on its seed, not on the graph-level seed or on op creation order.
  """
  key = tf.stack([tf.constant(seed, tf.int64), step])
  label_key, contrast_key, noise_key = tf.unstack(
      tf.random.experimental.stateless_split(key, 3))
  labels = tf.random.stateless_uniform(
      [batch_size], label_key, 0, CLASSES, dtype=tf.int64)
  contrast = tf.random.stateless_uniform(
      [batch_size, 1, 1, 1], contrast_key, *_CONTRAST_RANGE)
  noise = tf.random.stateless_uniform(
      (batch_size,) + SHAPE, noise_key, -_NOISE_HALF_WIDTH, _NOISE_HALF_WIDTH)
  templates = tf.constant(_templates())  # 31 KB
  features = tf.clip_by_value(
      tf.gather(templates, labels) * contrast + noise, 0.0, 1.0)
  return features, labels
