"""Throughput figures and result.json writing, with a fake clock (no session runs)."""

import contextlib
import io
import json
import os
import time

from absl.testing import absltest

from ps_trainer import models
from ps_trainer.datasets import data
from ps_trainer.graph import optimizers
from ps_trainer.settings import flags as flags_lib
from ps_trainer.training import hooks

import testutil


class ThroughputTest(absltest.TestCase):

  def run_steps(self, throughput, clock, steps, secs_per_step):
    for step in steps:
      clock.now += secs_per_step
      throughput.observe(step)

  def test_warm_up_is_left_out(self):
    clock = testutil.ManualClock()
    throughput = hooks.Throughput(train_steps=100, clock=clock)
    throughput.session_started()
    self.run_steps(throughput, clock, range(1, 10), secs_per_step=1.0)  # Slow start.
    self.run_steps(throughput, clock, range(10, 101), secs_per_step=0.1)
    # Measured from step 11 (the first step seen, 1, plus 10% of the 99 left): 89 steps in
    # 8.9 s.
    self.assertAlmostEqual(throughput.steps_per_sec(), 10.0)
    self.assertAlmostEqual(throughput.wall_secs(), 9 * 1.0 + 91 * 0.1)
    measured = throughput.measured()
    self.assertEqual(measured["measured_from_step"], 11)
    self.assertAlmostEqual(measured["measured_secs"], 8.9)

  def test_traced_steps_are_left_out_too_from_where_the_process_started(self):
    # A fresh run from step 1, and one resumed at 9901: 30 traced steps after each start.
    for first, last, seen in ((1, 100, 31), (9901, 10_000, 9931)):
      with self.subTest(first=first):
        clock = testutil.ManualClock()
        throughput = hooks.Throughput(train_steps=last, clock=clock, skip_steps=30)
        self.run_steps(throughput, clock, range(first, first + 30), secs_per_step=1.0)  # Traced.
        self.run_steps(throughput, clock, range(first + 30, last + 1), secs_per_step=0.1)
        # Not from 10% of the steps left: without the traced steps, 10 steps/s.
        self.assertAlmostEqual(throughput.steps_per_sec(), 10.0)
        self.assertEqual(throughput.measured()["measured_from_step"], seen)

  def test_one_step_timed_has_no_window(self):
    throughput = hooks.Throughput(train_steps=10, clock=testutil.ManualClock())
    throughput.observe(10)
    self.assertIsNone(throughput.steps_per_sec())
    self.assertEqual(throughput.measured(), {"measured_from_step": None, "measured_secs": None})

  def test_a_resumed_run_measures_from_where_it_started(self):
    clock = testutil.ManualClock()
    throughput = hooks.Throughput(train_steps=200, clock=clock)
    self.run_steps(throughput, clock, range(101, 111), secs_per_step=5.0)
    self.run_steps(throughput, clock, range(111, 201), secs_per_step=0.5)
    self.assertAlmostEqual(throughput.steps_per_sec(), 2.0)

  def test_measurement_restarts_when_the_step_goes_back(self):
    clock = testutil.ManualClock()
    throughput = hooks.Throughput(train_steps=100, clock=clock)
    self.run_steps(throughput, clock, range(1, 61), secs_per_step=0.1)
    clock.now += 30  # A PS restarted; the model came back from step 20.
    self.run_steps(throughput, clock, range(20, 101), secs_per_step=0.25)
    self.assertAlmostEqual(throughput.steps_per_sec(), 4.0)

  def test_no_steps_timed_is_no_speed_not_zero(self):
    throughput = hooks.Throughput(train_steps=10, clock=testutil.ManualClock())
    self.assertIsNone(throughput.steps_per_sec())
    self.assertIsNone(throughput.wall_secs())
    self.assertEqual(throughput.steps_observed, 0)


class _Session:
  """Answers the one tensor ResultHook reads."""

  def __init__(self, global_step):
    self.global_step = global_step

  def run(self, unused_fetch):
    return self.global_step


class ProgressHookTest(absltest.TestCase):

  def started_at(self, global_step: int) -> str:
    hook = hooks.ProgressHook("chief", "loss", "gs", train_steps=60000, examples_per_global_step=64,
                              every_steps=100, throughput=hooks.Throughput(train_steps=60000))
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      hook.after_create_session(_Session(global_step), coord=None)
    return output.getvalue()

  def test_a_resumed_run_says_where_it_starts(self):
    self.assertEqual(self.started_at(0), "")
    self.assertEqual(self.started_at(30000), "chief: starting at global step 30000 of 60000\n")
    self.assertEqual(self.started_at(60000), "chief: starting at global step 60000 of 60000\n")
    # Resumed with a smaller --train_steps: not "62045 of 60000".
    self.assertEqual(self.started_at(62045),
                     "chief: starting at global step 62045, already past --train_steps=60000\n")


  def test_a_progress_line_gives_the_time_of_day_and_the_time_left(self):
    clock = testutil.ManualClock()
    wall = time.mktime((2026, 12, 7, 14, 3, 27, 0, 0, -1))
    hook = hooks.ProgressHook("chief", "loss", "gs", train_steps=60000, examples_per_global_step=64,
                              every_steps=2, throughput=hooks.Throughput(train_steps=60000),
                              clock=clock, wall_clock=lambda: wall)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      for step in (1000, 1010):  # 10 global steps in 2 s: 5 steps/s, 58990 left.
        hook.after_run(None, _RunValues(step))
        clock.now += 2.0
    self.assertEqual(output.getvalue(), "chief: step 1010/60000  loss 0.5000  5.0 steps/s  320 "
                     "examples/s  14:03:27  eta 3h16m\n")

  def test_durations_read_as_a_person_writes_them(self):
    self.assertEqual([hooks.duration(s) for s in (0.4, 45, 725, 11220)],
                     ["0s", "45s", "12m05s", "3h07m"])


class _RunValues:
  def __init__(self, global_step):
    self.results = {"loss": 0.5, "global_step": global_step}


class ResultHookTest(absltest.TestCase):

  def hook(self, path, throughput, progress=None):
    return hooks.ResultHook(
        evaluate=lambda session: {"loss": 0.25, "accuracy": 0.75,
                                  "metrics": {"loss": 0.25, "accuracy": 0.75}},
        global_step="gs", throughput=throughput, examples_per_global_step=64,
        fields={"sync_replicas": False, "num_workers": 2, "num_ps": 1},
        log_dir=os.path.dirname(path), progress=progress)

  def test_writes_the_figures(self):
    path = os.path.join(testutil.make_tempdir(self), "result.json")
    clock = testutil.ManualClock()
    throughput = hooks.Throughput(train_steps=20, clock=clock)
    throughput.session_started()
    for step in range(1, 21):
      clock.now += 0.5
      throughput.observe(step)
    self.hook(path, throughput).end(_Session(20))
    with open(path) as f:
      result = json.load(f)
    self.assertEqual(result["global_step"], 20)
    self.assertEqual((result["loss"], result["accuracy"]), (0.25, 0.75))
    self.assertAlmostEqual(result["steps_per_sec"], 2.0)
    self.assertAlmostEqual(result["examples_per_sec"], 128.0)
    self.assertAlmostEqual(result["wall_secs"], 10.0)
    self.assertEqual(result["measured_from_step"], 3)  # 1 + 10% of the 19 steps left
    self.assertAlmostEqual(result["measured_secs"], 8.5)
    self.assertIsNone(result["train_loss"])  # Never NaN: that is not JSON.

  def test_a_finished_job_started_again_keeps_its_result(self):
    path = os.path.join(testutil.make_tempdir(self), "result.json")
    with open(path, "w") as f:
      json.dump({"global_step": 20, "steps_per_sec": 2.0}, f)
    hook = self.hook(path, hooks.Throughput(train_steps=20, clock=testutil.ManualClock()))
    hook.end(_Session(20))
    with open(path) as f:
      self.assertEqual(json.load(f), {"global_step": 20, "steps_per_sec": 2.0})
    self.assertEqual(hook.result["steps_per_sec"], 2.0)

  def test_an_earlier_shorter_runs_result_is_not_kept(self):
    # A chief that timed no steps at the end of a longer run than that file's.
    path = os.path.join(testutil.make_tempdir(self), "result.json")
    with open(path, "w") as f:
      json.dump({"global_step": 10, "steps_per_sec": 2.0}, f)
    hook = self.hook(path, hooks.Throughput(train_steps=20, clock=testutil.ManualClock()))
    hook.end(_Session(20))
    with open(path) as f:
      result = json.load(f)
    self.assertEqual((result["global_step"], result["accuracy"]), (20, 0.75))

  def test_a_result_json_cut_short_is_written_again(self):
    path = os.path.join(testutil.make_tempdir(self), "result.json")
    with open(path, "w") as f:
      f.write('{"global_step": 2')
    hook = self.hook(path, hooks.Throughput(train_steps=20, clock=testutil.ManualClock()))
    hook.end(_Session(20))
    with open(path) as f:
      result = json.load(f)
    self.assertEqual((result["global_step"], result["accuracy"]), (20, 0.75))
    self.assertIsNone(result["steps_per_sec"])  # No step was timed.

  def test_a_chief_that_timed_no_steps_reports_no_speed(self):
    # It started itself again (a hung step) while the other workers ended the run: the test
    # figures are its own, the speed nobody's.
    path = os.path.join(testutil.make_tempdir(self), "result.json")
    throughput = hooks.Throughput(train_steps=20, clock=testutil.ManualClock())
    throughput.session_started()
    hook = self.hook(path, throughput)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      hook.end(_Session(20))
    with open(path) as f:
      result = json.load(f)
    self.assertEqual((result["global_step"], result["accuracy"]), (20, 0.75))
    self.assertEqual((result["steps_per_sec"], result["examples_per_sec"],
                      result["wall_secs"]), (None, None, None))
    self.assertEqual(output.getvalue(), "done: step 20  test accuracy 0.7500  test loss 0.2500  "
                     "no speed: this process timed fewer than two steps  "
                     "(async, 2 worker(s), 1 PS)\n")

  def test_a_run_stopped_early_writes_no_result(self):
    path = os.path.join(testutil.make_tempdir(self), "result.json")
    throughput = hooks.Throughput(train_steps=20, clock=testutil.ManualClock())
    throughput.session_started()
    throughput.observe(7)
    hook = self.hook(path, throughput)
    hook.end(_Session(8))  # A signal stopped the run at step 8 of 20.
    self.assertFalse(os.path.exists(path))
    self.assertIsNone(hook.result)


class SummaryLineTest(absltest.TestCase):

  def test_says_how_the_run_was_trained(self):
    figures = dict(global_step=300, accuracy=0.98, loss=0.06, steps_per_sec=1000.0,
                   examples_per_sec=64000.0, wall_secs=1.5)
    cluster = dict(figures, mode="cluster", sync_replicas=False, num_workers=2, num_ps=1)
    self.assertEqual(hooks.summary_line(cluster),
                     "done: step 300  test accuracy 0.9800  test loss 0.0600  1000.0 steps/s  "
                     "64000 examples/s  1.5 s  (async, 2 worker(s), 1 PS)")
    self.assertTrue(hooks.summary_line(dict(cluster, sync_replicas=True)).endswith(
        "1.5 s  (sync, 2 worker(s), 1 PS)"))
    # One process has nothing to be async about, nor workers or PS tasks.
    local = dict(figures, mode="local", sync_replicas=False, num_workers=1, num_ps=0)
    self.assertTrue(hooks.summary_line(local).endswith("1.5 s  (local mode)"))


class NamesTest(absltest.TestCase):
  """flags.py keeps its own copies (it must not import TF); they must agree."""

  def test_flag_choices_match_the_modules(self):
    self.assertEqual(flags_lib.MODELS, models.MODELS)
    self.assertEqual(flags_lib.OPTIMIZERS, optimizers.OPTIMIZERS)
    self.assertEqual(flags_lib.DATASETS, data.DATASETS)


if __name__ == "__main__":
  absltest.main()
