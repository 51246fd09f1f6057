"""Flags the PS tasks hold for the replicas, and the short runs that set them.

`server.join()` blocks forever and a TF server has no clean stop, so a plain
TF1 PS never exits. Instead each PS holds one "done" flag per replica; every
training replica sets its flag on each PS as its last act, and a PS exits
once every flag is set (ps_task.py). The chief also reads PS 0's flags to
learn when the other workers have finished (see sync.py). PS 0 also holds
the sync replicas' hang vote (hang_vote.py).

A flag says how its replica left: FINISHED at the run's end, STOPPED before
it (a stop, a failure, a forced exit). It matters for the chief: async
workers train on without it, and when they finish after the chief stopped,
their steps since its final checkpoint are only on the PS tasks, which then
keep them for the chief (ps_task.py) rather than leave.
"""

import time

import tensorflow as tf

from ps_trainer.cluster import repeats
from ps_trainer.cluster import server as server_lib
from ps_trainer.cluster import waits
from ps_trainer.console import errors
from ps_trainer.settings import cluster as cluster_lib

# The values of a done flag; 0 while its replica trains (or never came).
FINISHED = 1
STOPPED = 2


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
    self.others_done = tf.reduce_sum(tf.minimum(flags, 1) * others)


def signal_done(target: str, info: cluster_lib.ClusterInfo, finished: bool,
                timeout_secs: float = 30.0) -> None:
  """Tells every PS that answers that this replica is done: FINISHED at the
  run's end if `finished`, else STOPPED.

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
                  lambda flags: _set_all(flags, info.replica_index,
                                         FINISHED if finished else STOPPED))
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
  config = server_lib.session_config(info)
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


class OwnFlags:
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
                                    config=server_lib.session_config(info))

  def __enter__(self):
    self._session.run(self._zero)
    return self

  def __exit__(self, *unused):
    self._session.close()

  def __call__(self) -> list:
    """The replicas' flags, by replica index: 0, FINISHED or STOPPED."""
    return [int(flag) for flag in self._session.run(self._read)]


def init_done_flags(target: str, info: cluster_lib.ClusterInfo) -> None:
  """Zeroes the done flags of the PS `info` names (what run_ps does first)."""
  with OwnFlags(info, target):
    pass
