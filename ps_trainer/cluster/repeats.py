"""Runs that TensorFlow turns away as repeats of earlier ones, run again.

A TF worker remembers the ids of the last 100,000 requests it received and
turns away one whose id it has seen: an AbortedError, "The same RunGraph
(Worker) request was received twice", meant for a request that the network
delivered twice. But the ids repeat by chance. The master runs every step
on a thread of its own (Env::SchedClosure starts one per call), and each
such thread seeds the generator of its request ids with 32 random bits, so
two steps whose threads drew the same seed send the same ids. A task turns a
run away with a chance of N / 2^32, N the ids in its memory: 1 in 43,000 once
it has received 100,000 runs. (A step's parts on all its tasks take their ids
from the one thread, so they repeat together.) At 600 steps/s, once 100,000
steps have run, one step in about 70 s is turned away.

Measured (2026-11-26): a one-task cluster turned away 6 of 400,000 trivial
runs, where the bound predicts about 8; the reference work on 1 PS + 1 worker
lost its session to it twice in 250,000 steps (at global steps ~46,000 and
~63,000), where the bound predicts about 4.7.
MonitoredSession took each for a lost PS and made its session again, and a
PS whose poll of its done flags was turned away would have exited.

The task that turns a run away checks the id before it runs any of it
(Worker::DoRunGraph), and the master then cancels the run's other parts.
So the run is sent again, from a new thread with a new seed. What the other
parts did before the cancel reached them stands, as after any failed step:
a worker may have taken a batch from its input, which is then skipped. And
sometimes a part never gets the cancel and waits forever for tensors of the
part turned away: the run never comes back, and the stall watch starts the
task again (stall_watch.py).
"""

from typing import Callable, TypeVar

import tensorflow as tf
# Saver and start_queue_runners accept only SessionInterface instances.
from tensorflow.python.client import session as tf_session

# A repeat by chance twice in a row has a chance below 1e-9; more than that
# is something else (a request the network really delivered twice), and the
# error goes on to the caller as before.
MAX_TRIES = 3

_MARK = "request was received twice"

T = TypeVar("T")


def is_repeat(error: BaseException) -> bool:
  """True for TF's error turning a request away as one it has seen."""
  return (isinstance(error, tf.errors.AbortedError)
          and _MARK in (error.message or ""))


def run_past_repeats(run: Callable[[], T],
                     on_repeat: Callable[[tf.errors.AbortedError], None]
                     = lambda error: None,
                     tries: int = MAX_TRIES) -> T:
  """run(), run again after each time TF turns it away as a repeat (at most
  `tries` in all); on_repeat(error) is called before each new try."""
  for attempt in range(1, tries + 1):
    try:
      return run()
    except tf.errors.AbortedError as e:
      if attempt == tries or not is_repeat(e):
        raise
      on_repeat(e)
  raise AssertionError("unreachable")  # The last try returns or raises.


class RepeatProofSession(tf_session.SessionInterface):
  """A tf Session whose run() is run again when turned away as a repeat.

  For the sessions the trainer makes on a cluster beside its MonitoredSession
  (a PS polling its done flags, the chief's sync thread, a worker waiting for
  the chief or writing a last checkpoint), and the base of the replica's own
  (session.py). The rest is the session's own. A SessionInterface, as
  Saver.save wants one.
  """

  def __init__(self, session: tf.compat.v1.Session,
               on_repeat: Callable[[tf.errors.AbortedError], None]
               = lambda error: None):
    self._session = session
    self._on_repeat = on_repeat

  @property
  def graph(self):
    return self._session.graph

  @property
  def sess_str(self):
    return self._session.sess_str

  def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
    return run_past_repeats(
        lambda: self._run_once(fetches, feed_dict, options, run_metadata),
        self._on_repeat)

  def _run_once(self, fetches, feed_dict, options, run_metadata):
    return self._session.run(fetches, feed_dict=feed_dict, options=options,
                             run_metadata=run_metadata)

  def partial_run_setup(self, *args, **kwargs):
    return self._session.partial_run_setup(*args, **kwargs)

  def partial_run(self, *args, **kwargs):
    return self._session.partial_run(*args, **kwargs)

  def __enter__(self):
    self._session.__enter__()
    return self

  def __exit__(self, *exc_info):
    return self._session.__exit__(*exc_info)

  def __getattr__(self, name):
    return getattr(self._session, name)


def session(target: str, **kwargs) -> RepeatProofSession:
  """tf.compat.v1.Session(target, **kwargs), its runs past repeats."""
  return RepeatProofSession(tf.compat.v1.Session(target, **kwargs))
