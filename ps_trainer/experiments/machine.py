"""What the machine a bench runs on is, and how busy it is.

Figures from two benches compare only on the same kind of machine: this
project's shared 2-core VM has run the reference work at 340 and at 1450 steps/s
in local mode on different days, and the two speed targets moved in opposite
directions (docs/performance-log.md). So the bench records the CPU it ran on,
its clock and vector extensions (oneDNN's kernels differ with them) and
TensorFlow's version, and warns when other work shared the cores as it started.
"""

import importlib.metadata
import os
import time
from typing import Optional

# Vector extensions that pick oneDNN's matrix kernels, widest first.
_VECTOR_FLAGS = ("amx_tile", "avx512_bf16", "avx512f", "avx2", "fma", "avx")


def busy_cores(secs: float = 1.0) -> Optional[float]:
  """How many cores' worth of CPU time the machine used over `secs` (from
  /proc/stat); None where that cannot be read."""
  def totals():
    with open("/proc/stat") as f:
      # user nice system idle iowait irq softirq steal; guest time is in user.
      fields = [int(v) for v in f.readline().split()[1:9]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle, iowait
    return sum(fields), idle
  try:
    total0, idle0 = totals()
    time.sleep(secs)
    total1, idle1 = totals()
  except (OSError, ValueError, IndexError):
    return None
  elapsed = total1 - total0
  if elapsed <= 0:
    return None
  return (1.0 - (idle1 - idle0) / elapsed) * (os.cpu_count() or 1)


def from_cpuinfo(text: str) -> dict:
  """The CPU's model, clock (MHz, as the first core reports it) and vector
  extensions, from the text of /proc/cpuinfo; None for what it lacks."""
  fields = {}
  for line in text.splitlines():
    key, sep, value = line.partition(":")
    if sep and key.strip() not in fields:  # The first core's.
      fields[key.strip()] = value.strip()
  try:
    mhz = round(float(fields["cpu MHz"]))
  except (KeyError, ValueError):
    mhz = None
  flags = set(fields.get("flags", "").split())
  return {"cpu": fields.get("model name"), "mhz": mhz,
          "vector": [f for f in _VECTOR_FLAGS if f in flags]}


def describe() -> dict:
  """This machine: from_cpuinfo's fields, its cores and memory, and the
  TensorFlow the runs use (None for what cannot be read)."""
  try:
    with open("/proc/cpuinfo") as f:
      out = from_cpuinfo(f.read())
  except OSError:
    out = {"cpu": None, "mhz": None, "vector": []}
  out["cores"] = os.cpu_count()
  out["memory_gib"] = None
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          out["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
  except (OSError, ValueError, IndexError):
    pass
  try:
    out["tensorflow"] = importlib.metadata.version("tensorflow")
  except importlib.metadata.PackageNotFoundError:
    out["tensorflow"] = None
  return out


def summary(machine: dict) -> str:
  """One line, e.g. "2 cores of AMD EPYC at 1996 MHz (avx2 fma avx, no
  avx512f), 23.5 GiB, TensorFlow 2.21.0"."""
  cpu = machine.get("cpu") or "an unknown CPU"
  text = f"{machine.get('cores') or '?'} cores of {cpu}"
  if machine.get("mhz"):
    text += f" at {machine['mhz']} MHz"
  vector = machine.get("vector") or []
  if vector:
    text += f" ({' '.join(vector)}"
    text += ")" if "avx512f" in vector else ", no avx512f)"
  if machine.get("memory_gib"):
    text += f", {machine['memory_gib']} GiB"
  if machine.get("tensorflow"):
    text += f", TensorFlow {machine['tensorflow']}"
  return text
