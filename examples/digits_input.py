"""The input_fn of the digits examples: the 8x8 digits bundled with ps_trainer."""

import os

import numpy as np
import tensorflow as tf

import ps_trainer

DIGITS_PATH = os.path.join(os.path.dirname(__file__), "..", "ps_trainer", "assets", "digits.npz")


def input_fn(mode, input_context, params):
  """(images [batch, 8, 8, 1] float32 in [0, 1], labels [batch] int64), one pass."""
  split = "train" if mode == ps_trainer.ModeKeys.TRAIN else "test"
  with np.load(params.get("data_path", DIGITS_PATH)) as data:
    images = data[f"x_{split}"].astype(np.float32)
    labels = data[f"y_{split}"].astype(np.int64)
  if images.max() > 1.0:  # The bundled file is already scaled; a raw 0-16 or 0-255 copy is not.
    images /= images.max()
  images = images[..., np.newaxis]  # The channel axis Conv2D wants.
  dataset = tf.data.Dataset.from_tensor_slices((images, labels))
  # Each worker reads its own part, so the workers together see each example once per pass.
  dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  dataset = dataset.cache()
  if mode == ps_trainer.ModeKeys.TRAIN:
    dataset = dataset.shuffle(len(labels), seed=params.get("seed", 0))
  return dataset.batch(params.get("batch_size", 64))
