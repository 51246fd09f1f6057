"""A user's own tests of layers_mlp.py, with ps_trainer.testing (seconds, one process).

  .venv/bin/python -m pytest -q examples/test_my_model.py
"""

import numpy as np
import tensorflow as tf

import layers_mlp
import ps_trainer
from ps_trainer import testing


def test_predict_gives_ten_probabilities_per_example():
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    images = tf.constant(np.random.default_rng(0).random((4, 8, 8, 1)), tf.float32)
    spec = layers_mlp.model_fn(images, None, ps_trainer.ModeKeys.PREDICT, {"hidden_units": [16]})
    session.run(tf.compat.v1.global_variables_initializer())
    probabilities = session.run(spec.predictions["probabilities"])
  assert probabilities.shape == (4, 10)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_every_variable_goes_to_a_ps_task():
  devices = testing.placement(layers_mlp.model_fn, layers_mlp.input_fn, num_ps=2,
                              params={"hidden_units": [32]})
  assert sorted(devices) == ["dense/bias", "dense/kernel", "dense_1/bias", "dense_1/kernel"]
  assert set(devices.values()) == {"/job:ps/task:0", "/job:ps/task:1"}


def test_learns_the_digits_on_two_workers_in_sync():
  result = testing.train_in_process(layers_mlp.model_fn, layers_mlp.input_fn, num_ps=1,
                                    num_workers=2, sync_replicas=True, train_steps=150,
                                    params={"hidden_units": [32]})
  assert result["global_step"] == 150
  assert result["metrics"]["accuracy"] > 0.8
