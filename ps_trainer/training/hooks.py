"""SessionRunHooks: input set-up, progress and throughput, and the result.

Hooks add ops only in begin() (the graph is final after), and read the
global step in the same run as the train op, so they cost no extra RPC.
"""

import math
import time
from typing import Callable, Optional

import tensorflow as tf

from ps_trainer.console import errors
from ps_trainer.faults import stops
from ps_trainer.training import run_result


class InputInitHook(tf.compat.v1.train.SessionRunHook):
  """Feeds in-memory arrays to an input pipeline once per (re)created session."""

  def __init__(self, initializer, feed_dict):
    self._initializer = initializer
    self._feed_dict = feed_dict

  def after_create_session(self, session, coord):
    if self._initializer is not None:
      session.run(self._initializer, feed_dict=self._feed_dict)


class ReleaseInputThreadHook(tf.compat.v1.train.SessionRunHook):
  """Once InputInitHook has started the input pipeline, and so its thread,
  lets that thread use the host's idle cores (host_cores.release_threads)."""

  def __init__(self, release):
    self._release = release

  def after_create_session(self, session, coord):
    self._release()


class PublishHook(tf.compat.v1.train.SessionRunHook):
  """The chief sets a variable to its own value whenever its session starts.

  For values that must reflect this chief's start, not a checkpoint's.
  """

  def __init__(self, variable, value):
    self._variable = variable
    self._value = value

  def begin(self):
    self._assign = self._variable.assign(self._value)

  def after_create_session(self, session, coord):
    session.run(self._assign)


class StopAtStepHook(tf.compat.v1.train.StopAtStepHook):
  """Stops at global step `last_step`, also when a session starts past it.

  TF's hook only looks after a step, so a job restarted from a final
  checkpoint would train one step too many.
  """

  def __init__(self, last_step: int):
    super().__init__(last_step=last_step)
    self._last = last_step

  def after_create_session(self, session, coord):
    super().after_create_session(session, coord)
    if session.run(self._global_step_tensor) >= self._last:
      coord.request_stop()


class Throughput:
  """Global steps per second, measured after the first 10% of the run.

  The first steps pay for graph set-up, session creation and warm-up; counting
  them would understate the steady speed that comparisons care about. Nor does
  the window start within `skip_steps` of the first step this process saw:
  the steps --trace_steps traces run slower. If the global step goes back (a
  PS restarted and the model came back from an older checkpoint), the
  measurement starts over from there, the tracing long over.
  """

  def __init__(self, train_steps: int, clock: Callable[[], float] = time.monotonic,
               skip_steps: int = 0):
    self._train_steps = train_steps
    self._clock = clock
    self._skip = skip_steps
    self._started = None  # When the first session was ready.
    self._first = None    # (time, global step) of the first observed step.
    self._mark = None     # ... of the first step past the warm-up.
    self._last = None
    self.steps_observed = 0

  @property
  def train_steps(self) -> int:
    return self._train_steps

  def session_started(self) -> None:
    if self._started is None:  # A session recreated after a fault keeps it.
      self._started = self._clock()

  def observe(self, global_step: int) -> None:
    now = (self._clock(), global_step)
    self.steps_observed += 1
    if self._first is None or global_step < self._last[1]:
      if self._first is not None:
        self._skip = 0
      self._first, self._mark = now, None
    if self._mark is None:
      start = self._first[1]
      if (global_step >= start + 0.1 * max(self._train_steps - start, 0)
          and global_step >= start + self._skip):
        self._mark = now
    self._last = now

  def _window(self):
    """(start, end) of the measured steps, each (time, global step)."""
    start = self._mark if self._mark and self._mark != self._last else self._first
    return start, self._last

  def steps_per_sec(self) -> Optional[float]:
    """Steady global steps/s; falls back to the whole run if it was too short.
    None when this process timed fewer than two steps (a run of one step, or
    a chief that started itself again as the others finished the run): it
    has no speed to report, not a speed of 0."""
    if self._last is None:
      return None
    start, end = self._window()
    seconds = end[0] - start[0]
    return (end[1] - start[1]) / seconds if seconds > 0 else None

  def measured(self) -> dict:
    """Where steps_per_sec was measured: the global step it starts from and
    its seconds (a window of a few seconds is not a steady speed)."""
    if self.steps_per_sec() is None:
      return {"measured_from_step": None, "measured_secs": None}
    start, end = self._window()
    return {"measured_from_step": start[1], "measured_secs": end[0] - start[0]}

  def wall_secs(self) -> Optional[float]:
    """Seconds from the first session's start to the last step (None: no step)."""
    if self._last is None or self._started is None:
      return None
    return self._last[0] - self._started


class ProgressHook(tf.compat.v1.train.SessionRunHook):
  """Prints one progress line every `every_steps` steps of this worker.

  Args:
    name: who is speaking, e.g. "worker 1" or "local".
    loss: the training loss tensor.
    global_step: the global step tensor.
    train_steps: the last global step.
    examples_per_global_step: batch size times replicas aggregated per step.
    every_steps: this worker's steps between lines.
    throughput: where global steps are recorded for result.json.
    examples_seen: a counter of the examples this worker's input yielded,
      when the input decides the batch size (a user's input_fn); then
      examples_per_global_step is measured, as that batch times `replicas`.
    replicas: replicas aggregated per global step.
  """

  def __init__(self, name: str, loss, global_step, train_steps: int,
               examples_per_global_step: int, every_steps: int,
               throughput: Throughput, clock=time.monotonic,
               examples_seen=None, replicas: int = 1, wall_clock=time.time):
    self._wall_clock = wall_clock
    self._name = name
    self._fetches = {"loss": loss, "global_step": global_step}
    if examples_seen is not None:
      self._fetches["examples_seen"] = examples_seen
    self._replicas = replicas
    self._seen = None  # (examples, steps) of this session, when measured.
    self._train_steps = train_steps
    self._examples = examples_per_global_step
    self._every = every_steps
    self._throughput = throughput
    self._clock = clock
    self._steps = 0
    self._last_line = None   # (time, global step) when the last line printed.
    self.last_loss = math.nan
    self.last_global_step = None

  def after_create_session(self, session, coord):
    self._throughput.session_started()
    self._last_line = None  # Rates restart with the session.
    if "examples_seen" in self._fetches:
      self._seen = (0, 0)
    global_step = int(session.run(self._fetches["global_step"]))
    if global_step > self._train_steps:  # A run resumed with fewer steps.
      errors.say(f"{self._name}: starting at global step {global_step}, "
                 f"already past --train_steps={self._train_steps}")
    elif global_step > 0:
      errors.say(f"{self._name}: starting at global step {global_step} of "
                 f"{self._train_steps}")

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    global_step = int(run_values.results["global_step"])
    self.last_global_step = global_step
    self.last_loss = float(run_values.results["loss"])
    self._throughput.observe(global_step)
    self._steps += 1
    if self._seen is not None:
      self._seen = (int(run_values.results["examples_seen"]),
                    self._seen[1] + 1)
    now = self._clock()
    if self._last_line is None:
      self._last_line = (now, global_step)
    if self._steps % self._every == 0:
      seconds = now - self._last_line[0]
      rate = (global_step - self._last_line[1]) / seconds if seconds > 0 else 0
      errors.say(f"{self._name}: step {global_step}/{self._train_steps}  "
                 f"loss {self.last_loss:.4f}  {rate:.1f} steps/s  "
                 f"{rate * self.examples_per_global_step:.0f} examples/s  "
                 f"{self._when(global_step, rate)}")
      self._last_line = (now, global_step)

  def _when(self, global_step: int, rate: float) -> str:
    """'14:03:27  eta 1h02m': the wall-clock time of the line and the time
    left at this line's rate, so a long job's logs read on their own."""
    now = time.strftime("%H:%M:%S", time.localtime(self._wall_clock()))
    left = max(self._train_steps - global_step, 0)
    if rate <= 0:
      return f"{now}  eta unknown"
    return f"{now}  eta {duration(left / rate)}"

  @property
  def examples_per_global_step(self) -> float:
    """--batch_size times the replicas per step; or, when the input decides
    the batch, the mean batch it yielded so far times the replicas."""
    if self._seen is None or not self._seen[1]:
      return self._examples
    return self._seen[0] / self._seen[1] * self._replicas


class ResultHook(tf.compat.v1.train.SessionRunHook):
  """At the end of a run: evaluates the test split and writes result.json.

  Goes last among the hooks, so the file appears after the final checkpoint
  and after the sync workers were released. A run stopped before
  `train_steps` (a signal) writes nothing: result.json describes finished
  runs only.

  Args:
    evaluate: (session) -> {"loss": float, "accuracy": float or None,
      "examples": int, "metrics": {name: float}} (train_graph.TrainGraph's).
    global_step: the global step tensor.
    throughput: the run's Throughput.
    examples_per_global_step: to turn steps/s into examples/s.
    fields: constant fields of result.json (mode, cluster size, ...).
    log_dir: where result.json goes.
    progress: the ProgressHook, for the last training loss.
    on_written: called once result.json is written: the run is finished, and
      a stop from then on is no stop of training.
  """

  def __init__(self, evaluate, global_step, throughput: Throughput,
               examples_per_global_step: int, fields: dict, log_dir: str,
               progress: Optional[ProgressHook] = None,
               on_written: Callable[[], None] = lambda: None):
    self._on_written = on_written
    self._evaluate = evaluate
    self._global_step = global_step
    self._throughput = throughput
    self._examples = examples_per_global_step
    self._fields = fields
    self._log_dir = log_dir
    self._progress = progress
    self.result = None

  def end(self, session):
    global_step = int(session.run(self._global_step))
    if global_step < self._throughput.train_steps:
      return  # Stopped early: no result to report.
    earlier = (run_result.reached(self._log_dir, self._throughput.train_steps)
               if self._throughput.steps_observed == 0 else None)
    if earlier is not None:
      # A finished job started again: its result stands; a run of zero
      # steps has no speed to report.
      self.result = earlier
      errors.say(f"nothing to train: global step {global_step} has reached "
                 f"--train_steps; kept {run_result.path(self._log_dir)}")
      return
    steps_per_sec = self._throughput.steps_per_sec()
    metrics = self._evaluate(session)
    train_loss = self._progress.last_loss if self._progress else math.nan
    self.result = dict(
        global_step=global_step,
        loss=metrics["loss"],
        accuracy=metrics["accuracy"],
        metrics=metrics["metrics"],
        test_examples=metrics.get("examples"),
        train_loss=train_loss if math.isfinite(train_loss) else None,
        examples_per_sec=(None if steps_per_sec is None
                          else steps_per_sec * self._examples_per_step()),
        steps_per_sec=steps_per_sec,
        wall_secs=self._throughput.wall_secs(),
        **self._throughput.measured(),
        **self._fields)
    run_result.write(self._log_dir, self.result)
    self._on_written()
    errors.say(summary_line(self.result))


  def _examples_per_step(self) -> float:
    if self._progress is not None:
      return self._progress.examples_per_global_step
    return self._examples


def duration(secs: float) -> str:
  """'45s', '12m05s', '3h07m': a span as a progress line gives it."""
  secs = int(round(secs))
  if secs < 60:
    return f"{secs}s"
  if secs < 3600:
    return f"{secs // 60}m{secs % 60:02d}s"
  return f"{secs // 3600}h{secs % 3600 // 60:02d}m"


def summary_line(result: dict) -> str:
  if result.get("mode") == "local":  # One process: no updates to be async.
    where = "local mode" + (", sync" if result["sync_replicas"] else "")
  else:
    where = (f"{'sync' if result['sync_replicas'] else 'async'}, "
             f"{result['num_workers']} worker(s), {result['num_ps']} PS")
  if result["steps_per_sec"] is None:
    speed = "no speed: this process timed fewer than two steps"
  else:
    speed = (f"{result['steps_per_sec']:.1f} steps/s  "
             f"{result['examples_per_sec']:.0f} examples/s  "
             f"{result['wall_secs']:.1f} s")
  accuracy = ("" if result.get("accuracy") is None
              else f"test accuracy {result['accuracy']:.4f}  ")
  return (f"done: step {result['global_step']}  {accuracy}"
          f"test loss {result['loss']:.4f}  {speed}  ({where})")


class StopOnRequestHook(tf.compat.v1.train.SessionRunHook):
  """Ends the session loop after the step in which a stop was requested."""

  def __init__(self, stop: stops.StopRequest):
    self._stop = stop

  def after_create_session(self, session, coord):
    if self._stop.requested:
      coord.request_stop()

  def after_run(self, run_context, run_values):
    if self._stop.requested:
      run_context.request_stop()
