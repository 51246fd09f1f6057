"""Servers and the PS lifecycle: serve until every worker says it is done.

`server.join()` blocks forever and a TF server has no clean stop (NOTES.md,
failure mode 2). Instead each PS holds one "done" flag per replica; every
training replica sets its flag on each PS as its last act, and a PS exits
once every flag is set. The chief also reads PS 0's flags to learn when the
other workers have finished (see sync.py).
"""

import socket
import sys
import time
from typing import Optional

import tensorflow as tf

from ps_trainer import cluster as cluster_lib
from ps_trainer import errors
from ps_trainer import host_cores
from ps_trainer import repeats
from ps_trainer import waits

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
    probe.bind(("", port))  # The server binds every interface (NOTES.md).
  except OSError as e:
    raise ServerError(
        f"{info.job_name} {info.task_index} cannot listen on port {port} "
        f"({info.address}): {e.strerror}; another process holds it, so give "
        "this task a free port in the cluster's host lists") from None
  finally:
    probe.close()


def start_server(info: cluster_lib.ClusterInfo) -> tf.compat.v1.train.Server:
  """Starts this task's gRPC server; a taken port is a one-line error."""
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


def done_flags(ps_index: int, num_workers: int) -> tf.Variable:
  """PS `ps_index`'s done flags, one per replica. Every task creates them alike.

  Flags, not a count: a replica sets its own when it leaves and clears it
  before each of its sessions, so one that stops, starts again and finishes
  is one replica done, and not done while it trains. In no collection:
  neither checkpointed nor initialized by the chief; the PS sets them to zero
  when it starts.
  """
  with tf.device(f"/job:ps/task:{ps_index}"):
    return tf.compat.v1.get_variable(
        f"ps_trainer/done_ps{ps_index}", shape=[num_workers], dtype=tf.int32,
        initializer=tf.compat.v1.zeros_initializer(), trainable=False,
        collections=[])


def hang_flags(num_workers: int) -> tf.Variable:
  """PS 0's flags of replicas whose sync step looks hung, and a count of the
  restarts they agreed on (hang_vote.py): [num_workers + 1].

  Like the done flags: in no collection, and zeroed by PS 0 when it starts.
  """
  with tf.device("/job:ps/task:0"):
    return tf.compat.v1.get_variable(
        "ps_trainer/hang_flags", shape=[num_workers + 1], dtype=tf.int32,
        initializer=tf.compat.v1.zeros_initializer(), trainable=False,
        collections=[])


class DoneSignals:
  """The other replicas' done flags, as a replica's graph reads them.

  Attributes:
    others_done: how many other replicas have set their flag on PS 0 (the
      chief's measure at the end of a sync run).
  """

  def __init__(self, info: cluster_lib.ClusterInfo):
    flags = done_flags(0, info.num_workers)
    others = 1 - tf.one_hot(info.replica_index, info.num_workers,
                            dtype=tf.int32)
    self.others_done = tf.reduce_sum(flags * others)


def signal_done(target: str, info: cluster_lib.ClusterInfo,
                timeout_secs: float = 30.0) -> None:
  """Tells every PS that answers that this replica is done.

  In a short session and graph that see only those PS tasks: creating a
  session waits for every task it sees without bound (RunOptions' timeout
  starts only with the run), and a distributed session places the whole
  graph, so one absent PS would keep a stopping worker until forced out and
  the PS tasks that are there would never hear from it.
  """
  answering, missing = _answering_ps(info, within_secs=min(timeout_secs, 3.0))
  if missing:
    # Such a PS waits --wait_timeout_secs for a worker to answer, then exits.
    errors.warn(f"could not tell {', '.join(missing)} that this worker is "
                "done: not answering")
  if not answering:
    return
  try:
    _on_own_flags(target, info, answering, timeout_secs,
                  lambda flags: _set_all(flags, info.replica_index, 1))
  except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
          tf.errors.NotFoundError, tf.errors.FailedPreconditionError) as e:
    # A PS that went down since; it gives up on its own if need be.
    errors.warn("could not tell every PS that this worker is done: "
                + errors.first_line(str(e)))


def clear_done(target: str, info: cluster_lib.ClusterInfo,
               timeout_secs: float = 30.0, poll_secs: float = 0.2) -> None:
  """Tells every PS that this replica trains, before each of its sessions.

  A replica that was stopped said it was done. Started again with the same
  command, it would still count as done: the PS tasks would leave once the
  others are done, in the middle of its training, and a sync chief ending its
  run would stop releasing it.

  It reads the flags first and writes only when one is set (after such a
  restart). With a write every time, a PS restart's recovery hung the first
  step in 2 of 12 runs by hand, against 0 of 8 before this function existed;
  the cause is not known, so the write is kept to the case that needs it.

  A PS listens a moment before it has created its flags (NotFoundError until
  then), so this retries for up to `timeout_secs`. Past that, or when a PS
  does not answer in time, it raises UnavailableError, on which
  MonitoredSession creates the session again (waiting for the PS first).
  """
  ps_indices = sorted(info.jobs["ps"])
  index = info.replica_index
  deadline = time.monotonic() + timeout_secs
  while True:
    try:
      own = _on_own_flags(target, info, ps_indices, timeout_secs,
                          lambda flags: tf.stack([f[index] for f in flags]))
      if any(own):
        _on_own_flags(target, info, ps_indices, timeout_secs,
                      lambda flags: _set_all(flags, index, 0))
      return
    except (tf.errors.NotFoundError, tf.errors.FailedPreconditionError,
            tf.errors.DeadlineExceededError) as e:
      if (isinstance(e, tf.errors.DeadlineExceededError)
          or time.monotonic() >= deadline):
        raise tf.errors.UnavailableError(
            None, None, "a PS did not take this replica's done flag: "
            + errors.first_line(str(e))) from e
      time.sleep(poll_secs)


def _on_own_flags(target: str, info: cluster_lib.ClusterInfo,
                  ps_indices: list, timeout_secs: float, make_fetch):
  """Runs make_fetch([the done flags of each PS in `ps_indices`]); returns
  its value (run_on_ps)."""
  return run_on_ps(
      target, info, ps_indices, timeout_secs,
      lambda: make_fetch([done_flags(i, info.num_workers) for i in ps_indices]))


def run_on_ps(target: str, info: cluster_lib.ClusterInfo, ps_indices: list,
              timeout_secs: float, build):
  """Runs build()'s fetch, made in a graph of its own, in a session that sees
  only the PS tasks in `ps_indices` and this task; returns its value."""
  graph = tf.Graph()
  with graph.as_default():
    fetch = build()
  config = session_config(info)
  del config.device_filters[:]
  config.device_filters.extend(
      [f"/job:ps/task:{i}" for i in ps_indices] + [info.task_device])
  options = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
  with repeats.session(target, graph=graph, config=config) as session:
    return session.run(fetch, options=options)


def _set_all(flags: list, index: int, value: int):
  """The op that sets flag `index` of each of `flags` to `value`."""
  return tf.group(*[tf.compat.v1.scatter_update(f, [index], [value])
                    for f in flags])


def _answering_ps(info: cluster_lib.ClusterInfo, within_secs: float) -> tuple:
  """([index of each PS that answers], ["ps i at host:port" of the others]).

  A PS gets a few seconds to answer: one lost connection attempt, or a PS
  restarting, should not cost it this replica's flag.
  """
  missing = waits.still_unreachable(dict(sorted(info.jobs["ps"].items())),
                                    within_secs)
  answering = sorted(set(info.jobs["ps"]) - set(missing))
  return answering, [f"ps {i} at {address}" for i, address in missing.items()]


class _DoneFlags:
  """A PS's own view of its done flags: zeroed once, then read. PS 0 zeroes
  the hang flags too."""

  def __init__(self, info: cluster_lib.ClusterInfo, target: str):
    self._graph = tf.Graph()
    with self._graph.as_default():
      flags = done_flags(info.task_index, info.num_workers)
      self._zero = [flags.initializer]
      if info.task_index == 0:
        self._zero.append(hang_flags(info.num_workers).initializer)
      self._read = flags.read_value()
    self._session = repeats.session(target, graph=self._graph,
                                    config=session_config(info))

  def __enter__(self):
    self._session.run(self._zero)
    return self

  def __exit__(self, *unused):
    self._session.close()

  def __call__(self) -> list:
    """The replicas' flags, by replica index: 1 for each one done."""
    return [int(flag) for flag in self._session.run(self._read)]


def init_done_flags(target: str, info: cluster_lib.ClusterInfo) -> None:
  """Zeroes the done flags of the PS `info` names (what run_ps does first)."""
  with _DoneFlags(info, target):
    pass


# The longest pause between two "waiting for" lines of a PS.
_MAX_STRAGGLER_NOTE_SECS = 600.0


def run_ps(info: cluster_lib.ClusterInfo, stop, wait_timeout_secs: float,
           poll_secs: float = 0.5, probe_every_secs: float = 2.0,
           straggler_note_secs: float = 30.0, clock=time.monotonic) -> int:
  """Runs a PS task until every replica is done; returns the exit status.

  0 once every replica has said it is done. A PS never waits forever: if no
  worker has answered for `wait_timeout_secs` (they crashed or were never
  started), it gives up with status 1. After a stop request (`stop`, a
  stops.StopRequest) it stays only while workers still answer, at most the
  stop's grace period, so a stopping chief can still write its checkpoint.
  """
  server = start_server(info)
  watch = _WorkerWatch(info, wait_timeout_secs, probe_every_secs, clock)
  with _DoneFlags(info, server.target) as read_flags:
    errors.say(f"ps {info.task_index}: serving on {info.address}; waiting "
               f"for {info.num_workers} worker(s) to finish"
               f"{host_cores.pinned_note()}")
    # The flags, not their count: one replica started again (its flag
    # cleared) while another finishes leaves the count as it was.
    last = [0] * info.num_workers
    stop_seen = None
    next_note = None
    note_gap = straggler_note_secs
    while True:
      flags = read_flags()
      done = sum(flags)
      now = clock()
      changed = flags != last
      if changed or (next_note is not None and now >= next_note):
        # Once some are done, the rest are named: one that never joined
        # (other host lists, say) is otherwise waited for in silence. Named
        # ever more rarely while nothing changes: one worker stopped for good
        # while the rest train on for hours is not worth a line every 30 s.
        note_gap = (straggler_note_secs if changed
                    else min(2 * note_gap, _MAX_STRAGGLER_NOTE_SECS))
        left = not_done_names(info, flags)
        watch.note_done(info, flags)
        errors.say(f"ps {info.task_index}: {done} of {info.num_workers} "
                   f"worker(s) done{'; waiting for ' + left if left else ''}")
        last = flags
        next_note = now + note_gap
      if done >= info.num_workers:
        break
      answering = watch.any_answering(now)
      if stop.requested:
        stop_seen = stop_seen or now
        if not answering or now - stop_seen >= stop.grace_secs:
          errors.say(f"ps {info.task_index}: stopped on {stop.signal_name} "
                     f"with {done} of {info.num_workers} worker(s) done")
          return stop.exit_status()
      elif watch.gave_up(now):
        errors.say(f"ps {info.task_index}: giving up: no worker has answered "
                   f"for {wait_timeout_secs:.0f} s ({watch.describe()}) and "
                   f"{done} of {info.num_workers} said done "
                   "(--wait_timeout_secs); exiting with status 1")
        return 1
      time.sleep(poll_secs)
  if stop.requested:  # Stopped tasks exit 128 + the signal, as the others.
    errors.say(f"ps {info.task_index}: every worker is done; stopped on "
               f"{stop.signal_name}")
    return stop.exit_status()
  errors.say(f"ps {info.task_index}: every worker is done; exiting")
  return 0


def not_done_names(info: cluster_lib.ClusterInfo, flags: list,
                   most: int = 5) -> str:
  """"worker 1 at host:port, ..." for the replicas whose flag is not set.

  The first `most` of them, then how many more: a big job's line stays short.
  """
  addresses = info.replica_addresses()
  names = []
  for name in [info.replica_name(r)
               for r, flag in enumerate(flags) if not flag]:
    address = addresses.get(name)
    names.append(f"{name} at {address}" if address else name)
  more = f" and {len(names) - most} more" if len(names) > most else ""
  return ", ".join(names[:most]) + more


class _WorkerWatch:
  """Whether any worker of the cluster answers, probed every few seconds.

  A sparse cluster (Kubeflow's dynamic workers) does not tell a PS where the
  workers are; there the PS cannot tell and waits for their done signals.
  """

  def __init__(self, info, timeout_secs, probe_every_secs, clock,
               note_every_secs: Optional[float] = None):
    self._who = f"ps {info.task_index}"
    self._workers = {} if info.sparse else info.replica_addresses()
    self._done = set()
    self._timeout = timeout_secs
    self._probe_every = probe_every_secs
    # Often enough to be seen before a short bound runs out.
    self._note_every = note_every_secs or min(60.0, max(10.0, timeout_secs / 4))
    self._last_answer = clock()
    self._last_probe = None
    self._answering = True
    self._next_note = self._last_answer + self._note_every

  def note_done(self, info: cluster_lib.ClusterInfo, flags: list) -> None:
    """Leaves the replicas whose done flag is set out of the names it gives.

    They are still probed: a replica stopped and started again trains on with
    its flag set, so its answer still means the job is alive.
    """
    self._done = {info.replica_name(r) for r, flag in enumerate(flags) if flag}

  def any_answering(self, now) -> bool:
    if not self._workers:
      return True
    if self._last_probe is None or now - self._last_probe >= self._probe_every:
      self._last_probe = now
      self._answering = any(waits.reachable(a, timeout_secs=0.5)
                            for a in self._workers.values())
      if self._answering:
        self._last_answer = now
        self._next_note = now + self._note_every
      elif now >= self._next_note:
        errors.say(f"{self._who}: no worker has answered for "
                   f"{now - self._last_answer:.0f} s ({self.describe()}); "
                   f"giving up after {self._timeout:.0f} s")
        self._next_note = now + self._note_every
    return self._answering

  def gave_up(self, now) -> bool:
    return bool(self._workers) and now - self._last_answer >= self._timeout

  def describe(self) -> str:
    """The workers not yet done, with their addresses."""
    return waits.describe({name: a for name, a in self._workers.items()
                           if name not in self._done})
