"""compare's figures and files from step records, and the records a step writes."""

import json
import os

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from ps_trainer.experiments import report
from ps_trainer.training import step_record
import testutil


def _records(losses, staleness=None, start=1000.0, step_secs=0.01):
  out = []
  for i, loss in enumerate(losses):
    record = {"time": start + i * step_secs, "step": i + 1, "loss": loss,
              "worker": "chief"}
    if staleness is not None:
      record["staleness"] = staleness[i]
    out.append(record)
  return out


def _run(steps_per_sec, records, accuracy=0.9, test_examples=400):
  return {"result": {"steps_per_sec": steps_per_sec,
                     "examples_per_sec": steps_per_sec * 64,
                     "wall_secs": 3.0, "loss": 0.1, "accuracy": accuracy,
                     "test_examples": test_examples, "global_step": len(records)},
          "process_secs": 10.0, "records": records}


class FiguresTest(absltest.TestCase):

  def test_staleness_distribution(self):
    dist = report.staleness(_records([1.0] * 10,
                                     staleness=[0] * 6 + [1] * 3 + [5]))
    self.assertEqual(dist["steps"], 10)
    self.assertAlmostEqual(dist["mean"], 0.8)
    self.assertEqual((dist["median"], dist["p90"], dist["max"]), (0, 1, 5))
    self.assertEqual(dist["counts"], {"0": 6, "1": 3, "5": 1})
    self.assertIsNone(report.staleness(_records([1.0] * 3)))

  def test_target_loss_is_the_worse_final_loss_and_both_modes_reach_it(self):
    fast = np.linspace(2.0, 0.2, 200).tolist()   # final 0.2
    slow = np.linspace(2.0, 0.5, 200).tolist()   # final 0.5
    fig = report.figures({"async": _run(100, _records(fast, [0] * 200)),
                          "sync": _run(50, _records(slow))}, None)
    # Smoothing lags a falling loss a little behind its last value.
    self.assertAlmostEqual(fig["target_loss"], 0.5 + 12 * 1.5 / 199, places=3)
    to_target = {m["mode"]: m["to_target"] for m in fig["modes"]}
    self.assertEqual(to_target["sync"]["step"], 200)
    self.assertLess(to_target["async"]["step"], 200)
    self.assertAlmostEqual(to_target["async"]["seconds"],
                           (to_target["async"]["step"] - 1) * 0.01)

  def test_a_given_target_that_a_mode_never_reaches(self):
    fig = report.figures({"sync": _run(50, _records([1.0] * 50))}, 0.1)
    self.assertIsNone(fig["modes"][0]["to_target"])
    self.assertIn("| sync | 50.0 |", report.markdown(fig, "cmd"))

  def test_an_accuracy_gap_within_chance_is_read_as_none(self):
    # A user's seeds 0 and 1 turned 0.9600 / 0.9675 round: 3 examples of 400.
    records = _records([1.0, 0.5])
    fig = report.figures({"async": _run(100, records, accuracy=0.96),
                          "sync": _run(50, records, accuracy=0.9675)}, None)
    self.assertEqual(report.accuracy_gap(fig["modes"]), (
        "Test accuracy: async and sync differ by 0.0075 on 400 test examples; the standard "
        "error of that gap is 0.0132. Within twice that, the gap can be chance: runs with "
        "other --seed values can turn it round. Read it as no difference unless it holds "
        "across seeds."))
    self.assertIn("Read it as no difference", report.markdown(fig, "cmd"))
    wide = report.figures({"async": _run(100, records, accuracy=0.90, test_examples=10000),
                           "sync": _run(50, records, accuracy=0.95, test_examples=10000)}, None)
    self.assertIn("More than twice that", report.accuracy_gap(wide["modes"]))
    # A result.json of an older version has no test_examples: no claim either way.
    old = report.figures({"async": _run(100, records, test_examples=None),
                          "sync": _run(50, records)}, None)
    self.assertIsNone(report.accuracy_gap(old["modes"]))

  def test_names_a_worker_that_started_late(self):
    # A short async run: worker 1's session came up after 40 of the 100 steps,
    # so the first 40 were the chief's alone.
    chief = _records([1.0] * 70, [0] * 70)
    late = [dict(r, step=40 + 2 * i, worker="worker-1")
            for i, r in enumerate(_records([1.0] * 30, [1] * 30, start=1000.4))]
    fig = report.figures({"async": _run(100, chief + late),
                          "sync": _run(50, _records([1.0] * 50))}, None)
    self.assertEqual(fig["modes"][0]["workers"],
                     {"chief": {"steps": 70, "first_step": 1},
                      "worker-1": {"steps": 30, "first_step": 40}})
    text = report.markdown(fig, "./launch.sh compare --out_dir=x")
    self.assertIn("| async | worker-1 | 30 | 40 |", text)
    self.assertIn("| sync | chief | 50 | 1 |", text)
    self.assertIn("Started late: worker-1 (async) first trained at global step 40 of 100. ",
                  text)
    on_time = report.figures({"sync": _run(50, _records([1.0] * 50))}, None)
    self.assertNotIn("Started late", report.markdown(on_time, "x"))

  def test_writes_the_three_files(self):
    out_dir = testutil.make_tempdir(self)
    fig = report.figures(
        {"async": _run(100, _records([2.0, 1.0, 0.5], [0, 2, 1])),
         "sync": _run(50, _records([2.0, 1.5, 1.0]))}, None)
    paths = report.write(fig, out_dir, "./launch.sh compare --out_dir=x")
    md, js, png = paths
    with open(md) as f:
      text = f.read()
    self.assertIn("| mode | steps/s | examples/s | train time (s) | wall time (s) |", text)
    self.assertIn("| async | 100.0 | 6400 | 3.0 | 10.0 |", text)
    # The final loss is smoothed like the curves: the header says over how many steps.
    self.assertIn("| final train loss (25-step mean) | test loss |", text)
    self.assertIn("## Gradient staleness (async)", text)
    self.assertIn("| 2 | 1 | 33.3% |", text)
    with open(js) as f:
      data = json.load(f)
    self.assertEqual([m["mode"] for m in data["modes"]], ["async", "sync"])
    self.assertEqual(data["command"], "./launch.sh compare --out_dir=x")
    with open(png, "rb") as f:
      self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
    self.assertGreater(os.path.getsize(png), 10_000)


class StepRecordHookTest(absltest.TestCase):

  def test_one_line_per_step_with_the_staleness_of_its_update(self):
    path = os.path.join(testutil.make_tempdir(self), "steps", "worker-1.jsonl")
    graph = tf.Graph()
    with graph.as_default():
      step = tf.compat.v1.train.get_or_create_global_step()
      read = tf.identity(step.read_value())
      # Three updates by "others" between this worker's read and its own update. Ordered
      # after the read: unordered, the read could run after them (a CI run saw staleness 0).
      with tf.control_dependencies([read]):
        other = tf.compat.v1.assign_add(step, 3)
        with tf.control_dependencies([other]):
          own = tf.compat.v1.assign_add(step, 1)
      loss = tf.constant(0.5)
      hook = step_record.StepRecordHook(path, loss, read, own,
                                        clock=iter([10.0, 11.0]).__next__)
      with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
        session.run(own.op)
        session.run(own.op)
    with open(path) as f:
      lines = [json.loads(line) for line in f]
    self.assertEqual(lines, [
        {"time": 10.0, "loss": 0.5, "step": 4, "staleness": 3},
        {"time": 11.0, "loss": 0.5, "step": 8, "staleness": 3}])

  def test_lines_reach_the_file_within_a_second_while_it_is_open(self):
    # What a SIGKILL'ed worker leaves: the file as it is on disk, unclosed.
    path = os.path.join(testutil.make_tempdir(self), "steps", "worker-0.jsonl")
    now = [1000.0]
    hook = step_record.StepRecordHook(path, tf.constant(0.5), tf.constant(0),
                                      clock=lambda: now[0])
    hook.after_create_session(None, None)
    self.addCleanup(hook.close)

    def step(read_step, secs):
      now[0] += secs
      hook.after_run(None, tf.compat.v1.train.SessionRunValues(
          results={"loss": 0.5, "read_step": read_step}, options=None,
          run_metadata=None))

    def steps_on_disk():
      with open(path) as f:
        return [json.loads(line)["step"] for line in f]

    step(0, 0.0)
    self.assertEqual(steps_on_disk(), [1])  # The first line: the file shows a start.
    for read_step in range(1, 50):
      step(read_step, 0.01)
    self.assertEqual(steps_on_disk(), [1])  # 0.49 s: still buffered, no flush per line.
    step(50, 0.6)
    self.assertEqual(steps_on_disk(), list(range(1, 52)))  # 1.09 s since the flush.
    step(51, -60.0)  # The clock set back: flushed, not held until it catches up.
    self.assertEqual(steps_on_disk(), list(range(1, 53)))


if __name__ == "__main__":
  absltest.main()
