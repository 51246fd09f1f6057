"""Tasks that share a host share its cores: how many threads each, and which.

TF sizes every task's thread pools to all the host's cores, and its pools spin
while they wait for work, so tasks on one host (a local cluster, or a PS next
to a worker) take the cores from each other. Each such task gets an equal
share: that many threads per op pool and, when every task can have cores of
its own, those cores alone (sched_setaffinity). Pinned, a task's gRPC, op and
Python threads hand work to each other on one core and the OS no longer moves
them between cores mid-step: 1 PS + 1 worker on 2 cores went from about 175
to 195 steps/s on the reference MLP (docs/performance.md).

One exception: a worker's input thread, which draws batches ahead of the
step, is released to all the host's cores at the lowest priority once it
exists (release_threads), so it runs in the time a PS's core leaves idle.

Pure Python: main.py pins a task before TensorFlow starts its threads; the
trainer releases the input thread once its session has started it.
"""

import os
from typing import List, Optional, Sequence, Tuple

from ps_trainer.settings import cluster as cluster_lib
from ps_trainer.settings import host_ports

# This process's own cores once pin_task() has pinned it; threads_per_task()
# then counts them (the affinity mask no longer shows the host's share).
_pinned: Optional[Tuple[int, ...]] = None
# The cores the process had before pinning, for release_threads().
_host_share: Optional[Tuple[int, ...]] = None

# A released thread's nice value: the lowest priority, so it runs only when
# the training threads of the core it is on leave the core idle.
RELEASED_NICE = 19


def tasks_on_host(info: cluster_lib.ClusterInfo) -> List[Tuple[str, int]]:
  """(job, index) of every training task on this task's host, this one
  included, in an order every task computes alike."""
  machine = host_ports.machine_of(info.address)
  return sorted((job, index) for job, tasks in info.jobs.items()
                for index, address in tasks.items()
                if host_ports.machine_of(address) == machine)


def allowed_cores() -> List[int]:
  """The cores this process may run on (a container's or taskset's share)."""
  if hasattr(os, "sched_getaffinity"):
    return sorted(os.sched_getaffinity(0))
  return list(range(os.cpu_count() or 1))


def cores_for_task(info: cluster_lib.ClusterInfo,
                   allowed: Sequence[int]) -> Optional[List[int]]:
  """This task's own cores, or None: alone on its host, or more tasks than
  cores there (then the OS shares them out), or a sparse cluster: it does
  not list the other workers, so two on one host took the same core."""
  if info.sparse:
    return None
  here = tasks_on_host(info)
  if len(here) <= 1 or len(here) > len(allowed):
    return None
  position = here.index((info.job_name, info.task_index))
  count = len(allowed)
  return list(allowed[position * count // len(here):
                      (position + 1) * count // len(here)])


def threads_per_task(info: cluster_lib.ClusterInfo,
                     cpus: Optional[int] = None) -> int:
  """Threads for each op pool of this task; 0 (TF's choice) if alone on its host.

  On 2 cores, 1 PS + 1 worker trained the reference MLP at about 90 steps/s
  with TF's pools and 135 with one thread each (launch.sh local, 3 runs
  each, taken in turns).
  """
  if _pinned is not None and cpus is None:
    return len(_pinned)
  here = len(tasks_on_host(info))
  if here <= 1:
    return 0
  return max(1, (cpus or len(allowed_cores())) // here)


def describe(cores: Sequence[int]) -> str:
  """[0] -> "core 0"; [2, 3] -> "cores 2-3"; [1, 5] -> "cores 1,5"."""
  if len(cores) == 1:
    return f"core {cores[0]}"
  if list(cores) == list(range(cores[0], cores[-1] + 1)):
    return f"cores {cores[0]}-{cores[-1]}"
  return "cores " + ",".join(str(c) for c in cores)


def pinned_note() -> str:
  """"; on core 0 of a shared host (...)" once this task is pinned, else "":
  for the task's first line, so a user who sees one busy core knows why."""
  if _pinned is None:
    return ""
  return (f"; on {describe(_pinned)} of a host shared with other tasks of "
          "the job (--nopin_cpus: the OS places it)")


def pin_task(info: cluster_lib.ClusterInfo) -> Optional[List[int]]:
  """Keeps this process, every thread of it, on the task's own cores.

  Returns:
    The cores, or None when this task is not pinned: an evaluator (no host
    in the cluster), or see cores_for_task.
  """
  global _pinned, _host_share
  if not (info.is_ps or info.is_worker):
    return None
  allowed = allowed_cores()
  cores = cores_for_task(info, allowed)
  if cores is None or not hasattr(os, "sched_setaffinity"):
    return None
  for thread in _threads():
    try:
      os.sched_setaffinity(thread, cores)
    except OSError:
      pass  # The thread ended meanwhile; new threads inherit the mask.
  _pinned, _host_share = tuple(cores), tuple(allowed)
  return cores


def release_threads(name: str) -> List[int]:
  """Lets this pinned process's threads called `name` use any of the host's
  cores, at the lowest priority.

  For a worker's input thread (data.INPUT_THREAD_NAME): on its own core it
  competes with the training step, while a PS's core idles for part of every
  step. At nice 19 it takes only the time a core's other threads leave, so it
  never delays a PS's apply. 1 PS + 1 worker on 2 cores, reference MLP,
  synthetic data: 204 -> 258 steps/s (medians of 3 runs each, in turns).

  Returns:
    The thread ids released; none when the process is not pinned.
  """
  if _pinned is None:
    return []
  released = []
  for thread in threads_named(name):
    try:
      os.sched_setaffinity(thread, _host_share)
      # On Linux a thread id given to setpriority names that thread alone.
      os.setpriority(os.PRIO_PROCESS, thread, RELEASED_NICE)
    except OSError:
      continue  # The thread ended meanwhile.
    released.append(thread)
  return released


def threads_named(name: str) -> List[int]:
  """The ids of this process's threads whose Linux name is `name`."""
  found = []
  for thread in _threads():
    try:
      with open(f"/proc/self/task/{thread}/comm") as comm:
        if comm.read().strip() == name:
          found.append(thread)
    except OSError:
      pass  # The thread ended after the listing.
  return found


def _threads() -> List[int]:
  """The ids of this process's threads."""
  return [int(thread) for thread in os.listdir("/proc/self/task")]
