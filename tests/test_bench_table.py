"""The bench's table and figures, and the machine it names: pure functions
of bench.json's figures and /proc/cpuinfo, checked without running a bench.
"""

import os
import statistics
import threading

from absl.testing import absltest

from ps_trainer.experiments import bench
from ps_trainer.experiments import bench_table
from ps_trainer.experiments import machine


class BenchTableTest(absltest.TestCase):

  @staticmethod
  def result(rates, measured_secs=30.0, busy=0.1, split=None, changed=()):
    """bench.json's figures for label -> the steps/s of each of its runs."""
    local = statistics.median(rates["local (1 process)"])
    runs = [dict(label=label, steps_per_sec=statistics.median(each),
                 steps_per_sec_each=each, measured_secs_each=[measured_secs] * len(each),
                 examples_per_sec=64 * statistics.median(each),
                 vs_local=statistics.median(each) / local,
                 ms_per_step=1000 / statistics.median(each), split=split)
            for label, each in rates.items()]
    by_label = {run["label"]: run["steps_per_sec"] for run in runs}
    cluster, plain = rates["1 PS + 1 worker"], rates["plain TF1, 1 PS + 1 worker"]
    return {"runs": runs, "busy_cores_at_start": busy, "cores": 2,
            "changed_from_reference": list(changed),
            "cluster_vs_local": by_label["1 PS + 1 worker"] / local,
            "cluster_vs_local_each": [c / l for c, l in zip(cluster, rates["local (1 process)"])],
            "cluster_vs_plain_tf1": (by_label["1 PS + 1 worker"]
                                     / by_label["plain TF1, 1 PS + 1 worker"]),
            "cluster_vs_plain_tf1_each": [c / p for c, p in zip(cluster, plain)]}

  def test_a_ratio_just_under_a_target_does_not_print_as_the_target(self):
    lines = bench_table.table(self.result({
        "local (1 process)": [1286.5], "1 PS + 1 worker": [642.2],
        "plain TF1, 1 PS + 1 worker": [321.2]})).splitlines()
    self.assertIn("1 PS + 1 worker / local: 0.499 (target >= 0.5: NOT met)", lines)
    self.assertIn("1 PS + 1 worker / plain TF1: 1.999x (target >= 2.0x: NOT met)", lines)
    self.assertEmpty([line for line in lines if line.startswith("warning")])

  def test_each_rounds_ratios_and_how_many_met_the_target(self):
    # The rounds of the bench of 2026-11-29 05:10: the ratio of medians missed 0.5, two rounds
    # of three met it.
    rates = {"local (1 process)": [329.7, 384.9, 223.0], "1 PS + 1 worker": [157.3, 199.8, 125.1],
             "plain TF1, 1 PS + 1 worker": [89.8, 85.5, 81.3]}
    lines = bench_table.table(self.result(rates)).splitlines()
    at = lines.index("1 PS + 1 worker / local: 0.477 (target >= 0.5: NOT met)")
    self.assertEqual(lines[at + 1], "  each round: 0.477, 0.519, 0.561 (target met in 2 of 3)")
    at = lines.index("1 PS + 1 worker / plain TF1: 1.840x (target >= 2.0x: NOT met)")
    self.assertEqual(lines[at + 1], "  each round: 1.752x, 2.337x, 1.539x (target met in 1 of 3)")
    # The figures pair the runs of each round, as the table does.
    def row(label):
      return bench.Row(label, rates[label], [0.0] * 3, [5.0] * 3, None, None)
    figures = bench.figures([row(label) for label in rates], dict(bench.REFERENCE_WORK))
    self.assertEqual([round(r, 3) for r in figures["cluster_vs_local_each"]],
                     [0.477, 0.519, 0.561])
    self.assertEqual([round(r, 3) for r in figures["cluster_vs_plain_tf1_each"]],
                     [1.752, 2.337, 1.539])
    # Work other than the reference shows its rounds without a verdict; one round, no line.
    lines = bench_table.table(self.result(rates, changed=["--batch_size=128"])).splitlines()
    self.assertIn("  each round: 0.477, 0.519, 0.561", lines)
    lines = bench_table.table(self.result({label: each[:1] for label, each in rates.items()}))
    self.assertNotIn("each round:", lines)

  def test_the_bare_step_is_a_floor_without_a_target(self):
    rates = {"local (1 process)": [626.6, 535.8, 656.3], "1 PS + 1 worker": [267.7, 259.8, 287.7],
             "plain TF1, 1 PS + 1 worker": [126.0, 133.5, 124.2],
             "bare step, 1 PS + 1 worker": [290.0, 300.0, 310.0],
             "bare step, local (1 process)": [700.0, 600.0, 0.0]}

    def row(label):
      return bench.Row(label, rates[label], [0.0] * 3, [5.0] * 3, None, None)
    figures = bench.figures([row(label) for label in rates], dict(bench.REFERENCE_WORK))
    self.assertAlmostEqual(figures["cluster_vs_bare_step"], 267.7 / 300.0)
    self.assertEqual([round(r, 3) for r in figures["cluster_vs_bare_step_each"]],
                     [0.923, 0.866, 0.928])
    bare_run = next(r for r in figures["runs"] if r["label"] == "bare step, 1 PS + 1 worker")
    self.assertAlmostEqual(bare_run["vs_local"], 300.0 / 626.6)
    # The first target's ratio for the bare step itself, like for like; a round whose bare local
    # run had no speed has no ratio.
    self.assertAlmostEqual(figures["bare_step_vs_bare_local"], 300.0 / 600.0)
    self.assertEqual([None if r is None else round(r, 3)
                      for r in figures["bare_step_vs_bare_local_each"]], [0.414, 0.5, None])
    floors = {key: value for key, value in figures.items()
              if key.startswith(("cluster_vs_bare_step", "bare_step_vs_bare_local"))}
    lines = bench_table.table(dict(self.result(rates), **floors)).splitlines()
    at = lines.index("1 PS + 1 worker / bare step: 0.892 (no target; the bare step is the same "
                     "step with nothing around it)")
    self.assertEqual(lines[at + 1], "  each round: 0.923, 0.866, 0.928")
    self.assertEqual(lines[at + 2:at + 4], [
        "bare step, 1 PS + 1 worker / bare step, local: 0.500 (no target; what 1 PS + 1 worker "
        "costs this step, with nothing around it in either mode)",
        "  each round: 0.414, 0.500, -"])
    row = next(line for line in lines if line.startswith("bare step, 1 PS + 1 worker "))
    self.assertEqual(row.split()[7:11], ["3", "300.0", "(290-310)", "19200"])
    legend = [line for line in lines if line.startswith(("bare step: the trainer's step",
                                                         "bare step, local: its local step"))]
    self.assertLen(legend, 2)
    # A bench.json from before the bare local row: no such line, nor its legend.
    older = {label: each for label, each in rates.items() if label != "bare step, local (1 process)"}
    lines = bench_table.table(dict(self.result(older), cluster_vs_bare_step=267.7 / 300.0,
                                   cluster_vs_bare_step_each=[0.923, 0.866, None])).splitlines()
    at = lines.index("1 PS + 1 worker / bare step: 0.892 (no target; the bare step is the same "
                     "step with nothing around it)")
    self.assertEqual(lines[at + 1], "  each round: 0.923, 0.866, -")
    self.assertEmpty([line for line in lines if "bare step, local" in line])
    # Without it, the table says why (the work changed the trainer's step), and its legend goes.
    without = {label: each for label, each in rates.items() if not label.startswith("bare")}
    lines = bench_table.table(self.result(without, changed=["--wire_dtype=bfloat16"])).splitlines()
    self.assertIn("bare step: not run (it builds the trainer's step at the trainer's defaults; "
                  "this work sets --wire_dtype=bfloat16)", lines)
    self.assertEmpty([line for line in lines if line.startswith("1 PS + 1 worker / bare")
                      or line.startswith("bare step: the trainer's step")])

  def test_the_bare_step_runs_only_where_its_step_is_the_trainers(self):
    reference = dict(bench.REFERENCE_WORK)
    self.assertEqual(bench.bare_step_args(reference), bench.plain_tf1_args(reference))
    # What it takes through plain_tf1's flags, and what does not change the step.
    self.assertIsNotNone(bench.bare_step_args(
        dict(reference, hidden_units="64,64", batch_size="128", learning_rate="0.1",
             train_steps="500", seed="3")))
    # What changes the trainer's step but not the bare step's, and another model or optimizer.
    for changed in (dict(wire_dtype="bfloat16"), dict(factored_gradients="false"),
                    dict(pin_cpus="false"), dict(model="cnn"), dict(optimizer="adam")):
      self.assertIsNone(bench.bare_step_args(dict(reference, **changed)), changed)

  def test_the_targets_are_judged_on_the_reference_work_only(self):
    lines = bench_table.table(self.result({
        "local (1 process)": [1252.3], "1 PS + 1 worker": [627.4],
        "plain TF1, 1 PS + 1 worker": [284.4]},
        changed=["--wire_dtype=bfloat16"])).splitlines()
    self.assertIn("1 PS + 1 worker / local: 0.501", lines)
    self.assertIn("1 PS + 1 worker / plain TF1: 2.206x", lines)
    self.assertIn("targets (>= 0.5 of local, >= 2.0x plain TF1): not judged; they are for the "
                  "reference work, and this one sets --wire_dtype=bfloat16", lines)
    self.assertEmpty([line for line in lines if "met" in line])

  def test_what_changes_the_reference_work(self):
    reference = dict(bench.REFERENCE_WORK)
    # How long the runs measure or wait, the seed, a trainer default spelled out and the layers
    # written with spaces leave it the reference: the targets are judged.
    self.assertEqual(bench.changed_from_reference(
        dict(reference, train_steps="10000", learning_rate="0.010", wire_dtype="float32",
             factored_gradients="true", wait_timeout_secs="30", seed="7",
             hidden_units="256, 256")), [])
    self.assertEqual(bench.changed_from_reference(
        dict(reference, hidden_units="64,64", wire_dtype="bfloat16")),
        ["--hidden_units=64,64", "--wire_dtype=bfloat16"])

  def test_each_row_says_how_many_runs_and_their_range_and_the_split_its_parts(self):
    split = {"total_ms": 1.5, "wall_ms": 2.07, "outside_ms": 0.57,
             "ms": {"compute": 0.8, "input": 0.1, "ps": 0.4, "transfer": 0.15, "other": 0.05},
             "bytes_to_worker": 1_077_376, "bytes_to_ps": 410_000}
    lines = bench_table.table(self.result({
        "local (1 process)": [1011.0, 1262.0, 1276.0], "1 PS + 1 worker": [569.0, 460.0, 484.0],
        "plain TF1, 1 PS + 1 worker": [243.0, 204.0, 214.0], "1 PS + 2 workers, async": [467.8]},
        split=split)).splitlines()
    row = next(line for line in lines if line.startswith("1 PS + 1 worker "))
    self.assertEqual(row.split()[5:8], ["3", "484.0", "(460-569)"])
    async_row = next(line for line in lines if line.startswith("1 PS + 2 workers, async"))
    self.assertEqual(async_row.split()[6:8], ["1", "467.8"])  # One run: no range.
    self.assertNotIn("(", async_row)
    split_row = [line for line in lines if line.startswith("1 PS + 1 worker ")][1]
    self.assertEqual(split_row.split()[5:], ["2.07", "0.80", "0.10", "0.40", "0.15", "0.05",
                                             "0.57", "1.08", "/", "0.41"])

  def test_runs_of_one_setup_far_apart_are_named(self):
    # The bench of 2026-11-29 09:56: local mode's runs 58% apart, the cluster's 32%.
    lines = bench_table.table(self.result({
        "local (1 process)": [219.8, 346.6, 286.7], "1 PS + 1 worker": [205.9, 156.5, 165.7],
        "plain TF1, 1 PS + 1 worker": [89.2, 86.5, 82.5]})).splitlines()
    self.assertEqual([line for line in lines if line.startswith("warning")], [
        "warning: the runs of one setup differed by up to 58% (local (1 process): 219.8 to "
        "346.6 steps/s): the machine's speed wandered during the bench, so the ratios can move "
        "as much from one bench to the next; more --rounds steady the medians"])
    # The steady bench of 2026-11-26 05:50 (every setup within 3%), and one run each: no warning.
    steady = {"local (1 process)": [1429.0, 1451.0, 1470.0],
              "1 PS + 1 worker": [701.0, 701.0, 699.0],
              "plain TF1, 1 PS + 1 worker": [338.0, 337.0, 340.0]}
    for rates in (steady, {label: each[:1] for label, each in steady.items()}):
      lines = bench_table.table(self.result(rates)).splitlines()
      self.assertEmpty([line for line in lines if line.startswith("warning")])

  def test_a_busy_machine_and_short_windows_are_named(self):
    lines = bench_table.table(self.result({
        "local (1 process)": [2659.0, 1822.0], "1 PS + 1 worker": [782.0, 700.0],
        "plain TF1, 1 PS + 1 worker": [300.0, 310.0]}, measured_secs=0.4, busy=1.6)).splitlines()
    self.assertIn("warning: the machine was busy when the bench started (other work used 1.6 "
                  "of its 2 cores): it shares the cores, so these figures are low and noisy",
                  lines)
    self.assertIn("warning: 6 of 6 runs measured their speed over less than 1 s (shortest: "
                  "1 PS + 1 worker, 0.4 s): start-up still weighs in such figures; raise "
                  "--train_steps", lines)


class MachineTest(absltest.TestCase):
  """The bench names the machine it ran on: benches compare only on the same kind."""

  CPUINFO = ("processor\t: 0\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 1996.248\n"
             "flags\t\t: fpu sse4_2 avx f16c avx2 fma\n\n"
             "processor\t: 1\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2400.000\n"
             "flags\t\t: fpu sse4_2 avx f16c avx2 fma avx512f\n")

  def test_the_first_cores_model_clock_and_vector_extensions(self):
    self.assertEqual(machine.from_cpuinfo(self.CPUINFO),
                     {"cpu": "AMD EPYC", "mhz": 1996, "vector": ["avx2", "fma", "avx"]})
    self.assertEqual(machine.from_cpuinfo("processor : 0\n"),
                     {"cpu": None, "mhz": None, "vector": []})

  def test_the_summary_says_what_is_missing_too(self):
    info = dict(machine.from_cpuinfo(self.CPUINFO), cores=2, memory_gib=23.5,
                tensorflow="2.21.0")
    self.assertEqual(machine.summary(info), "2 cores of AMD EPYC at 1996 MHz (avx2 fma avx, "
                     "no avx512f), 23.5 GiB, TensorFlow 2.21.0")
    self.assertEqual(machine.summary(dict(info, vector=["avx512f", "avx2"], mhz=None,
                                          tensorflow=None)),
                     "2 cores of AMD EPYC (avx512f avx2), 23.5 GiB")
    self.assertEqual(machine.summary({"cpu": None, "cores": 4, "vector": []}),
                     "4 cores of an unknown CPU")

  def test_busy_cores_counts_work_running_now(self):
    idle = machine.busy_cores(0.5)
    stop = threading.Event()

    def spin():
      while not stop.is_set():
        pass

    spinning = threading.Thread(target=spin, daemon=True)
    spinning.start()
    busy = machine.busy_cores(0.5)
    stop.set()
    spinning.join()
    self.assertBetween(idle, 0.0, os.cpu_count())
    # One thread of Python spins one core (other work on the machine may add to it).
    self.assertGreater(busy, 0.6)

  def test_this_machine_and_the_table_line(self):
    info = machine.describe()
    self.assertEqual(info["cores"], os.cpu_count())
    self.assertEqual(info["tensorflow"], "2.21.0")  # requirements.txt's pin
    self.assertGreater(info["memory_gib"], 0)
    lines = bench_table.table(dict(BenchTableTest.result({
        "local (1 process)": [1300.0], "1 PS + 1 worker": [600.0],
        "plain TF1, 1 PS + 1 worker": [280.0]}), machine=info)).splitlines()
    self.assertIn(f"machine: {machine.summary(info)}", lines)


if __name__ == "__main__":
  absltest.main()
