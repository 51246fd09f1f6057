"""Runs that TF turns away as repeats are run again, in the replica's
MonitoredSession and in the trainer's other sessions (repeats.py)."""

import contextlib
import io
import re

from absl.testing import absltest
import tensorflow as tf

from ps_trainer.cluster import repeats
from ps_trainer.training import session as session_lib
import testutil

tf.compat.v1.disable_eager_execution()

# TF's words, as a worker sends them back (the request's fields shortened).
TURNED_AWAY = ("The same RunGraph (Worker) request was received twice. "
               'graph_handle: "000000000000000a" step_id: 93725175129263962 '
               "request_id: 4623698051449303168")


class _TurningAway(tf.compat.v1.Session):
  """A session whose next `failures` runs fail as TF fails a run that a task
  turned away: AbortedError(message), before any of the run is done."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.failures = 0
    self.message = TURNED_AWAY

  def _turn_away(self):
    if self.failures > 0:
      self.failures -= 1
      raise tf.errors.AbortedError(None, None, self.message)

  def run(self, *args, **kwargs):
    self._turn_away()
    return super().run(*args, **kwargs)

  def make_callable(self, *args, **kwargs):
    compiled = super().make_callable(*args, **kwargs)

    def run(*call_args, **call_kwargs):
      self._turn_away()
      return compiled(*call_args, **call_kwargs)
    return run


class RepeatProofSessionTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.global_step = tf.compat.v1.train.get_or_create_global_step()
      self.train_op = tf.compat.v1.assign_add(self.global_step, 1)
    self.inner = _TurningAway(graph=self.graph)
    self.session = repeats.RepeatProofSession(self.inner)
    self.session.run(self.global_step.initializer)

  def tearDown(self):
    self.session.close()
    super().tearDown()

  def test_a_run_turned_away_as_a_repeat_runs_again(self):
    self.inner.failures = 2  # Two in a row: by chance, less than once in 1e9 runs.
    self.assertEqual(self.session.run(self.train_op), 1)
    self.assertEqual(self.session.run(self.train_op), 2)

  def test_other_aborts_and_too_many_repeats_in_a_row_go_to_the_caller(self):
    for failures, message in ((1, "Session 1234 is not found."),
                              (repeats.MAX_TRIES, TURNED_AWAY)):
      self.inner.failures, self.inner.message = failures, message
      with self.assertRaisesRegex(tf.errors.AbortedError, re.escape(message)):
        self.session.run(self.train_op)
      self.assertEqual(self.inner.failures, 0)
    self.assertEqual(self.session.run(self.global_step), 0)

  def test_a_saver_accepts_it_and_saves_through_it(self):
    log_dir = testutil.make_tempdir(self)
    with self.graph.as_default():
      saver = tf.compat.v1.train.Saver()
    self.session.run(self.train_op)
    self.inner.failures = 1  # The save's own run is turned away once.
    path = saver.save(self.session, f"{log_dir}/model.ckpt")
    self.assertEqual(tf.train.load_variable(path, "global_step"), 1)


class _Creator(tf.compat.v1.train.SessionCreator):
  """Makes _TurningAway sessions with the model initialized."""

  def __init__(self, graph, init_op):
    self._graph = graph
    self._init_op = init_op
    self.made = []

  def create_session(self):
    session = _TurningAway(graph=self._graph)
    session.run(self._init_op)
    self.made.append(session)
    return session


class ReplicaSessionTest(absltest.TestCase):
  """The training session: a step turned away is run again in the same
  session, where MonitoredSession would make a new one as for a lost PS."""

  def run_steps(self, failures: int, message: str, steps: int = 3):
    graph = tf.Graph()
    with graph.as_default():
      global_step = tf.compat.v1.train.get_or_create_global_step()
      train_op = tf.compat.v1.assign_add(global_step, 1)
      creator = _Creator(graph, global_step.initializer)
      announced = session_lib._AnnouncedCreator(
          creator, before=lambda: None, who="chief", stopping=lambda: False,
          on_run_done=lambda: None)
      said = io.StringIO()
      with contextlib.redirect_stdout(said):
        with tf.compat.v1.train.MonitoredSession(
            session_creator=announced) as session:
          creator.made[0].failures, creator.made[0].message = failures, message
          reached = [int(session.run(train_op)) for _ in range(steps)]
    return reached, len(creator.made), said.getvalue()

  def test_a_step_turned_away_runs_again_in_the_same_session(self):
    reached, sessions, said = self.run_steps(1, TURNED_AWAY)
    self.assertEqual(reached, [1, 2, 3])
    self.assertEqual(sessions, 1)
    self.assertEqual(said, "chief: TensorFlow turned a run away as a repeat of "
                     "an earlier one (its request ids repeat by chance: "
                     "docs/faults-and-recovery.md); running it again\n")

  def test_another_abort_still_makes_a_new_session(self):
    reached, sessions, said = self.run_steps(1, "Session 1234 is not found.")
    # The new session initializes the model again: there is no PS to keep it.
    self.assertEqual(reached, [1, 2, 3])
    self.assertEqual(sessions, 2)
    self.assertIn("chief: lost the session (a PS or the chief stopped answering: "
                  "AbortedError: Session 1234 is not found.", said)
    self.assertNotIn("repeat", said)


if __name__ == "__main__":
  absltest.main()
