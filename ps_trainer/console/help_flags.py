"""Help on request: the usage on stdout and exit status 0.

absl's own help flags print the usage and exit 1, which a script, a CI step
or `set -e` reads as a failure; and a command with flag values of its own
(clicks) has no help flag at all. Each command looks for these first.
"""

from typing import List, Optional

from absl import app

_SHORT = ("-h", "-?", "--help", "--helpshort")
_FULL = ("--helpfull",)


def asked(argv: List[str]) -> Optional[str]:
  """Returns "short" or "full" if argv (with the program first) asks for
  help before any `--`, else None."""
  for arg in argv[1:]:
    if arg == "--":
      return None
    if arg in _SHORT:
      return "short"
    if arg in _FULL:
      return "full"
  return None


def exit_if_asked(argv: List[str]) -> None:
  """Prints absl's usage of the running program and exits 0 if argv asks for
  help: the main module's flags for the short help, every flag for the full."""
  kind = asked(argv)
  if kind:
    app.usage(shorthelp=kind == "short", writeto_stdout=True, exitcode=0)
