"""The bench's figures as text: its tables, the verdicts on the targets, and
warnings on what makes the figures less than an idle machine's (bench.py
gathers the figures)."""

from typing import List, Optional

from ps_trainer.experiments import machine

# Targets of the performance issue, on the reference work.
TARGET_VS_LOCAL = 0.5
TARGET_VS_PLAIN = 2.0


# A speed measured over fewer seconds than this is not a steady rate: at 200
# steps of the reference work (0.2-0.8 s windows), 2 async workers came out at
# 0.4x of 1, against 1.1x at 2000 steps. The reference bench's windows are
# 2-6 s long.
STEADY_SECS = 1.0
# Cores other work kept busy in the second before the bench, past which it
# warns. Not the load average: a minute's average still counts work that has
# just ended.
BUSY_CORES = 0.5
# How far apart (fastest over slowest, less one) the runs of one setup may be
# before the bench warns. A steady hour here keeps them within 5% (2026-11-26
# 05:50: 1429-1470 steps/s in local mode); this VM's slow state has spread
# them by up to 58% in one bench (2026-11-29 09:56: 220-347), and then the
# verdicts turn on which minute each run fell in.
SPREAD = 0.25


def speed_lines(result: dict) -> List[str]:
  header = (f"{'run':<28}{'runs':>5}{'steps/s':>9}  {'(range)':<13}"
            f"{'examples/s':>10}{'vs local':>10}{'ms/step':>9}")
  lines = [header, "-" * len(header)]
  for run in result["runs"]:
    each = run["steps_per_sec_each"]
    digits = 0 if min(each) >= 100 else 1 if min(each) >= 10 else 2
    spread = (f"({min(each):.{digits}f}-{max(each):.{digits}f})"
              if len(each) > 1 else "")
    lines.append(
        f"{run['label']:<28}{len(each):>5}{run['steps_per_sec']:>9.1f}  "
        f"{spread:<13}{run['examples_per_sec']:>10.0f}"
        f"{_figure(run['vs_local'], 10)}{_figure(run['ms_per_step'], 9)}")
  return lines


def _figure(value: Optional[float], width: int) -> str:
  """A figure to two decimals, right-aligned; "-" for one not measured."""
  return f"{'-' if value is None else format(value, '.2f'):>{width}}"


def split_lines(result: dict) -> List[str]:
  header = (f"{'traced step (first run), ms':<28}{'step':>7}{'compute':>9}"
            f"{'input':>7}{'PS':>7}{'transfer':>10}{'other':>7}{'outside':>9}"
            f"   MB in / out")
  lines = [header, "-" * len(header)]
  for run in result["runs"]:
    split = run["split"]
    if not split:
      lines.append(f"{run['label']:<28}{'-':>7}")
      continue
    ms = split["ms"]
    lines.append(
        f"{run['label']:<28}{split['wall_ms']:>7.2f}"
        f"{ms['compute']:>9.2f}{ms['input']:>7.2f}{ms['ps']:>7.2f}"
        f"{ms['transfer']:>10.2f}{ms['other']:>7.2f}"
        f"{split['outside_ms']:>9.2f}   "
        f"{split['bytes_to_worker'] / 1e6:.2f} / "
        f"{split['bytes_to_ps'] / 1e6:.2f}")
  return lines


def warnings(result: dict) -> List[str]:
  """What makes these figures less than steady speeds of an idle machine."""
  out = []
  busy = result.get("busy_cores_at_start")
  if busy is not None and busy > BUSY_CORES:
    out.append(f"warning: the machine was busy when the bench started (other "
               f"work used {busy:.1f} of its {result.get('cores')} cores): "
               "it shares the cores, so these figures are low and noisy")
  windows = [(secs, run["label"]) for run in result["runs"]
             for secs in run.get("measured_secs_each") or () if secs is not None]
  short = [w for w in windows if w[0] < STEADY_SECS]
  if short:
    secs, label = min(short)
    out.append(f"warning: {len(short)} of {len(windows)} runs measured their "
               f"speed over less than {STEADY_SECS:.0f} s (shortest: {label}, "
               f"{secs:.1f} s): start-up still weighs in such figures; raise "
               "--train_steps")
  spreads = []
  for run in result["runs"]:
    each = run.get("steps_per_sec_each") or []
    if len(each) > 1 and min(each) > 0:
      spreads.append((max(each) / min(each) - 1, run["label"], min(each),
                      max(each)))
  widest = max(spreads, default=None)
  if widest and widest[0] > SPREAD:
    spread, label, slowest, fastest = widest
    out.append(f"warning: the runs of one setup differed by up to "
               f"{spread:.0%} ({label}: {slowest:.1f} to {fastest:.1f} "
               "steps/s): the machine's speed wandered during the bench, so "
               "the ratios can move as much from one bench to the next; more "
               "--rounds steady the medians")
  return out


def table(result: dict) -> str:
  """The figures as text tables, then the targets and what to trust."""
  lines = speed_lines(result) + [""] + split_lines(result) + [""]
  changed = result["changed_from_reference"]

  def verdict(target: float, ratio: float, unit: str = "") -> str:
    # Three decimals: 0.4992 read "0.50 (target >= 0.5: NOT met)".
    if changed:
      return f"{ratio:.3f}{unit}"
    return (f"{ratio:.3f}{unit} (target >= {target}{unit}: "
            f"{'met' if ratio >= target else 'NOT met'})")

  def rounds(target: float, each: List[Optional[float]], unit: str = "") -> List[str]:
    if len(each) < 2:
      return []
    ratios = [r for r in each if r is not None]
    line = "  each round: " + _each_round(each, unit)
    if not changed:
      line += (f" (target met in {sum(r >= target for r in ratios)} of "
               f"{len(ratios)})")
    return [line]

  lines.append("1 PS + 1 worker / local: "
               + verdict(TARGET_VS_LOCAL, result["cluster_vs_local"]))
  lines += rounds(TARGET_VS_LOCAL, result.get("cluster_vs_local_each", []))
  if "cluster_vs_plain_tf1" in result:
    lines.append("1 PS + 1 worker / plain TF1: "
                 + verdict(TARGET_VS_PLAIN, result["cluster_vs_plain_tf1"], "x"))
    lines += rounds(TARGET_VS_PLAIN,
                    result.get("cluster_vs_plain_tf1_each", []), "x")
  else:
    lines.append("plain TF1 baseline and bare step: not run (they train only "
                 "--model=mlp --dataset=synthetic --optimizer=sgd)")
  if "cluster_vs_bare_step" in result:
    # No targets: what the trainer's input, hooks and checks leave of the
    # floor, and the first target's ratio for the floor itself.
    lines += _floor_lines(
        "1 PS + 1 worker / bare step", result["cluster_vs_bare_step"],
        "the bare step is the same step with nothing around it",
        result.get("cluster_vs_bare_step_each", []))
    if "bare_step_vs_bare_local" in result:
      lines += _floor_lines(
          "bare step, 1 PS + 1 worker / bare step, local",
          result["bare_step_vs_bare_local"],
          "what 1 PS + 1 worker costs this step, with nothing around it in "
          "either mode", result.get("bare_step_vs_bare_local_each", []))
  elif "cluster_vs_plain_tf1" in result:
    lines.append("bare step: not run (it builds the trainer's step at the "
                 f"trainer's defaults; this work sets {' '.join(changed)})")
  if changed:
    lines.append(f"targets (>= {TARGET_VS_LOCAL} of local, >= "
                 f"{TARGET_VS_PLAIN}x plain TF1): not judged; they are for the "
                 f"reference work, and this one sets {' '.join(changed)}")
  if result.get("machine"):
    lines.append(f"machine: {machine.summary(result['machine'])}")
  lines += [
      "steps/s: the median of the runs, taken in turns, and their range; the "
      "ratios are of medians,",
      "  and each round's pairs the runs of one turn.",
      "ms/step: 1000 / steps/s, per global step; 2 async workers each take "
      "about twice that per step.",
      "examples/s: every aggregated replica's batch counts."]
  if "cluster_vs_bare_step" in result:
    lines += [
        "bare step: the trainer's step alone (one constant batch, no input "
        "pipeline, hooks or checks):",
        "  a floor for 1 PS + 1 worker on this machine (bare_step.py)."]
  if "bare_step_vs_bare_local" in result:
    lines += [
        "bare step, local: its local step (every op in one process, nothing "
        "packed), run the same way."]
  lines += [
      "traced step: the chief's mean over its traced steps, slower than "
      "untraced ones; 'step' is its",
      "  session.run with the other hooks' work around it: its ops (compute, "
      "input: waiting for the",
      "  next batch, PS, transfer, other), and 'outside' them, TF's session "
      "and master and the hooks."]
  return "\n".join(lines + warnings(result))


def _floor_lines(name: str, ratio: Optional[float], what: str,
                 each: List[Optional[float]]) -> List[str]:
  """A ratio the bench does not judge, and its rounds'."""
  lines = [f"{name}: {'-' if ratio is None else format(ratio, '.3f')} "
           f"(no target; {what})"]
  if len(each) > 1:
    lines.append("  each round: " + _each_round(each))
  return lines


def _each_round(each: List[Optional[float]], unit: str = "") -> str:
  """Each round's ratio in its place; "-" for a round whose run had no speed,
  so that the n-th figure is always the n-th round's."""
  return ", ".join("-" if r is None else f"{r:.3f}{unit}" for r in each)
