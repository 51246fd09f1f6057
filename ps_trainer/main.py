"""ps_trainer: one task of a TensorFlow 1 parameter-server training job.

Usage:
  python -m ps_trainer [flags]                      # train alone (local mode)
  python -m ps_trainer --ps_hosts=H:P,... --worker_hosts=H:P,...
      --job_name=ps|worker|evaluator --task_index=N [flags]  # one task
  TF_CONFIG='{"cluster": ..., "task": ...}' python -m ps_trainer [flags]

The role comes from --job_name/--task_index, else from TF_CONFIG (as Kubeflow
writes it), else the process trains alone with the same graph. Worker 0 (or
the TF_CONFIG chief) is the chief: it checkpoints into --log_dir, evaluates
the test split at the end, writes <log_dir>/result.json and exports the model
to <log_dir>/export/<step>/. PS tasks exit once every worker is done. An
evaluator scores each new checkpoint into <log_dir>/eval.json (evaluator.py).
`./launch.sh local` starts a whole cluster on this machine. Flags: --helpfull.
"""

import os

# TensorFlow's C++ start-up chatter drowns the progress lines; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags as absl_flags

from ps_trainer.console import errors
from ps_trainer.console import help_flags
from ps_trainer.console import output_dir
from ps_trainer.console import process_end
from ps_trainer.settings import flags as flags_lib

FLAGS = absl_flags.FLAGS
TRAINER_FLAGS = flags_lib.define_flags()


def main(argv, functions=None) -> int:
  """One task. `functions`: (model_fn, input_fn) from ps_trainer.run(), else
  None (--model and --input_fn name them)."""
  if len(argv) > 1:  # absl's UsageError would print the whole help first.
    errors.fail(f"unexpected arguments {' '.join(argv[1:])!r}; every setting "
                "is a --flag (see --helpfull)")
  # Only pure modules so far: bad flags and TF_CONFIG answer in a blink,
  # before TensorFlow loads.
  from ps_trainer.settings import cluster as cluster_lib
  from ps_trainer.settings import config as config_lib
  values = FLAGS.flag_values_dict()
  try:
    if functions is not None:
      from ps_trainer.user_model import loading  # pylint: disable=g-import-not-at-top
      values = dict(values, model=loading.name_of(functions[0]),
                    input_fn=loading.name_of(functions[1]))
    cfg = config_lib.from_flag_values(values, os.environ.get("TF_CONFIG", ""))
    if not cfg.model.input_fn:  # An input_fn reads its own files.
      config_lib.check_data_flags(values)
  except (cluster_lib.ClusterError, config_lib.ConfigError) as e:
    errors.fail(str(e))
  checking = bool(os.environ.get("PS_TRAINER_CHECK_ONLY"))
  if checking:
    # Before the log dir, so a bad file leaves nothing there (and is named
    # before a bad --log_dir here, after it in a task).
    _read_data_set(cfg)
    _load_user_model(cfg, functions)
  created = _check_log_dir(cfg.train.log_dir) if cfg.writes_log_dir else []
  claim = None
  if cfg.is_chief:  # The one task that writes checkpoints there.
    try:
      claim = output_dir.claim(cfg.train.log_dir, "--log_dir")
    except output_dir.OutputDirError as e:
      errors.fail(str(e))
  if checking:
    # `launch.sh local` checks the chief's flags and data so before it starts
    # any task: a mistake is then one line, not one per task among the
    # launcher's own (and a PS left waiting for workers that are gone).
    return 0
  try:
    return _run_task(cfg, functions)
  finally:
    if cfg.is_chief:  # Another task leaves it to the chief, which writes there.
      if claim is not None and created:  # Only an empty new one goes.
        output_dir.drop_claim(claim)
      output_dir.remove_if_empty(created)


def _check_log_dir(log_dir: str) -> list:
  """Fails in one line now, not after training, if --log_dir is unusable.

  Returns:
    The directories it created, deepest first.
  """
  try:
    return output_dir.prepare(log_dir, "--log_dir")
  except output_dir.OutputDirError as e:
    errors.fail(str(e))


def _run_task(cfg, functions=None) -> int:
  """Runs this task's role (task.py) once TensorFlow is loaded."""
  stop = _receive_stop_signals(cfg)
  from ps_trainer.cluster import host_cores  # pylint: disable=g-import-not-at-top
  if cfg.cluster is not None and cfg.train.pin_cpus:
    host_cores.pin_task(cfg.cluster)  # Before TensorFlow starts its threads.
  dataset = _read_data_set(cfg)
  cfg = _load_user_model(cfg, functions)
  from ps_trainer.console import quiet_import  # pylint: disable=g-import-not-at-top
  quiet_import.tensorflow()  # Before any module imports it, or TF's notes show.
  from ps_trainer import task  # pylint: disable=g-import-not-at-top
  return task.run(cfg, stop, dataset)


def _load_user_model(cfg, functions=None):
  """`cfg` with the user's model_fn and input_fn loaded (a PS needs none).

  Imports TensorFlow first, quietly: the user's code imports it.
  """
  if not cfg.model.is_user_model or (cfg.cluster and cfg.cluster.is_ps):
    return cfg
  from ps_trainer.settings import config as config_lib  # pylint: disable=g-import-not-at-top
  from ps_trainer.console import quiet_import  # pylint: disable=g-import-not-at-top
  quiet_import.tensorflow()
  from ps_trainer.user_model import loading  # pylint: disable=g-import-not-at-top
  from ps_trainer.user_model import spec  # pylint: disable=g-import-not-at-top
  try:
    if functions is not None:
      user = loading.from_functions(*functions, cfg.model.params,
                                    cfg.model.model, cfg.model.input_fn)
    else:
      user = loading.from_flags(cfg.model.model, cfg.model.input_fn,
                                cfg.model.params)
  except spec.ModelFnError as e:
    errors.fail(str(e))
  return config_lib.with_user_model(cfg, user)


def _read_data_set(cfg):
  """The data set if numpy alone reads it (data_sets.py), else None.

  Before TensorFlow loads, so a bad file is one line in a blink. In a task,
  after the stop signals and the pinning, which numpy's threads must inherit;
  `launch.sh local`'s check (PS_TRAINER_CHECK_ONLY) ends right after it.
  """
  if cfg.cluster is not None and cfg.cluster.is_ps:
    return None  # A PS reads no data.
  from ps_trainer.datasets import data_sets  # pylint: disable=g-import-not-at-top
  if cfg.model.input_fn:
    return data_sets.from_input_fn(cfg.model.input_fn)
  try:
    return data_sets.read(cfg.data.dataset, cfg.data.data_dir,
                          cfg.data.data_path)
  except data_sets.DataError as e:
    errors.fail(str(e))


def _receive_stop_signals(cfg):
  """From here on SIGINT/SIGTERM request a clean stop (stops.py)."""
  from ps_trainer.faults import stops
  how = "stopping after the current step"
  grace_secs = stops.GRACE_SECS
  if cfg.cluster is not None and cfg.cluster.is_ps:
    how = "stopping once the workers are done"
    grace_secs = stops.PS_GRACE_SECS
  elif cfg.cluster is not None and cfg.cluster.job_name == "evaluator":
    how = "stopping after the current evaluation"
  elif cfg.is_chief:
    how += ", with a final checkpoint"
  stop = stops.StopRequest(cfg.task_name, how, grace_secs)
  stop.install()
  return stop


def _parse_flags(argv):
  """absl's flag parsing, with a bad flag reported in one line (exit 2)."""
  help_flags.exit_if_asked(argv)
  try:
    return FLAGS(argv)
  except absl_flags.Error as e:
    errors.fail(errors.flag_error(e))


def run(model_fn=None, input_fn=None) -> None:
  """The program: parses the flags, runs this task, exits with its status.

  Args:
    model_fn, input_fn: a user's functions (ps_trainer.run); None: --model
      and --input_fn name them, or --model is built in.
  """
  functions = (model_fn, input_fn) if model_fn is not None else None
  process_end.run_then_finish(
      lambda: app.run(lambda argv: main(argv, functions),
                      flags_parser=_parse_flags))
