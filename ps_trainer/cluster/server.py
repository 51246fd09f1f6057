"""A task's gRPC server and its session settings.

What the PS tasks hold for the others (done and hang flags) is in
ps_flags.py; a PS task's life, serving until every worker is done, in
ps_task.py.
"""

import socket
import sys

import tensorflow as tf

from ps_trainer.cluster import host_cores
from ps_trainer.settings import cluster as cluster_lib


class ServerError(RuntimeError):
  """The server could not start. The message is one line."""


def session_config(info: cluster_lib.ClusterInfo) -> tf.compat.v1.ConfigProto:
  """ConfigProto for this task: device filters keep workers independent.

  In a sparse cluster (Kubeflow's dynamic workers) a PS does not know the
  workers' addresses, yet sends tensors back to them; the cluster definition
  travels with the session instead (TF's ClusterSpec propagation).
  """
  config = tf.compat.v1.ConfigProto(device_filters=info.device_filters())
  threads = host_cores.threads_per_task(info)
  if threads:
    config.intra_op_parallelism_threads = threads
    config.inter_op_parallelism_threads = threads
  if info.sparse:
    config.cluster_def.CopyFrom(info.cluster_spec().as_cluster_def())
    # Every worker's session must see the same variables on a PS.
    config.experimental.share_session_state_in_clusterspec_propagation = True
  return config


def _check_port_free(info: cluster_lib.ClusterInfo) -> None:
  """Names a taken port in one line, before gRPC prints its own noise."""
  port = int(info.address.rpartition(":")[2])
  probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  # SO_REUSEADDR, as gRPC sets it: connections in TIME_WAIT don't count.
  probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    probe.bind(("", port))  # The server binds every interface.
  except OSError as e:
    raise ServerError(
        f"{info.job_name} {info.task_index} cannot listen on port {port} "
        f"({info.address}): {e.strerror}; another process holds it, so give "
        "this task a free port in the cluster's host lists") from None
  finally:
    probe.close()


def start_server(info: cluster_lib.ClusterInfo,
                 warn_if_exposed: bool = True) -> tf.compat.v1.train.Server:
  """Starts this task's gRPC server; a taken port is a one-line error.

  `warn_if_exposed`: print the line on what the server exposes (False for a
  test's servers, which live only as long as the test's process).
  """
  _check_port_free(info)
  spec, job, index = info.cluster_spec(), info.job_name, info.task_index
  if info.sparse:
    # With the cluster propagated per session, TF refuses a server booted
    # under a name the session's cluster uses; boot under a neutral one.
    spec, job, index = tf.train.ClusterSpec({"boot": [info.address]}), "boot", 0
  try:
    server = tf.compat.v1.train.Server(spec, job_name=job, task_index=index,
                                       config=session_config(info), start=True)
  except (tf.errors.UnknownError, tf.errors.InvalidArgumentError) as e:
    reason = str(e).splitlines()[0]
    raise ServerError(
        f"cannot start the {info.job_name} {info.task_index} server on "
        f"{info.address}: {reason} (is the port already in use?)") from None
  if warn_if_exposed:
    _warn_if_exposed(info)
  return server


def _warn_if_exposed(info: cluster_lib.ClusterInfo) -> None:
  """One line on what a listening server exposes (README: Security).

  Not in a network namespace with loopback only (`launch.sh local`), where
  nothing outside this machine's private namespace can reach it.
  """
  if [name for _, name in socket.if_nameindex()] == ["lo"]:
    return
  port = info.address.rpartition(":")[2]
  print(f"ps_trainer: warning: this task's TensorFlow server listens on port "
        f"{port} of every network interface, without authentication: anyone "
        "who can reach it can run code as this user; keep the cluster on a "
        "trusted network (README: Security)", file=sys.stderr, flush=True)
