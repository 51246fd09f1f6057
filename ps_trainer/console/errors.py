"""One line out of a multi-line error message.

TensorFlow's errors open with framing ("Graph execution error:", "Detected at
node ...") and end with pages of context; the one line that says what went
wrong is somewhere in between. Every error a user sees is one line.
"""

import re
import sys

_FRAMING = ("Graph execution error", "Detected at node", "Node:", "File ")


def first_line(text: str, default: str = "no details") -> str:
  """The first line of `text` that says what went wrong, else `default`."""
  for line in text.splitlines():
    line = line.strip()
    if (line and not line.startswith(_FRAMING) and not line.endswith(":")
        and line.strip("=")):
      return line
  return default


def say(line: str, stream=None) -> None:
  """print(line, flush=True) in one write. print() writes the line, then
  its newline: a line another thread printed in between (a signal's notice
  while the main thread prints progress) was glued to the end of it."""
  stream = stream or sys.stdout
  stream.write(line + "\n")
  stream.flush()


def fail(message: str, status: int = 2) -> None:
  """One clear line on stderr and a non-zero exit, never a traceback.

  Status 2: the input was wrong; 1: the run failed (a peer never answered,
  the loss diverged, TensorFlow stopped it).
  """
  say(f"ps_trainer: error: {message}", sys.stderr)
  sys.exit(status)


def warn(message: str) -> None:
  """A warning line on stderr that reads like the trainer's other lines,
  not like absl's log format (level, time, thread id, file:line)."""
  say(f"ps_trainer: warning: {message}", sys.stderr)


# absl's words for a value of the wrong type are Python's own; what a user
# needs is what the flag accepts.
_FLAG_TYPE_ERRORS = (
    (re.compile(r"invalid literal for int\(\) with base \d+: .*"),
     "expected a whole number"),
    (re.compile(r"could not convert string to float: .*"), "expected a number"),
    (re.compile(r"\('Non-boolean argument to boolean flag', .*\)"),
     "expected true or false (or --{name} / --no{name})"),
)
_FLAG_NAME = re.compile(r"flag --([A-Za-z0-9_]+)=")


def flag_error(error: Exception) -> str:
  """absl's flag error in one line, saying what the flag accepts."""
  message = " ".join(str(error).split())
  named = _FLAG_NAME.match(message)
  for pattern, accepted in _FLAG_TYPE_ERRORS:
    if named and pattern.search(message):
      message = pattern.sub(accepted.format(name=named.group(1)), message)
  return f"{message} (see --helpfull)"
