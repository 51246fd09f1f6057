"""The result.json of the bench's yardsticks, plain_tf1.py and bare_step.py:
the fields of the trainer's that the bench reads, measured by the trainer's
own Throughput (hooks.py). No flags here, so a test or a tool can import it
beside the trainer's."""

import json
import os

from ps_trainer.training import hooks


def write(log_dir: str, program: str, throughput: hooks.Throughput,
          batch_size: int, **more) -> None:
  """<log_dir>/result.json: which program ran (the bench's run directories
  then say what each holds); its steady speed, None when it timed fewer than
  two steps (the bench then says the run has no speed rather than printing 0);
  measured_secs, so that the bench warns of a window too short to trust; and
  `more`."""
  steps_per_sec = throughput.steps_per_sec()
  os.makedirs(log_dir, exist_ok=True)
  with open(os.path.join(log_dir, "result.json"), "w") as f:
    json.dump(dict(
        program=program, steps_per_sec=steps_per_sec,
        examples_per_sec=(None if steps_per_sec is None
                          else steps_per_sec * batch_size),
        measured_secs=throughput.measured()["measured_secs"], **more), f)
