"""The result.json of the bench's yardsticks, plain_tf1.py and bare_step.py:
the fields of the trainer's that the bench reads, measured as the trainer
measures them. No flags here, so a test or a tool can import it beside the
trainer's."""

import json
import os


def write(log_dir: str, program: str, marks, batch_size: int, **more) -> None:
  """<log_dir>/result.json: which program ran (the bench's run directories
  then say what each holds); the speed over `marks`, (time, global step) pairs
  taken after each step; measured_secs, so that the bench warns of a window
  too short to trust; and `more`."""
  steps_per_sec, measured_secs = steady_rate(marks)
  os.makedirs(log_dir, exist_ok=True)
  with open(os.path.join(log_dir, "result.json"), "w") as f:
    json.dump(dict(
        program=program, steps_per_sec=steps_per_sec,
        examples_per_sec=(None if steps_per_sec is None
                          else steps_per_sec * batch_size),
        measured_secs=measured_secs, **more), f)


def steady_rate(marks):
  """(global steps/s, seconds measured) after the first 10% of the steps;
  both None when fewer than two steps ran, as the trainer's are (the bench
  then says the run has no speed rather than printing 0)."""
  if len(marks) < 2:
    return None, None
  first_step = marks[0][1]
  warm = next((m for m in marks
               if m[1] >= first_step + 0.1 * (marks[-1][1] - first_step)),
              marks[0])
  if warm == marks[-1]:
    warm = marks[0]
  seconds = marks[-1][0] - warm[0]
  rate = (marks[-1][1] - warm[1]) / seconds if seconds > 0 else None
  return rate, seconds
