"""Tests for ps_trainer.models: shapes, names, reuse, errors, training, scores.

Graph mode, no servers: every test builds its own tf.Graph and runs it in a
local session.
"""

import math

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from ps_trainer import models
from ps_trainer.datasets import data
from ps_trainer.models import model_fns
from ps_trainer.user_model import graphs
from ps_trainer.user_model import loading

tf.compat.v1.disable_eager_execution()


def _mlp_shapes(fan_in, num_classes=10):
  return {"model/hidden0/kernel": [fan_in, 32], "model/hidden0/bias": [32],
          "model/hidden1/kernel": [32, 16], "model/hidden1/bias": [16],
          "model/logits/kernel": [16, num_classes],
          "model/logits/bias": [num_classes]}


def _linear_shapes(fan_in, num_classes=10):
  return {"model/logits/kernel": [fan_in, num_classes],
          "model/logits/bias": [num_classes]}


def _cnn_shapes(channels, flat, num_classes=10):
  return {"model/conv/kernel": [3, 3, channels, 32], "model/conv/bias": [32],
          "model/dense/kernel": [flat, 64], "model/dense/bias": [64],
          "model/logits/kernel": [64, num_classes],
          "model/logits/bias": [num_classes]}


# (name, model, input_shape, num_classes, hidden_units, expected shapes).
# cnn: conv 3x3 VALID then 2x2 max-pool, so HxW -> ((H-2)//2)x((W-2)//2)x32.
_CASES = (
    ("linear_8x8", "linear", (8, 8, 1), 10, (), _linear_shapes(64)),
    ("linear_28x28", "linear", (28, 28, 1), 10, (), _linear_shapes(784)),
    ("linear_vector", "linear", (20,), 3, (), _linear_shapes(20, 3)),
    ("mlp_8x8", "mlp", (8, 8, 1), 10, (32, 16), _mlp_shapes(64)),
    ("mlp_28x28", "mlp", (28, 28, 1), 10, (32, 16), _mlp_shapes(784)),
    ("mlp_vector", "mlp", (20,), 3, (32, 16), _mlp_shapes(20, 3)),
    ("cnn_8x8", "cnn", (8, 8, 1), 10, (), _cnn_shapes(1, 3 * 3 * 32)),
    ("cnn_28x28", "cnn", (28, 28, 1), 10, (), _cnn_shapes(1, 13 * 13 * 32)),
    ("cnn_rgb", "cnn", (9, 7, 3), 4, (), _cnn_shapes(3, 3 * 2 * 32, 4)),
    ("cnn_smallest", "cnn", (4, 4, 1), 10, (), _cnn_shapes(1, 32)),
)


def _features(input_shape):
  return tf.compat.v1.placeholder(tf.float32, (None,) + tuple(input_shape),
                                  name="features")


class BuildLogitsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*_CASES)
  def test_logits_shape(self, model, input_shape, num_classes, hidden,
                        unused_shapes):
    with tf.Graph().as_default():
      features = _features(input_shape)
      logits = models.build_logits(model, features, input_shape, num_classes,
                                   hidden)
      self.assertEqual(logits.shape.as_list(), [None, num_classes])
      self.assertEqual(logits.dtype, tf.float32)
      batch = np.random.default_rng(0).random((5,) + input_shape, np.float32)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        value = session.run(logits, {features: batch})
      self.assertEqual(value.shape, (5, num_classes))
      self.assertTrue(np.all(np.isfinite(value)))

  @parameterized.named_parameters(*_CASES)
  def test_variables_under_model_scope(self, model, input_shape, num_classes,
                                       hidden, shapes):
    with tf.Graph().as_default():
      models.build_logits(model, _features(input_shape), input_shape,
                          num_classes, hidden)
      got = {v.op.name: v.shape.as_list()
             for v in tf.compat.v1.global_variables()}
      self.assertEqual(got, shapes)
      trainable = {v.op.name for v in tf.compat.v1.trainable_variables()}
      self.assertEqual(trainable, set(shapes))

  @parameterized.named_parameters(*_CASES)
  def test_second_build_reuses_variables(self, model, input_shape, num_classes,
                                         hidden, shapes):
    with tf.Graph().as_default():
      train_features = _features(input_shape)
      eval_features = _features(input_shape)
      train = models.build_logits(model, train_features, input_shape,
                                  num_classes, hidden)
      before = list(tf.compat.v1.global_variables())
      evaluation = models.build_logits(model, eval_features, input_shape,
                                       num_classes, hidden)
      after = list(tf.compat.v1.global_variables())
      self.assertLen(after, len(shapes))
      self.assertEqual([v.name for v in after], [v.name for v in before])
      # Same variables, so the same inputs give the same logits.
      batch = np.random.default_rng(1).random((3,) + input_shape, np.float32)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        a, b = session.run([train, evaluation],
                           {train_features: batch, eval_features: batch})
      self.assertAllClose(a, b)

  def test_mlp_without_hidden_units_is_linear(self):
    with tf.Graph().as_default():
      models.build_logits("mlp", _features((8, 8, 1)), (8, 8, 1), 10, ())
      got = {v.op.name: v.shape.as_list()
             for v in tf.compat.v1.global_variables()}
    self.assertEqual(got, _linear_shapes(64))

  def test_build_inside_outer_scope_keeps_model_prefix(self):
    with tf.Graph().as_default():
      with tf.compat.v1.variable_scope("tower"):
        models.build_logits("linear", _features((4,)), (4,), 2)
      names = sorted(v.op.name for v in tf.compat.v1.global_variables())
    self.assertEqual(names, ["tower/model/logits/bias",
                             "tower/model/logits/kernel"])


class ModelErrorTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(("vector", (64,)), ("matrix", (8, 8)),
                                  ("too_small", (3, 3, 1)),
                                  ("thin", (28, 3, 1)))
  def test_cnn_needs_images(self, input_shape):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(models.ModelError,
                                  r"--model=cnn needs images") as raised:
        models.build_logits("cnn", _features(input_shape), input_shape, 10)
      # No half-built model is left behind.
      self.assertEmpty(tf.compat.v1.global_variables())
    message = str(raised.exception)
    self.assertNotIn("\n", message)
    self.assertIn(str(tuple(input_shape)), message)
    self.assertRegex(message, r"--model=mlp or linear")

  def test_a_built_in_model_fn_says_so_in_its_own_words(self):
    # Through the contract's call, as the trainer builds it: the message
    # names the flags, with no file and line of the package.
    cnn = models.built_in("cnn", models.params_for("cnn", (64,), 10))
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          models.ModelError, r"^--model=cnn needs images of at least 4x4 "
          r"\(H, W, C\); this data set's examples have shape \(64,\); use "
          r"--model=mlp or linear$"):
        graphs.call_model_fn(cnn, _features((64,)),
                             tf.zeros([1], tf.int64), "train")
    with self.assertRaisesRegex(
        models.ModelError, r"^--model='resnet' is unknown; accepted: linear"):
      models.built_in("resnet", {})

  def test_model_error_is_a_value_error(self):
    self.assertTrue(issubclass(models.ModelError, ValueError))

  @parameterized.parameters("resnet", "MLP", "")
  def test_unknown_model_lists_accepted(self, name):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          models.ModelError,
          rf"^--model={name!r} is unknown; accepted: linear, mlp, cnn, wide_deep$"):
        models.build_logits(name, _features((4,)), (4,), 2)
      self.assertEmpty(tf.compat.v1.global_variables())


class TrainingTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ("linear", "linear", ()), ("mlp", "mlp", (32, 16)), ("cnn", "cnn", ()))
  def test_a_few_adam_steps_lower_the_loss(self, model, hidden):
    input_shape, num_classes, batch = (8, 8, 1), 10, 32
    rng = np.random.default_rng(42)
    x = rng.random((batch,) + input_shape, np.float32)
    y = rng.integers(0, num_classes, batch).astype(np.int64)
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(7)
      logits = models.build_logits(model, tf.constant(x), input_shape,
                                   num_classes, hidden)
      loss, accuracy = models.loss_and_accuracy(logits, tf.constant(y))
      train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        first = session.run(loss)
        for _ in range(30):
          session.run(train_op)
        last, last_accuracy = session.run([loss, accuracy])
    self.assertTrue(math.isfinite(first) and math.isfinite(last))
    # Random labels on 32 examples: the model can only memorize, which 30
    # Adam steps already start to do.
    self.assertLess(last, 0.8 * first, f"loss {first:.4f} -> {last:.4f}")
    self.assertGreater(last_accuracy, 0.2)


class ScoresTest(tf.test.TestCase):
  """Hand-computed figures.

  Rows (3 classes) and labels:
    [ln3, 0, 0]  label 0: p = 3/5, loss ln(5/3), predicted 0, correct
    [0, ln2, 0]  label 2: p = 1/4, loss ln 4,   predicted 1, wrong
    [0, ln4, 0]  label 1: p = 4/6, loss ln(3/2), predicted 1, correct
    [ln2, 0, 0]  label 2: p = 1/4, loss ln 4,   predicted 0, wrong
  Sum of losses: ln(5/3 * 4 * 3/2 * 4) = ln 40; 2 correct of 4.
  """

  LOGITS = np.log(np.array([[3, 1, 1], [1, 2, 1], [1, 4, 1], [2, 1, 1]],
                           np.float32))
  LABELS = [0, 2, 1, 2]

  def test_scores_are_exact_over_batches_of_unequal_size(self):
    # A model_fn whose logits are its features, scored in batches of 3 and 1.
    held_out = data.DataSet("npz", (3,), 3, None, None, self.LOGITS,
                            np.array(self.LABELS, np.int64))
    identity = loading.UserModel(
        model_fn=lambda features, labels, mode: model_fns.classifier_spec(
            features, labels, mode), input_fn=None)
    evaluation = graphs.Evaluation(identity,
                                   lambda: data.iterator_input(data.test_dataset(held_out, 3)))
    with tf.compat.v1.Session(graph=evaluation.graph) as session:
      scores = evaluation.evaluate(session)
    self.assertAllClose(scores["loss"], math.log(40.0) / 4, rtol=1e-6)
    self.assertEqual(scores["accuracy"], 0.5)
    self.assertEqual(scores["examples"], 4)
    self.assertEqual(sorted(scores["metrics"]), ["accuracy", "loss"])

  def test_loss_and_accuracy_are_the_means(self):
    with tf.Graph().as_default():
      loss, accuracy = models.loss_and_accuracy(
          tf.constant(self.LOGITS), tf.constant(self.LABELS, tf.int64))
      with tf.compat.v1.Session() as session:
        loss, accuracy = session.run([loss, accuracy])
    self.assertAllClose(loss, math.log(40.0) / 4, rtol=1e-6)
    self.assertEqual(accuracy, 0.5)


if __name__ == "__main__":
  tf.test.main()
