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
import statistics
import time
from typing import Callable, Iterable, List, Optional

import tensorflow as tf

# Ops that move tensors between devices; their time is time spent waiting
# for bytes, not computing.
_TRANSFER_OPS = ("_Recv", "_HostRecv", "_Send", "_HostSend", "RecvTensor")
# Ops that hand the step its next batch. They compute nothing: their time is a
# wait for the input pipeline's thread, which has not drawn or read it yet.
_INPUT_OPS = ("IteratorGetNext", "IteratorGetNextSync",
              "IteratorGetNextAsOptional")
# Trace steps after the first few, which pay for warm-up.
SKIP_STEPS = 20
# When several kinds of work overlap, the instant counts for the first.
CATEGORIES = ("compute", "input", "ps", "transfer", "other")


def is_ps_device(device: str) -> bool:
  return "/job:ps/" in device


# A receive across tasks, as TF labels it: "[0.8MB] [426.1Mb/s] edge_28_x from
# /job:ps/... to ...". The size there is rounded and in binary units; the
# exact bytes are the record's output.
_RPC_LABEL = re.compile(r"^\[[^\]]*\] (?:\[[^\]]*\] )?edge_\S* from (\S+) to ")


def _op_type(node) -> str:
  """The op's type from TF's label: "name = Type(inputs)"."""
  label = node.timeline_label or node.node_name
  return label.split(" = ", 1)[-1].split("(", 1)[0].strip()


def _is_transfer(node) -> bool:
  label = node.timeline_label or node.node_name
  if node.node_name == "RecvTensor" or _RPC_LABEL.match(label):
    return True
  return _op_type(node) in _TRANSFER_OPS


def _received_bytes(node) -> int:
  """Bytes a receive brought in, exact: TF records them as its output."""
  return sum(out.tensor_description.allocation_description.requested_bytes
             for out in node.output)


@dataclasses.dataclass
class StepSplit:
  """One traced step: how long it took, and how long its ops ran, split by
  what was happening.

  Each millisecond from the first recorded op to the last (total_ms) counts
  once, for the first of CATEGORIES busy at that moment: worker compute, then
  input (the worker waiting for its next batch), then PS ops (reads,
  applies), then transfers (receives waiting for tensors), else "other" (gaps
  between ops: RPC latency, scheduling). wall_ms is the step as TraceHook
  sees it: the session.run, and the work of the hooks around it (a
  checkpoint save, if one falls in a traced step); what it holds beyond
  total_ms passes before the first op or after the last (TF's session and
  master setting the step up and collecting it, the hooks).
  """
  total_ms: float
  ms: dict
  bytes_to_worker: int
  bytes_to_ps: int
  wall_ms: float

  @property
  def outside_ms(self) -> float:
    # Clocks of other hosts may not agree with this one's.
    return max(self.wall_ms - self.total_ms, 0.0)


def split_step(step_stats, wall_ms: float) -> StepSplit:
  """Splits one step's time (see StepSplit) from its RunMetadata.step_stats
  and the wall time TraceHook took of it."""
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
      elif on_ps:
        intervals["ps"].append((begin, finish))
      elif _op_type(node) in _INPUT_OPS:
        intervals["input"].append((begin, finish))
      else:
        intervals["compute"].append((begin, finish))
  if start is None:
    return StepSplit(0.0, {name: 0.0 for name in CATEGORIES}, 0, 0, wall_ms)
  ms = _attribute(intervals, start, end)
  return StepSplit((end - start) / 1000.0, ms, bytes_to_worker, bytes_to_ps,
                   wall_ms)


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
  for micros, name, change in edges:
    if micros > previous:
      busy = next((c for c in CATEGORIES[:-1] if open_count[c]), "other")
      ms[busy] += (micros - previous) / 1000.0
      previous = micros
    if name is not None:
      open_count[name] += change
  return ms


def mean_split(splits: Iterable[StepSplit]) -> StepSplit:
  """The steps' mean times, and the bytes of their median step: every step
  moves the same tensors, but under load TF's RunMetadata now and then lacks
  a PS's receives for one step (1 of 10, in a CI run), which a mean would
  count as a step that sent nothing."""
  splits = list(splits)
  n = max(len(splits), 1)
  return StepSplit(
      total_ms=sum(s.total_ms for s in splits) / n,
      ms={name: sum(s.ms[name] for s in splits) / n for name in CATEGORIES},
      bytes_to_worker=_median_low([s.bytes_to_worker for s in splits]),
      bytes_to_ps=_median_low([s.bytes_to_ps for s in splits]),
      wall_ms=sum(s.wall_ms for s in splits) / n)


def _median_low(values: List[int]) -> int:
  return statistics.median_low(values) if values else 0


def as_json(split: StepSplit, steps: int) -> dict:
  """A split as <stem>.split.json holds it."""
  return dict(dataclasses.asdict(split), outside_ms=split.outside_ms,
              steps=steps)


def describe(split: StepSplit) -> str:
  """'2.10 ms per traced step: in ops 1.50 (compute 0.80, input 0.10, PS
  0.40, transfer 0.15, other 0.05), outside them 0.60; 1.08 MB to the
  worker, ...'"""
  parts = ", ".join(f"{'PS' if name == 'ps' else name} {split.ms[name]:.2f}"
                    for name in CATEGORIES)
  return (f"{split.wall_ms:.2f} ms per traced step: in ops "
          f"{split.total_ms:.2f} ({parts}), outside them "
          f"{split.outside_ms:.2f}; {split.bytes_to_worker / 1e6:.2f} MB to "
          f"the worker, {split.bytes_to_ps / 1e6:.2f} MB to the PS")


def _event_name(node) -> str:
  """An op's name; a receive's names the task it came from."""
  match = _RPC_LABEL.match(node.timeline_label or "")
  if match:
    source = tf.DeviceSpec.from_string(match.group(1))
    if source.job and source.task is not None:
      return f"{node.node_name} from {source.job} {source.task}"
  return node.node_name


def _rows(spans: List[tuple]) -> List[int]:
  """A row for each (start, end), such that no two on a row overlap: Chrome
  draws a row's events as nested, and receives from two PS tasks overlap
  without nesting."""
  row_ends: List[int] = []
  rows = [0] * len(spans)
  for index in sorted(range(len(spans)), key=lambda i: spans[i][0]):
    begin, finish = spans[index]
    row = next((r for r, row_end in enumerate(row_ends) if row_end <= begin),
               len(row_ends))
    if row == len(row_ends):
      row_ends.append(finish)
    else:
      row_ends[row] = finish
    rows[index] = row
  return rows


def chrome_trace(steps: List) -> dict:
  """Chrome trace events of the traced steps' step_stats, one process per
  device, each op on a row where it overlaps no other."""
  events, pids, nodes = [], {}, {}
  for index, step_stats in enumerate(steps):
    for dev in step_stats.dev_stats:
      if dev.device not in pids:
        pids[dev.device] = len(pids)
        nodes[dev.device] = []
        events.append({"name": "process_name", "ph": "M",
                       "pid": pids[dev.device], "args": {"name": dev.device}})
      nodes[dev.device] += [(index, node) for node in dev.node_stats]
  for device, device_nodes in nodes.items():
    spans = [(node.all_start_micros,
              node.all_start_micros + max(node.all_end_rel_micros, 1))
             for _, node in device_nodes]
    for (index, node), row in zip(device_nodes, _rows(spans)):
      events.append({
          "name": _event_name(node), "ph": "X", "cat": "op",
          "ts": node.all_start_micros,
          "dur": max(node.all_end_rel_micros, 1),
          "pid": pids[device], "tid": row,
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
    self._traced: list = []  # (step_stats, wall ms of its session.run)
    self._began = 0.0
    self.written: Optional[str] = None

  def _tracing(self) -> bool:
    return (self.written is None and
            self._skip <= self._step < self._skip + self._num_steps)

  def before_run(self, run_context):
    if not self._tracing():
      return None
    self._began = time.perf_counter()
    return tf.compat.v1.train.SessionRunArgs(
        fetches=None, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE))

  def after_run(self, run_context, run_values):
    if self._tracing() and run_values.run_metadata is not None:
      wall_ms = (time.perf_counter() - self._began) * 1000.0
      # MonitoredSession gives each run a RunMetadata of its own.
      self._traced.append((run_values.run_metadata.step_stats, wall_ms))
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
      json.dump(chrome_trace([stats for stats, _ in self._traced]), f)
    split = mean_split(split_step(stats, wall_ms)
                       for stats, wall_ms in self._traced)
    with open(os.path.join(self._out_dir, f"{self._file_stem}.split.json"),
              "w") as f:
      json.dump(as_json(split, len(self._traced)), f, indent=1)
    self.written = path
    short = (f" (not {self._num_steps}: the run ended first, and its first "
             f"{self._skip} steps are never traced)"
             if len(self._traced) < self._num_steps else "")
    self._echo(f"{self._who}: traced {len(self._traced)} steps{short} into "
               f"{path}; {describe(split)}")
    self._traced = []
