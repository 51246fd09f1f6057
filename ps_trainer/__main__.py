"""`python -m ps_trainer`: run one task of a parameter-server job."""

# The package first: run by its path (`bazel run //ps_trainer`), not with -m,
# this file would otherwise import absl before the package sets the program
# up (as_program.py).
from ps_trainer import main  # pylint: disable=g-bad-import-order

from absl import flags  # pylint: disable=g-bad-import-order

# absl prints the main module's docstring and key flags as --helpshort.
__doc__ = main.__doc__  # pylint: disable=redefined-builtin
for _name in main.TRAINER_FLAGS:
  flags.declare_key_flag(_name)

if __name__ == "__main__":
  main.run()
