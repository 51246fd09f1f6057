"""One line out of a multi-line error message.

TensorFlow's errors open with framing ("Graph execution error:", "Detected at
node ...") and end with pages of context; the one line that says what went
wrong is somewhere in between. Every error a user sees is one line.
"""

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


def warn(message: str) -> None:
  """A warning line on stderr that reads like the trainer's other lines,
  not like absl's log format (level, time, thread id, file:line)."""
  print(f"ps_trainer: warning: {message}", file=sys.stderr, flush=True)
