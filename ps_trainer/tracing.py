"""--trace_steps: a Chrome trace of a few training steps, and where their time went.

TF records every op of a traced step on every device the step touched - the
worker's own ops, the PS tasks' reads and applies, and the receives that wait
for tensors to arrive - in RunMetadata.step_stats. This module turns those
records into a Chrome trace file (chrome://tracing or https://ui.perfetto.dev)
and into a split of each step's time that a user can read in one line.

Times on different hosts come from different clocks; on one host they agree.
"""

import dataclasses
import json
import os
import re
from typing import Callable, Iterable, List, Optional

import tensorflow as tf

# Ops that move tensors between devices; their time is time spent waiting
# for bytes, not computing.
_TRANSFER_OPS = ("_Recv", "_HostRecv", "_Send", "_HostSend", "RecvTensor")
# Trace steps after the first few, which pay for warm-up.
SKIP_STEPS = 20
# When several kinds of work overlap, the instant counts for the first.
CATEGORIES = ("compute", "ps", "transfer", "other")


def is_ps_device(device: str) -> bool:
  return "/job:ps/" in device


# A receive across tasks: "[0.8MB] [426.1Mb/s] edge_28_x from /job:ps/... to ...".
_RPC_LABEL = re.compile(r"^\[([\d.]+)([KMG]?i?B)\] \[[^\]]*\] edge_\S* from ")
_UNITS = {"B": 1, "KB": 1e3, "KiB": 1024, "MB": 1e6, "MiB": 1 << 20,
          "GB": 1e9, "GiB": 1 << 30}


def _is_transfer(node) -> bool:
  label = node.timeline_label or node.node_name
  if node.node_name == "RecvTensor" or _RPC_LABEL.match(label):
    return True
  op = label.split(" = ", 1)[-1].split("(", 1)[0].strip()
  return op in _TRANSFER_OPS


def _received_bytes(node) -> int:
  """Bytes a receive brought in: from its label (RPCs), else its outputs."""
  match = _RPC_LABEL.match(node.timeline_label or "")
  if match:
    return int(float(match.group(1)) * _UNITS.get(match.group(2), 1))
  return sum(out.tensor_description.allocation_description.requested_bytes
             for out in node.output)


@dataclasses.dataclass
class StepSplit:
  """One traced step: how long its graph ran, split by what was happening.

  Each millisecond of the step counts once, for the first of CATEGORIES
  busy at that moment: worker compute, then PS ops (reads, applies), then
  transfers (receives waiting for tensors), else "other" (RPC latency,
  scheduling: nothing recorded was running).
  """
  total_ms: float
  ms: dict
  bytes_to_worker: int
  bytes_to_ps: int


def split_step(step_stats) -> StepSplit:
  """Splits one step's time (see StepSplit) from its RunMetadata.step_stats."""
  intervals = {name: [] for name in CATEGORIES}
  bytes_to_worker = bytes_to_ps = 0
  start, end = None, None
  for dev in step_stats.dev_stats:
    on_ps = is_ps_device(dev.device)
    for node in dev.node_stats:
      begin = node.all_start_micros
      finish = begin + max(node.all_end_rel_micros, 0)
      start = begin if start is None else min(start, begin)
      end = finish if end is None else max(end, finish)
      if _is_transfer(node):
        intervals["transfer"].append((begin, finish))
        if on_ps:
          bytes_to_ps += _received_bytes(node)
        else:
          bytes_to_worker += _received_bytes(node)
      else:
        intervals["ps" if on_ps else "compute"].append((begin, finish))
  if start is None:
    return StepSplit(0.0, {name: 0.0 for name in CATEGORIES}, 0, 0)
  ms = _attribute(intervals, start, end)
  return StepSplit((end - start) / 1000.0, ms, bytes_to_worker, bytes_to_ps)


def _attribute(intervals: dict, start: int, end: int) -> dict:
  """Milliseconds of [start, end) per category, each instant counted once.

  A sweep over the interval edges, keeping how many intervals of each
  category are open.
  """
  edges = [(start, None, 0), (end, None, 0)]
  for name, spans in intervals.items():
    for a, b in spans:
      if b > a:
        edges += [(a, name, 1), (b, name, -1)]
  edges.sort(key=lambda edge: edge[0])
  open_count = {name: 0 for name in CATEGORIES}
  ms = {name: 0.0 for name in CATEGORIES}
  previous = start
  for time, name, change in edges:
    if time > previous:
      busy = next((c for c in CATEGORIES[:-1] if open_count[c]), "other")
      ms[busy] += (time - previous) / 1000.0
      previous = time
    if name is not None:
      open_count[name] += change
  return ms


def mean_split(splits: Iterable[StepSplit]) -> StepSplit:
  splits = list(splits)
  n = max(len(splits), 1)
  return StepSplit(
      total_ms=sum(s.total_ms for s in splits) / n,
      ms={name: sum(s.ms[name] for s in splits) / n for name in CATEGORIES},
      bytes_to_worker=sum(s.bytes_to_worker for s in splits) // n,
      bytes_to_ps=sum(s.bytes_to_ps for s in splits) // n)


def describe(split: StepSplit) -> str:
  """'3.10 ms per step: compute 0.90, PS 0.40, transfer 1.50, other 0.30; ...'"""
  parts = ", ".join(f"{'PS' if name == 'ps' else name} {split.ms[name]:.2f}"
                    for name in CATEGORIES)
  return (f"{split.total_ms:.2f} ms per step: {parts}; "
          f"{split.bytes_to_worker / 1e6:.2f} MB to the worker, "
          f"{split.bytes_to_ps / 1e6:.2f} MB to the PS")


def chrome_trace(steps: List) -> dict:
  """Chrome trace events of the traced steps' step_stats, one process per device."""
  events, pids = [], {}
  for index, step_stats in enumerate(steps):
    for dev in step_stats.dev_stats:
      if dev.device not in pids:
        pids[dev.device] = len(pids)
        events.append({"name": "process_name", "ph": "M",
                       "pid": pids[dev.device], "args": {"name": dev.device}})
      for node in dev.node_stats:
        events.append({
            "name": node.node_name, "ph": "X", "cat": "op",
            "ts": node.all_start_micros,
            "dur": max(node.all_end_rel_micros, 1),
            "pid": pids[dev.device], "tid": node.thread_id,
            "args": {"op": node.timeline_label, "traced_step": index}})
  return {"traceEvents": events, "displayTimeUnit": "ms"}


class TraceHook(tf.compat.v1.train.SessionRunHook):
  """Traces `num_steps` of this worker's steps after SKIP_STEPS, then writes.

  Writes `<out_dir>/<file_stem>.json` (Chrome trace) and
  `<out_dir>/<file_stem>.split.json` (the mean StepSplit), and prints one
  line with the split.
  """

  def __init__(self, num_steps: int, out_dir: str, file_stem: str, who: str,
               skip_steps: int = SKIP_STEPS,
               echo: Callable[[str], None] = lambda line: print(line,
                                                                flush=True)):
    self._num_steps = num_steps
    self._out_dir = out_dir
    self._file_stem = file_stem
    self._who = who
    self._skip = skip_steps
    self._echo = echo
    self._step = 0
    self._traced: list = []
    self.written: Optional[str] = None

  def _tracing(self) -> bool:
    return (self.written is None and
            self._skip <= self._step < self._skip + self._num_steps)

  def before_run(self, run_context):
    if not self._tracing():
      return None
    return tf.compat.v1.train.SessionRunArgs(
        fetches=None, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE))

  def after_run(self, run_context, run_values):
    if self._tracing() and run_values.run_metadata is not None:
      # MonitoredSession gives each run a RunMetadata of its own.
      self._traced.append(run_values.run_metadata.step_stats)
    self._step += 1
    if len(self._traced) == self._num_steps:
      self._write()

  def end(self, session):
    if self._traced and self.written is None:
      self._write()  # The run ended before all the steps were traced.

  def _write(self):
    os.makedirs(self._out_dir, exist_ok=True)
    path = os.path.join(self._out_dir, f"{self._file_stem}.json")
    with open(path, "w") as f:
      json.dump(chrome_trace(self._traced), f)
    split = mean_split(split_step(s) for s in self._traced)
    with open(os.path.join(self._out_dir, f"{self._file_stem}.split.json"),
              "w") as f:
      json.dump(dict(dataclasses.asdict(split), steps=len(self._traced)), f,
                indent=1)
    self.written = path
    self._echo(f"{self._who}: traced {len(self._traced)} steps into {path}; "
               f"{describe(split)}")
    self._traced = []
