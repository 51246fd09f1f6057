"""The cluster as one task sees it: built from host flags or TF_CONFIG.

Pure Python: nothing here imports TensorFlow except `ClusterInfo.cluster_spec`,
so every rule about roles and indices is testable in microseconds. The rules
about host:port text itself are in host_ports.py.

Roles:
  * `ps` tasks hold the variables.
  * `worker` tasks train. When the cluster has a `chief` job (TF_CONFIG from
    Kubeflow or Estimator-era tools), the chief is one more training replica
    and workers follow it; otherwise worker 0 is the chief.
  * `evaluator` is not part of the training cluster (as Kubeflow treats it).
"""

import dataclasses
import json
from typing import Mapping, Optional

from ps_trainer.settings import host_ports

# The host:port checks raise it too; callers catch it as cluster.ClusterError.
ClusterError = host_ports.ClusterError

TRAINING_JOBS = ("chief", "worker", "ps")
TASK_TYPES = ("chief", "worker", "ps", "evaluator")
# Older TFJob manifests call the chief "master"; both mean the same replica.
_ALIASES = {"master": "chief"}


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
  """The training cluster from one task's point of view.

  Attributes:
    jobs: job name -> {task index: "host:port"}, training jobs only. A sparse
      cluster (Kubeflow's dynamic workers) lists only some indices.
    job_name: this task's job: chief, worker, ps or evaluator.
    task_index: this task's index within its job.
    num_workers: training replicas (chief plus workers), even when `jobs` is
      sparse and does not list them all.
    num_ps: parameter server tasks.
    sparse: from Kubeflow's "sparseCluster": no task knows every other, so
      each session carries its cluster to the tasks it uses (server.py).
  """
  jobs: Mapping[str, Mapping[int, str]]
  job_name: str
  task_index: int
  num_workers: int
  num_ps: int
  sparse: bool = False

  def hosts_by_job(self) -> dict:
    """job -> its "host:port" list in task order, jobs by name."""
    return {job: [tasks[i] for i in sorted(tasks)]
            for job, tasks in sorted(self.jobs.items())}

  @property
  def has_chief_job(self) -> bool:
    return "chief" in self.jobs

  @property
  def is_ps(self) -> bool:
    return self.job_name == "ps"

  @property
  def is_worker(self) -> bool:
    """True for every training replica, the chief included."""
    return self.job_name in ("chief", "worker")

  @property
  def is_chief(self) -> bool:
    if self.has_chief_job:
      return self.job_name == "chief"
    return self.job_name == "worker" and self.task_index == 0

  @property
  def replica_index(self) -> int:
    """0 for the chief, then 1.. for the workers: the data shard to read."""
    if self.job_name == "chief":
      return 0
    if self.job_name == "worker":
      return self.task_index + (1 if self.has_chief_job else 0)
    raise ClusterError(f"the {self.job_name} task is not a training replica")

  def replica_name(self, replica: int) -> str:
    """The task that is replica `replica` ("chief", "worker i"): the inverse
    of `replica_index`. "replica i" in a sparse cluster, where a PS sees only
    itself and cannot tell a chief job from none."""
    if self.sparse:
      return f"replica {replica}"
    if self.has_chief_job:
      return "chief" if replica == 0 else f"worker {replica - 1}"
    return f"worker {replica}"

  @property
  def task_device(self) -> str:
    return f"/job:{self.job_name}/task:{self.task_index}"

  @property
  def address(self) -> str:
    return self.jobs[self.job_name][self.task_index]

  def ps_addresses(self) -> dict:
    """{"ps i": "host:port"} of every PS task."""
    return {f"ps {i}": a for i, a in sorted(self.jobs["ps"].items())}

  def replica_addresses(self) -> dict:
    """{"chief" or "worker i": "host:port"} of the replicas this task knows."""
    named = {"chief": a for a in self.jobs.get("chief", {}).values()}
    named.update((f"worker {i}", a)
                 for i, a in sorted(self.jobs.get("worker", {}).items()))
    return named

  def device_filters(self) -> list:
    """Devices this task may talk to.

    A worker sees the PS tasks and itself only, so it neither waits for nor
    depends on the other workers: without filters, a session waits for every
    task of the cluster, and one lost worker stalls the rest. A PS sees
    itself.
    """
    if self.is_ps:
      return [self.task_device]
    return ["/job:ps", self.task_device]

  def cluster_spec(self):
    """The tf.train.ClusterSpec of the training cluster (sparse if `jobs` is)."""
    import tensorflow as tf  # Deferred: keeps this module importable without TF.
    return tf.train.ClusterSpec(
        {job: dict(tasks) for job, tasks in self.jobs.items()})


def from_flags(ps_hosts: str, worker_hosts: str, job_name: str,
               task_index: int) -> ClusterInfo:
  """Builds the cluster from --ps_hosts/--worker_hosts/--job_name/--task_index."""
  ps = host_ports.parse_hosts("--ps_hosts", ps_hosts)
  workers = host_ports.parse_hosts("--worker_hosts", worker_hosts)
  if job_name not in ("ps", "worker", "evaluator"):
    raise ClusterError(
        f"--job_name={job_name!r} is not a task type of a --ps_hosts/"
        "--worker_hosts cluster; accepted: ps, worker, evaluator (chief "
        "comes from TF_CONFIG)")
  if not ps:
    raise ClusterError(
        "--ps_hosts is empty; a cluster task needs at least one PS, e.g. "
        "--ps_hosts=10.0.0.1:2222")
  if not workers:
    raise ClusterError(
        "--worker_hosts is empty; a cluster task needs at least one worker, "
        "e.g. --worker_hosts=10.0.0.2:2222,10.0.0.3:2222")
  host_ports.check_unique("--ps_hosts/--worker_hosts", ps + workers)
  # The evaluator is outside the cluster (no host of its own): the host
  # lists tell it only the job's shape.
  if job_name != "evaluator":
    own = ps if job_name == "ps" else workers
    _check_index(f"--task_index={task_index}", job_name, task_index,
                 len(own))
  elif task_index != 0:
    raise ClusterError(
        f"--task_index={task_index}: a job has one evaluator, task 0 (two "
        "would write the same eval.json)")
  return ClusterInfo(
      jobs={"ps": dict(enumerate(ps)), "worker": dict(enumerate(workers))},
      job_name=job_name, task_index=task_index,
      num_workers=len(workers), num_ps=len(ps))


def _check_index(where: str, job_name: str, index: int, count: int) -> None:
  if not 0 <= index < count:
    raise ClusterError(
        f"{where}: {job_name} index out of range; the cluster has {count} "
        f"{job_name} task(s), so "
        + ("the accepted index is 0" if count == 1
           else f"accepted indices are 0-{count - 1}"))


def parse_tf_config(text: str, num_workers: Optional[int] = None
                    ) -> ClusterInfo:
  """Builds the cluster from a TF_CONFIG JSON string.

  Accepts the format Kubeflow's TFJob operator writes (lower-case types,
  "environment": "cloud"), its sparse form ("sparseCluster", where a worker
  sees only itself and the PS list), and Estimator-era configs with "chief" or
  "master". The evaluator is not part of the training cluster.

  Args:
    text: the TF_CONFIG value.
    num_workers: training replicas in the job; needed only for a sparse cluster,
      which does not list them (from --num_workers).

  Raises:
    ClusterError: naming the TF_CONFIG field that is wrong.
  """
  config = _json_object(text)
  sparse = "sparseCluster" in config
  raw_cluster = config.get("sparseCluster" if sparse else "cluster")
  task_type, task_index = _task(config.get("task"))
  jobs = _training_jobs(raw_cluster)
  if (sparse and task_type == "ps" and isinstance(raw_cluster.get("ps"), list)
      and len(jobs["ps"]) == 1):
    # Kubeflow's sparse config gives a PS only its own address, as a one-entry
    # list, whatever its index: it belongs at the task's index.
    jobs["ps"] = {task_index: jobs["ps"][0]}
  if task_type == "evaluator" and task_index != 0:
    raise ClusterError(
        f"TF_CONFIG field \"task\" is evaluator {task_index}: a job has one "
        "evaluator, index 0 (two would write the same eval.json)")
  if task_type != "evaluator" and task_index not in jobs.get(task_type, {}):
    listed = sorted(jobs.get(task_type, {}))
    raise ClusterError(
        f"TF_CONFIG field \"task\" is {task_type} {task_index}, which the "
        f"cluster does not list; listed {task_type} indices: "
        f"{listed if listed else 'none'}")
  count = _replica_count(jobs, sparse, num_workers)
  info = ClusterInfo(
      jobs=jobs, job_name=task_type, task_index=task_index, num_workers=count,
      num_ps=max(jobs["ps"]) + 1 if sparse else len(jobs["ps"]),
      sparse=sparse)
  if info.is_worker and info.replica_index >= count:
    source = "--num_workers" if sparse else "TF_CONFIG field \"cluster\""
    raise ClusterError(
        f"TF_CONFIG field \"task\" is {task_type} {task_index}, replica "
        f"{info.replica_index} of a job that {source} says has {count} "
        f"replicas; accepted replicas: 0-{count - 1}")
  return info


def _json_object(text: str) -> dict:
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise ClusterError(f"TF_CONFIG is not valid JSON ({e.msg} at line "
                       f"{e.lineno} column {e.colno})") from None
  if not isinstance(config, dict):
    raise ClusterError("TF_CONFIG must be a JSON object with \"cluster\" and "
                       "\"task\" fields")
  return config


def _task(task) -> tuple:
  """TF_CONFIG's "task" -> (type, index)."""
  if not isinstance(task, dict):
    raise ClusterError("TF_CONFIG field \"task\" is missing or not an object; "
                       "expected e.g. {\"type\": \"worker\", \"index\": 0}")
  task_index = task.get("index", 0)
  if not isinstance(task_index, int) or isinstance(task_index, bool):
    raise ClusterError(f"TF_CONFIG field \"task.index\" is {task_index!r}; "
                       "expected a whole number >= 0")
  return _task_type(task.get("type")), task_index


def _training_jobs(raw_cluster) -> dict:
  """TF_CONFIG's cluster -> {job: {index: address}}, without the evaluator."""
  if not isinstance(raw_cluster, dict) or not raw_cluster:
    raise ClusterError("TF_CONFIG field \"cluster\" is missing or empty; "
                       "expected e.g. {\"ps\": [\"ps-0:2222\"], \"worker\": "
                       "[\"worker-0:2222\"]}")
  jobs = {}
  for raw_job, tasks in raw_cluster.items():
    job = _ALIASES.get(str(raw_job).lower(), str(raw_job).lower())
    if job == "evaluator":
      continue  # Not part of the training cluster.
    if job in jobs:
      raise ClusterError(
          f"TF_CONFIG field \"cluster\" lists the {job} job twice (\"chief\" "
          "and \"master\" name the same job); keep one")
    if job not in TRAINING_JOBS:
      raise ClusterError(
          f"TF_CONFIG field \"cluster\" names an unknown job {raw_job!r}; "
          f"accepted: {', '.join(TRAINING_JOBS + ('evaluator', 'master'))}")
    jobs[job] = _job_tasks(job, tasks)
  if "ps" not in jobs:
    raise ClusterError("TF_CONFIG field \"cluster\" has no \"ps\" job; a "
                       "parameter-server job needs at least one PS")
  if "worker" not in jobs and "chief" not in jobs:
    raise ClusterError("TF_CONFIG field \"cluster\" has neither \"chief\" nor "
                       "\"worker\"; training needs at least one replica")
  host_ports.check_unique("TF_CONFIG field \"cluster\"",
                          [a for tasks in jobs.values() for a in tasks.values()])
  if "chief" in jobs and len(jobs["chief"]) != 1:
    raise ClusterError("TF_CONFIG field \"cluster.chief\" must list exactly one "
                       f"task; it lists {len(jobs['chief'])}")
  return jobs


def _replica_count(jobs: dict, sparse: bool, num_workers: Optional[int]) -> int:
  """Training replicas: listed in a dense cluster, from --num_workers if sparse."""
  listed = len(jobs.get("chief", {})) + len(jobs.get("worker", {}))
  if sparse:
    if not num_workers:
      raise ClusterError(
          "TF_CONFIG has a \"sparseCluster\", which does not list every "
          "worker; pass --num_workers=N (chief plus workers) as well")
    return num_workers
  if num_workers and num_workers != listed:
    raise ClusterError(
        f"--num_workers={num_workers} disagrees with TF_CONFIG, whose "
        f"cluster has {listed} training replicas (chief + workers)")
  return listed


def _task_type(raw) -> str:
  if not isinstance(raw, str):
    raise ClusterError(f"TF_CONFIG field \"task.type\" is {raw!r}; accepted: "
                       f"{', '.join(TASK_TYPES)}")
  task_type = _ALIASES.get(raw.lower(), raw.lower())
  if task_type not in TASK_TYPES:
    raise ClusterError(f"TF_CONFIG field \"task.type\" is {raw!r}, an unknown "
                       f"task type; accepted: {', '.join(TASK_TYPES)}")
  return task_type


def _job_tasks(job: str, tasks) -> dict:
  """A job's task list or sparse {"index": address} map -> {int: address}."""
  where = f"TF_CONFIG field \"cluster.{job}\""
  if isinstance(tasks, list):
    result = dict(enumerate(tasks))
  elif isinstance(tasks, dict):
    result = {}
    for key, address in tasks.items():
      if not (isinstance(key, str) and key.isascii() and key.isdigit()):
        raise ClusterError(f"{where}: task index {key!r} is not a whole "
                           "number >= 0")
      result[int(key)] = address
  else:
    raise ClusterError(f"{where} must be a list of \"host:port\" strings")
  for address in result.values():
    if not isinstance(address, str):
      raise ClusterError(f"{where}: {address!r} is not a \"host:port\" string")
    host_ports.check_address(where, address)
  return result


def resolve(ps_hosts: str, worker_hosts: str, job_name: str,
            task_index: Optional[int], tf_config: str,
            num_workers: Optional[int] = None) -> Optional[ClusterInfo]:
  """Picks the cluster from flags, TF_CONFIG, or neither (local mode: None).

  When both are given they must agree: the flags may repeat what TF_CONFIG
  says, never contradict it.
  """
  has_flags = bool(ps_hosts or worker_hosts or job_name or
                   task_index is not None)
  if tf_config.strip():
    info = parse_tf_config(tf_config, num_workers)
    _check_flags_agree(info, ps_hosts, worker_hosts, job_name, task_index)
    return info
  if not has_flags:
    if num_workers is not None:  # `./launch.sh --num_workers=2`: no `local`.
      raise ClusterError(
          f"--num_workers={num_workers}: no cluster to size (no --ps_hosts/"
          "--worker_hosts, no TF_CONFIG), so this process would train "
          f"alone; ./launch.sh local --num_workers={num_workers} starts a "
          "cluster here")
    return None
  if not job_name:
    raise ClusterError("--job_name is missing; a cluster task needs "
                       "--job_name=ps|worker|evaluator and --task_index")
  if task_index is None:
    raise ClusterError(f"--task_index is missing for --job_name={job_name}; "
                       "pass the task's index in its host list, from 0")
  info = from_flags(ps_hosts, worker_hosts, job_name, task_index)
  if num_workers and num_workers != info.num_workers:
    raise ClusterError(f"--num_workers={num_workers} disagrees with "
                       f"--worker_hosts, which lists {info.num_workers}")
  return info


def _check_flags_agree(info: ClusterInfo, ps_hosts: str, worker_hosts: str,
                       job_name: str, task_index: Optional[int]) -> None:
  def clash(flag, value, tf_value):
    value = " ".join(str(value).split())  # Keeps the message on one line.
    raise ClusterError(f"{flag}={value} disagrees with TF_CONFIG, which says "
                       f"{tf_value}; pass one or the other, or make them agree")
  if job_name and job_name != info.job_name:
    clash("--job_name", job_name, f"task type {info.job_name}")
  if task_index is not None and task_index != info.task_index:
    clash("--task_index", task_index, f"task index {info.task_index}")
  if ps_hosts:
    listed = [info.jobs["ps"][i] for i in sorted(info.jobs["ps"])]
    if host_ports.parse_hosts("--ps_hosts", ps_hosts) != listed:
      clash("--ps_hosts", ps_hosts, ",".join(listed))
  if worker_hosts:
    workers = info.jobs.get("worker", {})
    listed = [workers[i] for i in sorted(workers)]
    if host_ports.parse_hosts("--worker_hosts", worker_hosts) != listed:
      clash("--worker_hosts", worker_hosts, ",".join(listed) or "no workers")
