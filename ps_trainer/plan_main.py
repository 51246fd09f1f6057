"""`./launch.sh plan [--num_ps=N] [--num_workers=M] [trainer flags] [--format=json]`.

Prints where every variable and table part of the job would go, the bytes on
each PS and the bytes a worker moves per step (plan.py), without starting
anything. Training flags pick the model and data as they would for the run.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

from ps_trainer.console import errors
from ps_trainer.console import help_flags
from ps_trainer.settings import flags as flags_lib

FLAGS = flags.FLAGS
flags_lib.define_flags(FLAGS)
flags.DEFINE_integer("num_ps", 1, "PS tasks of the planned cluster.",
                     lower_bound=1)
flags.DEFINE_enum("format", "text", ["text", "json"],
                  "text: a table for people; json: for programs.")
# The trainer's --num_workers is about sparse TF_CONFIG; here it sizes the plan,
# and --help lists it with --num_ps.
FLAGS["num_workers"].help = "Workers of the planned cluster (default 2)."
flags.declare_key_flag("num_workers")

# The plan makes up its own cluster; these would describe another one.
_CLUSTER_FLAGS = ("ps_hosts", "worker_hosts", "job_name", "task_index")


def _fail(message: str) -> None:
  print(f"plan: error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def main(argv) -> int:
  if len(argv) > 1:
    _fail(f"unexpected arguments {' '.join(argv[1:])!r}; every setting is a "
          "--flag")
  for name in _CLUSTER_FLAGS:
    if FLAGS[name].present:
      _fail(f"--{name}: plan makes up its own cluster; give its size with "
            "--num_ps and --num_workers")
  # Pure modules first: bad flags answer before TensorFlow loads.
  from ps_trainer.settings import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  from ps_trainer.settings import config as config_lib  # pylint: disable=g-import-not-at-top
  try:
    values = FLAGS.flag_values_dict()
    cfg = config_lib.from_flag_values(
        config_lib.planned_worker(values, FLAGS.num_ps, FLAGS.num_workers or 2),
        "")
    if not cfg.model.input_fn:  # An input_fn reads its own files.
      config_lib.check_data_flags(values)
  except (cluster_lib.ClusterError, config_lib.ConfigError) as e:
    _fail(str(e))
  from ps_trainer.datasets import data_sets  # pylint: disable=g-import-not-at-top
  try:  # Before TensorFlow loads too, if numpy alone reads it.
    dataset = (data_sets.from_input_fn(cfg.model.input_fn) if cfg.model.input_fn
               else data_sets.read(cfg.data.dataset, cfg.data.data_dir,
                                   cfg.data.data_path))
  except data_sets.DataError as e:
    _fail(str(e))
  from ps_trainer.console import quiet_import  # pylint: disable=g-import-not-at-top
  tf = quiet_import.tensorflow()
  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  from ps_trainer.user_model import loading  # pylint: disable=g-import-not-at-top
  try:
    cfg = config_lib.with_user_model(cfg, loading.from_flags(
        cfg.model.model, cfg.model.input_fn, cfg.model.params))
  except loading.spec_lib.ModelFnError as e:
    _fail(str(e))
  from ps_trainer.datasets import data  # pylint: disable=g-import-not-at-top
  from ps_trainer import models  # pylint: disable=g-import-not-at-top
  from ps_trainer.graph import plan  # pylint: disable=g-import-not-at-top
  try:
    if dataset is None:
      dataset = data.load(cfg.data.dataset, cfg.data.data_dir,
                          cfg.data.data_path)
    result = plan.make(cfg, dataset)
  except (data.DataError, models.ModelError, loading.spec_lib.ModelFnError) as e:
    _fail(str(e))
  if FLAGS.format == "json":
    print(json.dumps(result, indent=1))
  else:
    print(plan.to_text(result))
  return 0


def _parse_flags(argv):
  help_flags.exit_if_asked(argv)
  try:
    return FLAGS(argv)
  except flags.Error as e:
    _fail(errors.flag_error(e))


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
