"""The command lines of bench and compare: their own flags, and the trainer
flags they pass on to every run they start."""

import sys
from typing import Dict, List, Set

from absl import flags

from ps_trainer.console import errors
from ps_trainer.console import help_flags
from ps_trainer.datasets import data_sets
from ps_trainer.settings import config as config_lib
from ps_trainer.settings import flags as trainer_flags


class ArgsError(ValueError):
  """An argument the runs cannot take. The message is one line."""


def parse(argv: List[str], owned: Set[str],
          defaults: Dict[str, str]) -> Dict[str, str]:
  """`defaults` overridden by the trainer flags in argv: --name=value, or
  --name and --noname for a boolean flag, as the trainer takes them.

  Checks them with the trainer's own validators, and reads the data file
  they name as the trainer would, so a typo or a missing file fails before
  any run starts (or the command makes its directory).

  Raises:
    ArgsError: not a trainer flag; a flag in `owned` (the caller sets it for
      each run); a value the trainer would refuse; a missing or bad data file.
  """
  values = dict(defaults)
  fv = flags.FlagValues()
  known = set(trainer_flags.define_flags(fv))
  for arg in argv:
    name, equals, value = arg[2:].partition("=")
    if arg.startswith("--") and not equals:
      name, value = _boolean(fv, known, name)
    if not arg.startswith("--") or name not in known:
      raise ArgsError(f"{arg}: not a trainer flag (--name=value); see "
                      "./launch.sh --helpfull")
    if name in owned:
      raise ArgsError(f"{arg}: set for each run by this command itself")
    values[name] = value
  try:
    fv(["runs"] + [f"--{k}={v}" for k, v in values.items()])
    config_lib.check_data_flags(fv.flag_values_dict())
    data_sets.read(fv.dataset, fv.data_dir, fv.data_path)
  except flags.Error as e:
    raise ArgsError(errors.flag_error(e)) from None
  except (config_lib.ConfigError, data_sets.DataError) as e:
    raise ArgsError(str(e)) from None
  return values


def _boolean(fv: flags.FlagValues, known: Set[str], name: str):
  """(name, "true"/"false") for --name or --noname of a boolean flag; else
  (name, "") unchanged, for the caller to refuse or pass on."""
  if name in known and fv[name].boolean:
    return name, "true"
  if name.startswith("no") and name[2:] in known and fv[name[2:]].boolean:
    return name[2:], "false"
  return name, ""


def own_flags_parser(command: str):
  """app.run's flags_parser for `command`: its own flags into absl's FLAGS,
  the rest left for `parse`; a bad value of its own is one line and exit 2,
  not absl's traceback."""
  def parse_own(argv: List[str]) -> List[str]:
    help_flags.exit_if_asked(argv)
    # absl's logging defines --log_dir too, so FLAGS would take the trainer's
    # (which each run sets itself) and drop it unsaid: `parse` refuses it.
    trainer_log_dir = [arg for arg in argv[1:] if arg == "--log_dir"
                       or arg.startswith("--log_dir=")]
    try:
      return flags.FLAGS([arg for arg in argv if arg not in trainer_log_dir],
                         known_only=True) + trainer_log_dir
    except flags.Error as e:
      print(f"{command}: error: {errors.flag_error(e)}", file=sys.stderr,
            flush=True)
      sys.exit(2)
  return parse_own
