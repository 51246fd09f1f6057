"""The figures of an async vs sync comparison, and the files that show them.

Input per mode: its result.json and the per-step records of its workers
(step_record.py). Output: comparison.json, comparison.md, comparison.png.
No TensorFlow here; matplotlib draws the PNG.
"""

import collections
import glob
import json
import math
import os
import statistics
from typing import Dict, List, Optional

# Training losses are noisy per batch; curves and the target-loss test use the
# mean of this many consecutive records.
SMOOTHING = 25


def read_records(log_dir: str) -> List[dict]:
  """Every worker's step records of a run, in time order."""
  records = []
  for path in sorted(glob.glob(os.path.join(log_dir, "steps", "*.jsonl"))):
    worker = os.path.splitext(os.path.basename(path))[0]
    with open(path) as f:
      for line in f:
        if line.strip():
          records.append(dict(json.loads(line), worker=worker))
  records.sort(key=lambda r: r["time"])
  return records


def smoothed(values: List[float], window: int = SMOOTHING) -> List[float]:
  """Trailing moving average (shorter at the start)."""
  out, total, queue = [], 0.0, collections.deque()
  for value in values:
    queue.append(value)
    total += value
    if len(queue) > window:
      total -= queue.popleft()
    out.append(total / len(queue))
  return out


def curve(records: List[dict]) -> Dict[str, list]:
  """Smoothed loss against seconds since the first step and global step."""
  if not records:
    return {"seconds": [], "step": [], "loss": []}
  start = records[0]["time"]
  return {"seconds": [r["time"] - start for r in records],
          "step": [r["step"] for r in records],
          "loss": smoothed([r["loss"] for r in records])}


def reaching(curve_: Dict[str, list], target: float) -> Optional[dict]:
  """Seconds and global step at which the smoothed loss first reached target."""
  for seconds, step, loss in zip(curve_["seconds"], curve_["step"],
                                 curve_["loss"]):
    if loss <= target:
      return {"seconds": seconds, "step": step}
  return None


def staleness(records: List[dict]) -> Optional[dict]:
  """Distribution of the async steps' staleness, or None (sync)."""
  values = [r["staleness"] for r in records if "staleness" in r]
  if not values:
    return None
  ordered = sorted(values)
  counts = collections.Counter(values)
  return {
      "steps": len(values),
      "mean": statistics.fmean(values),
      "median": ordered[len(ordered) // 2],
      "p90": ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)],
      "max": ordered[-1],
      "counts": {str(k): counts[k] for k in sorted(counts)}}


def workers(records: List[dict]) -> Dict[str, dict]:
  """Per worker (its records' file name): the steps it trained and the
  global step of its first. An async worker joins once its session is up,
  so a short run's first steps can have fewer workers than the rest."""
  by_worker = {}
  for record in records:  # In time order.
    worker = by_worker.setdefault(record["worker"],
                                  {"steps": 0, "first_step": record["step"]})
    worker["steps"] += 1
  return dict(sorted(by_worker.items()))


# A worker that first trained past this share of a run's steps is named.
_LATE_SHARE = 0.1


def figures(runs: Dict[str, dict], target_loss: Optional[float]) -> dict:
  """runs: mode -> {"result": result.json, "records": [...], "process_secs":
  the run's processes from start to end}.

  The target loss, unless given, is the highest final smoothed training loss
  of the modes: every mode reaches it, so their times to it compare.
  """
  curves = {mode: curve(run["records"]) for mode, run in runs.items()}
  finals = [c["loss"][-1] for c in curves.values() if c["loss"]]
  if target_loss is None and finals:
    target_loss = max(finals)
  modes = []
  for mode, run in runs.items():
    result = run["result"]
    modes.append({
        "mode": mode,
        "steps_per_sec": result["steps_per_sec"],
        "examples_per_sec": result["examples_per_sec"],
        "process_secs": run["process_secs"],
        "train_secs": result["wall_secs"],
        "final_train_loss": (curves[mode]["loss"][-1] if curves[mode]["loss"]
                             else None),
        "test_loss": result["loss"],
        "test_accuracy": result["accuracy"],
        "test_examples": result.get("test_examples"),
        "global_step": result["global_step"],
        "to_target": (reaching(curves[mode], target_loss)
                      if target_loss is not None else None),
        "staleness": staleness(run["records"]),
        "workers": workers(run["records"])})
  return {"target_loss": target_loss, "smoothing": SMOOTHING, "modes": modes,
          "curves": curves}


def accuracy_gap(modes: List[dict]) -> Optional[str]:
  """Whether two modes' test accuracies differ by more than chance would.

  Each accuracy is a share of the test examples, so its standard error is
  sqrt(p (1 - p) / n); the gap's is that of both combined. A gap within
  twice it is what a run with another --seed can turn round.
  """
  if len(modes) != 2 or not all(m.get("test_examples") for m in modes):
    return None
  (a, b) = modes
  error = math.sqrt(sum(m["test_accuracy"] * (1 - m["test_accuracy"])
                        / m["test_examples"] for m in modes))
  gap = abs(a["test_accuracy"] - b["test_accuracy"])
  examples = ", ".join(sorted({str(m["test_examples"]) for m in modes}))
  head = (f"Test accuracy: {a['mode']} and {b['mode']} differ by {gap:.4f} on "
          f"{examples} test examples; the standard error of that gap is "
          f"{error:.4f}.")
  if gap <= 2 * error:
    return (f"{head} Within twice that, the gap can be chance: runs with "
            "other --seed values can turn it round. Read it as no difference "
            "unless it holds across seeds.")
  return (f"{head} More than twice that: unlikely to be chance alone on this "
          "test split, though one run per mode shows nothing of the spread "
          "between runs (other --seed values).")


def _number(value, fmt: str) -> str:
  return "-" if value is None else format(value, fmt)


def markdown(fig: dict, command: str) -> str:
  """comparison.md: the table, the staleness distribution, how it was made."""
  target = fig["target_loss"]
  lines = [
      "# Async vs sync", "",
      f"Command: `{command}`", "",
      "| mode | steps/s | examples/s | train time (s) | wall time (s) | "
      f"final train loss ({fig['smoothing']}-step mean) | "
      f"test loss | test accuracy | time to loss {_number(target, '.4f')} (s) | "
      "steps to it |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for m in fig["modes"]:
    reached = m["to_target"] or {}
    lines.append(
        f"| {m['mode']} | {m['steps_per_sec']:.1f} | "
        f"{m['examples_per_sec']:.0f} | {m['train_secs']:.1f} | "
        f"{m['process_secs']:.1f} | "
        f"{_number(m['final_train_loss'], '.4f')} | {m['test_loss']:.4f} | "
        f"{m['test_accuracy']:.4f} | {_number(reached.get('seconds'), '.1f')} | "
        f"{_number(reached.get('step'), 'd')} |")
  lines += [
      "",
      f"Steps/s count global steps after the first 10%; a sync step averages "
      f"every aggregated worker's batch, so its examples/s counts them all "
      f"(and a step of it, in comparison.png, is that many examples). Train "
      f"time: the chief's session start to the end of training (result.json's "
      f"wall_secs); wall time: start of the processes to their end "
      f"(TensorFlow's start-up included); the time to the target loss counts "
      f"from the first step, as comparison.png's time axis does. Train losses "
      f"are means of {fig['smoothing']} consecutive steps; the target loss is "
      "the highest final one of the modes, unless --target_loss set it.", ""]
  gap = accuracy_gap(fig["modes"])
  if gap:
    lines += [gap, ""]
  lines += _worker_lines(fig["modes"])
  for m in fig["modes"]:
    dist = m["staleness"]
    if not dist:
      continue
    lines += [
        f"## Gradient staleness ({m['mode']})", "",
        "Updates by other workers between a step's read of the variables and "
        "its own update (0: nothing changed in between). Sync runs drop stale "
        "gradients, so theirs is 0 by construction.", "",
        f"{dist['steps']} steps: mean {dist['mean']:.2f}, median "
        f"{dist['median']}, 90th percentile {dist['p90']}, max {dist['max']}.",
        "", "| staleness | steps | share |", "|---:|---:|---:|"]
    for value, count in dist["counts"].items():
      lines.append(f"| {value} | {count} | {count / dist['steps']:.1%} |")
    lines.append("")
  lines.append("Curves: comparison.png; figures: comparison.json.")
  return "\n".join(lines) + "\n"


def _worker_lines(modes: List[dict]) -> List[str]:
  """The steps each worker trained, and a sentence for one that started late."""
  lines = ["## Steps per worker", "",
           "| mode | worker | steps trained | first at global step |",
           "|---|---|---:|---:|"]
  late = []
  for m in modes:
    for name, worker in m["workers"].items():
      lines.append(f"| {m['mode']} | {name} | {worker['steps']} | "
                   f"{worker['first_step']} |")
      if worker["first_step"] > _LATE_SHARE * m["global_step"]:
        late.append(f"{name} ({m['mode']}) first trained at global step "
                    f"{worker['first_step']} of {m['global_step']}")
  lines.append("")
  if late:
    lines += [
        f"Started late: {'; '.join(late)}. The steps before it had fewer "
        "workers, so that run's speed and staleness partly describe a smaller "
        "job: an async worker joins once its session is up, a moment after "
        "the chief starts. A longer --train_steps makes that share small.", ""]
  return lines


def draw(fig: dict, path: str) -> None:
  """comparison.png: loss against wall time and against global step, plus the
  async staleness histogram."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  stale = [m for m in fig["modes"] if m["staleness"]]
  columns = 3 if stale else 2
  figure, axes = pyplot.subplots(1, columns, figsize=(5.2 * columns, 4.2))
  for mode, c in fig["curves"].items():
    axes[0].plot(c["seconds"], c["loss"], label=mode)
    axes[1].plot(c["step"], c["loss"], ".", markersize=2, label=mode)
  for ax, xlabel in zip(axes[:2], ("seconds since the first step",
                                   "global step")):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"training loss (mean of {fig['smoothing']} steps)")
    ax.set_yscale("log")
    if fig["target_loss"]:
      ax.axhline(fig["target_loss"], color="gray", linewidth=0.8,
                 linestyle="--", label="target loss")
    ax.legend(markerscale=6)  # The step panel's 2-point dots, legible.
    ax.grid(alpha=0.3)
  axes[0].set_title("Loss against wall time")
  axes[1].set_title("Loss against global step")
  if stale:
    dist = stale[0]["staleness"]
    values = [int(k) for k in dist["counts"]]
    axes[2].bar(values, [dist["counts"][str(v)] / dist["steps"] for v in values])
    # Whole updates: no tick between two of them.
    axes[2].xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    axes[2].set_xlabel("staleness (updates between read and apply)")
    axes[2].set_ylabel("share of steps")
    axes[2].set_title(f"Gradient staleness, {stale[0]['mode']}")
    axes[2].grid(alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  pyplot.close(figure)


def write(fig: dict, out_dir: str, command: str) -> List[str]:
  """Writes the three files; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = [os.path.join(out_dir, f"comparison.{ext}")
           for ext in ("md", "json", "png")]
  with open(paths[0], "w") as f:
    f.write(markdown(fig, command))
  with open(paths[1], "w") as f:
    json.dump(dict(fig, command=command), f, indent=1)
  draw(fig, paths[2])
  return paths
