"""`./launch.sh bench [--rounds=N] [--json] [--bench_dir=DIR] [--no_isolate]
[trainer flags]`: the price of distribution.

Trains the same work several ways on this machine and prints what each
costs: local mode (one process), 1 PS + 1 worker, the plain TF1 pattern on
1 PS + 1 worker (plain_tf1.py), the trainer's bare step there (bare_step.py:
its step with no input pipeline, hooks or checks around it, the floor TF's
runtime leaves) and the same bare step in one process, then 2 workers async
and sync. The first five run in turns, round after round (A B C D E A B C D E
...), so a machine that slows down mid-bench slows all of them alike; figures
are medians over the rounds. Speeds come from each run's result.json (steps/s
after the first 10% of steps and after the traced ones); the split of a step's
time from 10 traced steps of each run (tracing.py), which the speeds leave out.

Default work (the reference of the performance targets): --model=mlp
--hidden_units=256,256 --dataset=synthetic --batch_size=64 --optimizer=sgd
--learning_rate=0.01 --train_steps=3000. Trainer flags given here replace
these. --no_isolate (launch.sh's) runs the clusters in this machine's
network rather than in a private one with loopback only.
"""

import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

from absl import app
from absl import flags

from ps_trainer.console import output_dir
from ps_trainer.experiments import bench_table
from ps_trainer.experiments import machine
from ps_trainer.experiments import runs
from ps_trainer.experiments import trainer_args
from ps_trainer.settings import flags as trainer_flags

REFERENCE_WORK = {
    "model": "mlp", "hidden_units": "256,256", "dataset": "synthetic",
    "batch_size": "64", "optimizer": "sgd", "learning_rate": "0.01",
    "train_steps": "3000"}
TRACE_STEPS = 10
LOCAL = "local (1 process)"
CLUSTER = "1 PS + 1 worker"
PLAIN = "plain TF1, 1 PS + 1 worker"
BARE = "bare step, 1 PS + 1 worker"
BARE_LOCAL = "bare step, local (1 process)"
ASYNC2 = "1 PS + 2 workers, async"
SYNC2 = "1 PS + 2 workers, sync"

FLAGS = flags.FLAGS
flags.DEFINE_integer("rounds", 3, "Rounds of local / cluster / plain TF1 / bare "
                     "step (cluster, local) runs taken in turns; figures are "
                     "their medians.",
                     lower_bound=1)
flags.DEFINE_boolean("json", False, "Print the figures as JSON instead of a table.")
flags.DEFINE_string("bench_dir", "", "Where the runs write (default: a new "
                    "runs/bench-YYYYmmdd-HHMMSS).")


# Set by the bench for each run.
_OWNED = {"ps_hosts", "worker_hosts", "job_name", "task_index", "log_dir",
          "num_workers", "sync_replicas", "replicas_to_aggregate",
          "trace_steps"}


def plain_tf1_args(values: Dict[str, str]) -> Optional[List[str]]:
  """plain_tf1.py's flags for this work, or None if it cannot train it."""
  if (values["model"], values["dataset"], values["optimizer"]) != (
      "mlp", "synthetic", "sgd"):
    return None
  return [f"--{name}={values[name]}" for name in
          ("hidden_units", "batch_size", "learning_rate", "train_steps")]


# The trainer flags bare_step.py takes (through plain_tf1's); any other flag
# that changes the trainer's step (--wire_dtype, --nofactored_gradients,
# --nopin_cpus...) would leave the bare step another step than the trainer's.
_BARE_STEP_FLAGS = ("hidden_units", "batch_size", "learning_rate")


def bare_step_args(values: Dict[str, str]) -> Optional[List[str]]:
  """bare_step.py's flags for this work, or None if its step would not be the
  trainer's: it builds the trainer's step at the trainer's defaults."""
  args = plain_tf1_args(values)
  changed = [flag[2:].partition("=")[0] for flag in changed_from_reference(values)]
  if args is None or any(name not in _BARE_STEP_FLAGS for name in changed):
    return None
  return args


@dataclasses.dataclass
class Row:
  label: str
  steps_per_sec: List[float]
  examples_per_sec: List[float]
  measured_secs: List[Optional[float]]  # each run's window of steady steps
  split: Optional[dict]   # mean tracing split of the first run, if traced
  accuracy: Optional[float]

  def median(self, field: str) -> float:
    return statistics.median(getattr(self, field))


def _row(label: str, done: List[runs.Run], trace_file: str) -> Row:
  split = done[0].read(os.path.join("traces", trace_file)) if trace_file else None
  return Row(label,
             [r.result["steps_per_sec"] for r in done],
             [r.result.get("examples_per_sec", 0.0) for r in done],
             [r.result.get("measured_secs") for r in done],
             split, done[0].result.get("accuracy"))

# The run directories run_bench makes in --bench_dir.
RUN_DIRS = ("local-*", "cluster-*", "plain-*", "bare-*",  # bare-local-* too
            "async-2", "sync-2")


def run_bench(values: Dict[str, str], rounds: int, bench_dir: str,
              say=print) -> List[Row]:
  """Runs everything (see the module doc) and returns one Row per setup."""
  flags_list = [f"--{k}={v}" for k, v in values.items()]
  traced = flags_list + [f"--trace_steps={TRACE_STEPS}"]
  plain_flags, bare_flags = plain_tf1_args(values), bare_step_args(values)
  done: Dict[str, List[runs.Run]] = {LOCAL: [], CLUSTER: [], PLAIN: [],
                                     BARE: [], BARE_LOCAL: []}

  def run(label, fn, *args):
    say(f"bench: {label} ...")
    result = fn(label, *args)
    say(f"bench: {label}: {result.result['steps_per_sec']:.1f} steps/s")
    return result

  for i in range(rounds):
    done[LOCAL].append(run(LOCAL, runs.run_local_process, traced,
                           os.path.join(bench_dir, f"local-{i}")))
    done[CLUSTER].append(run(CLUSTER, runs.run_local_cluster, 1, 1, traced,
                             os.path.join(bench_dir, f"cluster-{i}")))
    if plain_flags is not None:
      done[PLAIN].append(run(PLAIN, runs.run_plain_tf1_cluster, plain_flags,
                             os.path.join(bench_dir, f"plain-{i}")))
    if bare_flags is not None:
      done[BARE].append(run(BARE, runs.run_plain_tf1_cluster, bare_flags,
                            os.path.join(bench_dir, f"bare-{i}"), "bare_step"))
      done[BARE_LOCAL].append(run(
          BARE_LOCAL, runs.run_plain_tf1_local, bare_flags,
          os.path.join(bench_dir, f"bare-local-{i}"), "bare_step"))
  done[ASYNC2] = [run(ASYNC2, runs.run_local_cluster, 1, 2, traced,
                      os.path.join(bench_dir, "async-2"))]
  done[SYNC2] = [run(SYNC2, runs.run_local_cluster, 1, 2,
                     traced + ["--sync_replicas"],
                     os.path.join(bench_dir, "sync-2"))]
  trace_files = {LOCAL: "local.split.json", PLAIN: "", BARE: "", BARE_LOCAL: ""}
  return [_row(label, results, trace_files.get(label, "chief.split.json"))
          for label, results in done.items() if results]


# Flags that leave a step's work as it is, so the targets still apply: how long
# each run measures, how long a task waits for another at the start or end, and
# which numbers the synthetic data and initial weights are drawn from.
_NOT_THE_WORK = ("train_steps", "wait_timeout_secs", "seed")


def changed_from_reference(values: Dict[str, str]) -> List[str]:
  """The flags of this work that make it other than the targets' reference
  work: REFERENCE_WORK, with the trainer's defaults for every other flag."""
  reference, given = flags.FlagValues(), flags.FlagValues()
  names = trainer_flags.define_flags(reference)
  trainer_flags.define_flags(given)
  reference(["bench"] + [f"--{k}={v}" for k, v in REFERENCE_WORK.items()])
  given(["bench"] + [f"--{k}={v}" for k, v in values.items()])

  def value(flag_values, name):
    # A string flag: "256, 256" is the reference's "256,256".
    if name == "hidden_units":
      return trainer_flags.parse_hidden_units(flag_values[name].value)
    return flag_values[name].value

  return [f"--{name}={values[name]}" for name in names
          if name in values and name not in _NOT_THE_WORK
          and value(given, name) != value(reference, name)]


def figures(rows: List[Row], values: Dict[str, str],
            busy_at_start: Optional[float] = None,
            machine_info: Optional[dict] = None) -> dict:
  """The bench's figures as JSON-ready data, with the targets checked."""
  by_label = {row.label: row for row in rows}
  local = by_label[LOCAL].median("steps_per_sec")
  out = {"work": values, "changed_from_reference": changed_from_reference(values),
         "runs": [], "busy_cores_at_start": busy_at_start,
         "cores": os.cpu_count(), "machine": machine_info}
  for row in rows:
    steps = row.median("steps_per_sec")
    out["runs"].append({
        "label": row.label,
        "steps_per_sec": steps,
        "steps_per_sec_each": row.steps_per_sec,
        "measured_secs_each": row.measured_secs,
        "examples_per_sec": row.median("examples_per_sec"),
        "vs_local": steps / local if local else None,
        "ms_per_step": 1000.0 / steps if steps else None,
        "split": row.split,
        "accuracy": row.accuracy})
  cluster = by_label[CLUSTER].median("steps_per_sec")
  out["cluster_vs_local"] = cluster / local if local else None
  out["cluster_vs_local_each"] = _each_round(by_label[CLUSTER], by_label[LOCAL])
  if PLAIN in by_label:
    plain = by_label[PLAIN].median("steps_per_sec")
    out["cluster_vs_plain_tf1"] = cluster / plain if plain else None
    out["cluster_vs_plain_tf1_each"] = _each_round(by_label[CLUSTER],
                                                   by_label[PLAIN])
  if BARE in by_label:
    bare = by_label[BARE].median("steps_per_sec")
    out["cluster_vs_bare_step"] = cluster / bare if bare else None
    out["cluster_vs_bare_step_each"] = _each_round(by_label[CLUSTER],
                                                   by_label[BARE])
    if BARE_LOCAL in by_label:
      # The first target's ratio for the bare step: what 1 PS + 1 worker costs
      # this step when nothing runs around it in either mode.
      bare_local = by_label[BARE_LOCAL].median("steps_per_sec")
      out["bare_step_vs_bare_local"] = bare / bare_local if bare_local else None
      out["bare_step_vs_bare_local_each"] = _each_round(by_label[BARE],
                                                        by_label[BARE_LOCAL])
  return out


def _each_round(row: Row, baseline: Row) -> List[Optional[float]]:
  """row's speed over baseline's in each round. The runs of a round ran
  minutes apart, so a machine that changed speed mid-bench moves both: on
  this VM the ratio of medians and the median of these have differed by up
  to 16% (0.476 against 0.553, 2026-11-29).
  """
  return [mine / theirs if theirs else None
          for mine, theirs in zip(row.steps_per_sec, baseline.steps_per_sec)]


def main(argv):
  bench_dir = os.path.abspath(FLAGS.bench_dir or os.path.join(
      "runs", time.strftime("bench-%Y%m%d-%H%M%S")))
  try:
    values = trainer_args.parse(argv[1:], _OWNED, REFERENCE_WORK)
    output_dir.refuse_earlier_runs(bench_dir, "--bench_dir", RUN_DIRS)
    output_dir.prepare(bench_dir, "--bench_dir")
  except (trainer_args.ArgsError, output_dir.OutputDirError) as e:
    print(f"bench: error: {e}", file=sys.stderr)
    return 2
  runs.say_launcher_note()
  runs.stop_on_signals()
  say = (lambda line: print(line, file=sys.stderr, flush=True)) if FLAGS.json \
      else (lambda line: print(line, flush=True))
  busy_at_start = machine.busy_cores()
  machine_info = machine.describe()
  say(f"bench: {FLAGS.rounds} round(s) into {bench_dir}; "
      + " ".join(f"--{k}={v}" for k, v in values.items()))
  say(f"bench: on {machine.summary(machine_info)}")
  try:
    rows = run_bench(values, FLAGS.rounds, bench_dir, say)
    runs.raise_if_stopped()
  except runs.RunFailed as e:
    print(f"bench: error: {e}", file=sys.stderr)
    return 1
  except runs.Stopped as e:
    print(f"bench: {e}; the runs so far are in {bench_dir}", file=sys.stderr)
    return 128 + e.signum
  result = figures(rows, values, busy_at_start, machine_info)
  with open(os.path.join(bench_dir, "bench.json"), "w") as f:
    json.dump(result, f, indent=1)
  if FLAGS.json:
    for line in bench_table.warnings(result):  # With the progress lines, on stderr.
      say(line)
  print(json.dumps(result, indent=1) if FLAGS.json else bench_table.table(result))
  return 0


def run():
  app.run(main, flags_parser=trainer_args.own_flags_parser("bench"))


if __name__ == "__main__":
  run()
