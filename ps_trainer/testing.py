"""Helpers for graph-mode unit tests of your own model_fn and input_fn.

For pytest or tf.test.TestCase files:

  from ps_trainer import testing
  result = testing.train_in_process(model_fn, input_fn, num_ps=2,
                                    num_workers=2, train_steps=50)
  assert result["metrics"]["accuracy"] > 0.5

Everything runs in the calling process: one TensorFlow import, servers on
127.0.0.1, the trainer's real graph and session code for every worker in a
thread of its own. TensorFlow cannot stop a server, so servers live until the
process exits; each call starts fresh ones. Like the trainer, these helpers
switch the process to graph mode (tf.compat.v1.disable_eager_execution):
keep eager TF2 tests in files of their own.
"""

import contextlib
import dataclasses
import os
import tempfile
import threading
from typing import Callable, Dict, Iterator, List, Optional

from absl import flags as absl_flags

from ps_trainer.console import quiet_import
from ps_trainer.settings import cluster as cluster_lib
from ps_trainer.settings import config as config_lib
from ps_trainer.settings import flags as flags_lib
from ps_trainer.settings import host_ports
from ps_trainer.user_model import loading

tf = quiet_import.tensorflow()

# pylint: disable=g-import-not-at-top,wrong-import-position
from ps_trainer.cluster import ps_flags
from ps_trainer.cluster import server as server_lib
from ps_trainer.datasets import data
from ps_trainer.datasets import data_sets
from ps_trainer.faults import stops
from ps_trainer.graph import train_graph
from ps_trainer.training import trainer
# pylint: enable=g-import-not-at-top,wrong-import-position

_SERVERS: List[tf.distribute.Server] = []  # Kept: nothing may tear one down.
_PORT_ATTEMPTS = 3


@dataclasses.dataclass(frozen=True)
class LocalCluster:
  """In-process servers on 127.0.0.1.

  Attributes:
    ps_hosts, worker_hosts: the --ps_hosts and --worker_hosts a task of
      this cluster would get.
    ps_targets, worker_targets: each server's session target.
  """
  ps_hosts: str
  worker_hosts: str
  ps_targets: tuple
  worker_targets: tuple

  def info(self, job_name: str, task_index: int) -> cluster_lib.ClusterInfo:
    """The cluster from the view of one task."""
    return cluster_lib.from_flags(self.ps_hosts, self.worker_hosts, job_name,
                                  task_index)


@contextlib.contextmanager
def local_cluster(num_ps: int = 1, num_workers: int = 1
                  ) -> Iterator[LocalCluster]:
  """Starts num_ps PS and num_workers worker servers in this process.

  Each PS starts as a PS task does (its done flags zeroed), so the trainer's
  end of run works against it. A port taken between picking and binding it
  means a fresh set of ports (three tries).

  Raises:
    server.ServerError: no free ports in three tries.
  """
  tf.compat.v1.disable_eager_execution()
  for attempt in range(_PORT_ATTEMPTS):
    hosts = [f"127.0.0.1:{port}" for port in host_ports.free_ports(num_ps + num_workers)]
    cluster = LocalCluster(",".join(hosts[:num_ps]), ",".join(hosts[num_ps:]),
                           (), ())
    try:
      servers = [server_lib.start_server(cluster.info(job, i),
                                         warn_if_exposed=False)
                 for job, count in (("ps", num_ps), ("worker", num_workers))
                 for i in range(count)]
    except server_lib.ServerError:
      if attempt == _PORT_ATTEMPTS - 1:
        raise
      continue
    _SERVERS.extend(servers)
    cluster = dataclasses.replace(
        cluster, ps_targets=tuple(s.target for s in servers[:num_ps]),
        worker_targets=tuple(s.target for s in servers[num_ps:]))
    for i, target in enumerate(cluster.ps_targets):
      ps_flags.init_done_flags(target, cluster.info("ps", i))
    yield cluster
    return


def config(model_fn: Callable, input_fn: Optional[Callable] = None,
           params: Optional[dict] = None, flags: Optional[dict] = None,
           cluster: Optional[LocalCluster] = None,
           worker: int = 0) -> config_lib.Config:
  """The Config a task of `cluster` (None: local mode) would build from the
  trainer's flags with this model; `flags` maps flag names to values.

  Raises:
    config.ConfigError, cluster.ClusterError: flags that do not go together.
  """
  values = _flag_values(flags or {})
  values.update(model=loading.name_of(model_fn),
                input_fn=loading.name_of(input_fn),
                params=loading.parse_params(_json(params or {})),
                pin_cpus=False)
  if cluster is not None:
    values.update(ps_hosts=cluster.ps_hosts, worker_hosts=cluster.worker_hosts,
                  job_name="worker", task_index=worker)
  cfg = config_lib.from_flag_values(values, "")
  return config_lib.with_user_model(cfg, loading.from_functions(
      model_fn, input_fn, cfg.model.params, cfg.model.model,
      cfg.model.input_fn))


def placement(model_fn: Callable, input_fn: Optional[Callable] = None,
              num_ps: int = 2, params: Optional[dict] = None,
              **flags) -> Dict[str, str]:
  """{variable name: device} of the model's variables (trainable ones and
  tf.compat.v1.model_variables, not the optimizer's) as the trainer places
  them on worker 0 of a cluster with `num_ps` PS tasks (no server needed)."""
  tf.compat.v1.disable_eager_execution()
  values = _flag_values(flags)
  values = config_lib.planned_worker(values, num_ps, num_workers=1)
  cfg = config(model_fn, input_fn, params, values)
  graph = train_graph.build_graph(cfg, _dataset(cfg)).graph
  with graph.as_default():
    return {v.op.name: v.device for v in
            tf.compat.v1.trainable_variables() + tf.compat.v1.model_variables()}


def train_in_process(model_fn: Callable, input_fn: Optional[Callable] = None,
                     num_ps: int = 1, num_workers: int = 1,
                     sync_replicas: bool = False, train_steps: int = 100,
                     params: Optional[dict] = None,
                     log_dir: Optional[str] = None, **flags) -> dict:
  """Trains the model with the trainer's own graph and session code and
  returns the chief's result.json dict.

  With num_ps=0 it trains alone (local mode); else every worker runs in a
  thread of its own against in-process servers.

  Args:
    model_fn, input_fn: as for --model and --input_fn.
    num_ps, num_workers: the cluster's size.
    sync_replicas: synchronous updates.
    train_steps: global steps.
    params: the `params` dict.
    log_dir: where checkpoints and result.json go (default: a new
      temporary directory).
    **flags: any other trainer flag, by name, e.g. batch_size=32.

  Raises:
    ModelFnError: a function broke the contract.
    Whatever a worker raised, the chief's first.
  """
  tf.compat.v1.disable_eager_execution()
  settings = dict(flags, train_steps=train_steps, sync_replicas=sync_replicas,
                  log_dir=log_dir or tempfile.mkdtemp(prefix="ps_trainer-"),
                  save_checkpoints_steps=flags.get("save_checkpoints_steps",
                                                   max(train_steps, 1)))
  if num_ps == 0:
    cfg = config(model_fn, input_fn, params, settings)
    return trainer.train(cfg, _dataset(cfg))
  with local_cluster(num_ps, num_workers) as cluster:
    configs = [config(model_fn, input_fn, params, settings, cluster, worker=i)
               for i in range(num_workers)]
    dataset = _dataset(configs[0])
    results, failures = [None] * num_workers, [None] * num_workers

    def train_worker(i):
      try:
        results[i] = trainer.train(configs[i], dataset,
                                   cluster.worker_targets[i],
                                   stops.StopRequest(configs[i].task_name))
      except BaseException as e:  # pylint: disable=broad-except
        failures[i] = e
    threads = [threading.Thread(target=train_worker, args=(i,),
                                name=f"worker-{i}", daemon=True)
               for i in range(num_workers)]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join()
  for failure in failures:
    if failure is not None:
      raise failure
  return results[0]


def _dataset(cfg: config_lib.Config) -> data.DataSet:
  if cfg.model.input_fn:
    return data_sets.from_input_fn(cfg.model.input_fn)
  return data.load(cfg.data.dataset, cfg.data.data_dir, cfg.data.data_path)


def _flag_values(flags: dict) -> dict:
  """The trainer's flag defaults, with `flags` (name -> value) over them."""
  values = absl_flags.FlagValues()
  flags_lib.define_flags(values)
  values(["ps_trainer"])
  defaults = values.flag_values_dict()
  unknown = sorted(set(flags) - set(defaults))
  if unknown:
    raise ValueError(f"unknown trainer flag(s): {', '.join(unknown)}")
  defaults.update(flags)
  return defaults


def _json(value: dict) -> str:
  import json  # pylint: disable=g-import-not-at-top
  return json.dumps(value)
