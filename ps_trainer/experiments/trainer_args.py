"""The trainer flags that bench and compare pass on to every run they start."""

from typing import Dict, List, Set

from absl import flags

from ps_trainer import flags as trainer_flags


class ArgsError(ValueError):
  """An argument the runs cannot take. The message is one line."""


def parse(argv: List[str], owned: Set[str],
          defaults: Dict[str, str]) -> Dict[str, str]:
  """`defaults` overridden by the --name=value trainer flags in argv.

  Checks them with the trainer's own validators, so a typo fails before any
  run starts.

  Raises:
    ArgsError: not --name=value of a trainer flag; a flag in `owned` (the
      caller sets it for each run); a value the trainer would refuse.
  """
  values = dict(defaults)
  fv = flags.FlagValues()
  known = set(trainer_flags.define_flags(fv))
  for arg in argv:
    name, _, value = arg[2:].partition("=")
    if not arg.startswith("--") or name not in known:
      raise ArgsError(f"{arg}: not a trainer flag (--name=value); see "
                      "./launch.sh --helpfull")
    if name in owned:
      raise ArgsError(f"{arg}: set for each run by this command itself")
    values[name] = value
  try:
    fv(["runs"] + [f"--{k}={v}" for k, v in values.items()])
  except flags.Error as e:
    raise ArgsError(str(e)) from None
  return values
