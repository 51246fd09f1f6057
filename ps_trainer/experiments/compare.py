"""`./launch.sh compare --out_dir=DIR [--num_ps=N] [--num_workers=M] [--target_loss=X]
[--no_isolate] [trainer flags]`: the same job async and sync, side by side.

Runs the job twice on a local cluster (default 1 PS + 2 workers), async then
sync, every worker recording each step (--record_steps), and writes into
DIR: comparison.md (the table and the async gradient staleness),
comparison.json (the same figures and the loss curves) and comparison.png
(loss against wall time and against global step, and the staleness
histogram). The runs' own log dirs are DIR/async and DIR/sync. --no_isolate
(launch.sh's) runs the clusters in this machine's network rather than in a
private one with loopback only.
"""

import os
import shlex
import sys
from typing import Dict, List

from absl import app
from absl import flags

from ps_trainer.console import output_dir
from ps_trainer.experiments import report
from ps_trainer.experiments import runs
from ps_trainer.experiments import trainer_args

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", None, "Where the comparison and both runs go.")
flags.DEFINE_integer("num_ps", 1, "PS tasks of the local cluster.", lower_bound=1)
flags.DEFINE_integer("num_workers", 2, "Workers of the local cluster.",
                     lower_bound=1)
flags.DEFINE_float("target_loss", None, "Training loss whose time and steps to "
                   "reach are compared (default: the highest final loss of the "
                   "two modes, so both reach it).")
flags.register_validator(
    "target_loss", lambda loss: loss is None or loss > 0,
    message="must be > 0: a training loss both runs can come down to")

# The runs' own settings; trainer flags pick the work.
_OWNED = {"ps_hosts", "worker_hosts", "job_name", "task_index", "log_dir",
          "num_workers", "sync_replicas", "replicas_to_aggregate",
          "record_steps"}

# Each mode's extra flags; the name is its run's directory in --out_dir.
MODES = {"async": [], "sync": ["--sync_replicas"]}


def run_modes(flags_list: List[str], out_dir: str, num_ps: int,
              num_workers: int, say=print) -> Dict[str, dict]:
  modes = {}
  for mode, extra in MODES.items():
    say(f"compare: {mode} on {num_ps} PS + {num_workers} worker(s) ...")
    run = runs.run_local_cluster(
        mode, num_ps, num_workers, flags_list + ["--record_steps"] + extra,
        os.path.join(out_dir, mode))
    say(f"compare: {mode}: {run.result['steps_per_sec']:.1f} steps/s, test "
        f"accuracy {run.result['accuracy']:.4f}, {run.process_secs:.1f} s")
    modes[mode] = {"result": run.result, "process_secs": run.process_secs,
                   "records": report.read_records(run.log_dir)}
  return modes


def main(argv):
  if not FLAGS.out_dir:
    print("compare: error: --out_dir is required: the directory for "
          "comparison.md/.json/.png and both runs", file=sys.stderr)
    return 2
  out_dir = os.path.abspath(FLAGS.out_dir)
  try:
    values = trainer_args.parse(argv[1:], _OWNED, {})
    output_dir.refuse_earlier_runs(out_dir, "--out_dir", list(MODES))
    output_dir.prepare(out_dir, "--out_dir")
  except (trainer_args.ArgsError, output_dir.OutputDirError) as e:
    print(f"compare: error: {e}", file=sys.stderr)
    return 2
  runs.say_launcher_note()
  runs.stop_on_signals()
  flags_list = [f"--{k}={v}" for k, v in values.items()]
  command = shlex.join(
      ["./launch.sh", "compare", f"--out_dir={FLAGS.out_dir}",
       f"--num_ps={FLAGS.num_ps}", f"--num_workers={FLAGS.num_workers}"]
      + ([f"--target_loss={FLAGS.target_loss}"] if FLAGS.target_loss else [])
      + flags_list)
  try:
    modes = run_modes(flags_list, out_dir, FLAGS.num_ps, FLAGS.num_workers)
    runs.raise_if_stopped()
  except runs.RunFailed as e:
    print(f"compare: error: {e}", file=sys.stderr)
    return 1
  except runs.Stopped as e:
    print(f"compare: {e}; the runs so far are in {out_dir}", file=sys.stderr)
    return 128 + e.signum
  fig = report.figures(modes, FLAGS.target_loss)
  paths = report.write(fig, out_dir, command)
  print(report.markdown(fig, command))
  print("compare: wrote " + ", ".join(paths))
  return 0


def run():
  app.run(main, flags_parser=trainer_args.own_flags_parser("compare"))


if __name__ == "__main__":
  run()
