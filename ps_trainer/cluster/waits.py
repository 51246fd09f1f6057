"""Bounded waits that say what they wait for.

A replica that waits silently looks hung; one that waits forever is hung, as
a TF1 worker's session creation does for a PS that never comes. Every wait
here has a deadline and prints whom it is waiting for at intervals.
"""

import ipaddress
import socket
import threading
import time
from typing import Callable, Optional


class WaitTimeout(RuntimeError):
  """A bounded wait ran out. The message is one line.

  `missing` is {name: address} of those a wait for addresses still lacked
  (empty for other waits), so a caller can say who did answer.
  """

  def __init__(self, message: str, missing: Optional[dict] = None):
    super().__init__(message)
    self.missing = dict(missing or {})


class Stopped(RuntimeError):
  """A stop was requested (SIGINT/SIGTERM) while waiting."""


def wait_until(ready: Callable[[], bool], what, timeout_secs: float,
               poll_secs: float = 0.5, note_every_secs: float = 10.0,
               clock=time.monotonic, sleep=time.sleep, stop=None,
               note_at_once: bool = False, who: str = "") -> None:
  """Polls `ready()` until it is true, printing `what` every so often.

  Args:
    ready: returns True when the wait is over.
    what: completes "waiting for ...", e.g. "the chief to initialize the model";
      a string, or a callable returning one when the answer changes.
    timeout_secs: the bound.
    poll_secs: pause between polls.
    note_every_secs: pause between "still waiting" lines.
    stop: a StopRequest (stops.py), or None; a requested stop ends the wait.
    note_at_once: print "waiting for" at once if not ready at the first poll.
    who: the task that waits ("worker 1"), said first on each of those
      lines; by default the one `stop` is for.

  Raises:
    WaitTimeout: `ready()` stayed false for `timeout_secs`.
    Stopped: `stop` was requested.
  """
  describe = what if callable(what) else lambda: what
  who = who or (stop.who if stop is not None else "")
  said = f"{who}: " if who else ""
  start = clock()
  next_note = start + note_every_secs
  if note_at_once:
    if ready():
      return
    print(f"{said}waiting for {describe()} (giving up after "
          f"{timeout_secs:.0f} s)", flush=True)
  while not ready():
    now = clock()
    if stop is not None and stop.requested:
      raise Stopped(f"stopped on {stop.signal_name} while waiting for "
                    f"{describe()}")
    if now - start >= timeout_secs:
      raise WaitTimeout(
          f"gave up after {timeout_secs:.0f} s waiting for {describe()}")
    if now >= next_note:
      print(f"{said}still waiting for {describe()} ({now - start:.0f} s so "
            f"far, giving up after {timeout_secs:.0f} s)", flush=True)
      next_note = now + note_every_secs
    sleep(poll_secs)


def report_uninitialized(variables):
  """report_uninitialized_variables, without TF's "never used" dump at exit.

  TF prints a page of stack trace for such a tensor that no run used, which
  happens to every readiness check a failing task never reached.
  """
  import tensorflow as tf  # Deferred: the waits above need no TF.
  report = tf.compat.v1.report_uninitialized_variables(variables)
  getattr(report, "mark_used", lambda: None)()
  return report


def all_initialized(session, report_op) -> Callable[[], bool]:
  """A `ready` callable: true once `report_op` lists no uninitialized variable."""
  return lambda: session.run(report_op).size == 0


def reachable(address: str, timeout_secs: float = 1.0) -> bool:
  """True if something accepts TCP connections at "host:port" within
  `timeout_secs`, a host name's lookup included: a resolver that does not
  answer (a Kubernetes service being torn down) would otherwise hold the
  stall watch for its own timeouts, 5 s and more a try."""
  host, _, port = address.rpartition(":")
  host = host.strip("[]")
  if _is_ip(host):
    return _connects(address, host, port, timeout_secs)
  with _lookups_lock:
    # One try at a time for an address: under a resolver that does not
    # answer, a thread a call would pile up, each living its timeouts.
    lookup, answer = _lookups.get(address, (None, None))
    if lookup is None or not lookup.is_alive():
      answer = []
      lookup = threading.Thread(
          target=lambda: answer.append(
              _connects(address, host, port, timeout_secs)),
          name="ps_trainer_reachable", daemon=True)  # No TensorFlow in it.
      _lookups[address] = (lookup, answer)
      lookup.start()
  lookup.join(timeout_secs)
  return bool(answer and answer[0])


_lookups = {}  # {address: (the thread of its latest try, [its answer])}
_lookups_lock = threading.Lock()


def _is_ip(host: str) -> bool:
  try:
    ipaddress.ip_address(host)
  except ValueError:
    return False
  return True


def _connects(address: str, host: str, port: str, timeout_secs: float) -> bool:
  """Whether host:port accepts a connection; notes in _refused whether its
  last try was refused (nothing listens there) rather than unanswered."""
  try:
    with socket.create_connection((host, int(port)), timeout=timeout_secs):
      _refused.discard(address)
      return True
  except ConnectionRefusedError:
    _refused.add(address)
    return False
  except (OSError, ValueError):
    _refused.discard(address)
    return False


# Addresses whose last try was refused: a host that is up, with nothing
# listening on the port (a task not started, or started on another port).
_refused = set()


def describe_missing(named: dict) -> str:
  """As describe, saying which addresses refuse connections: "ps 1 at
  h:2222 (connection refused at h:2222: nothing listens there)"."""
  return ", ".join(
      f"{name} at {address}" + (
          f" (connection refused at {address}: nothing listens there)"
          if address in _refused else "")
      for name, address in named.items())


def wait_for_addresses(named: dict, timeout_secs: float, **kwargs) -> None:
  """Waits until every {name: "host:port"} accepts connections, naming the missing.

  TensorFlow itself would wait for a missing task silently and forever when
  the session is created; this says whom it waits for and gives up in time.
  Each counts once it has answered, even if it goes away again.

  Raises:
    WaitTimeout: with `missing`, those that never answered.
    Stopped: as `wait_until`.
  """
  missing = dict(named)
  try:
    wait_until(lambda: _drop_reachable(missing),
               lambda: describe_missing(missing), timeout_secs, **kwargs)
  except WaitTimeout as timeout:
    raise WaitTimeout(str(timeout), missing) from None


def still_unreachable(named: dict, within_secs: float, poll_secs: float = 0.5,
                      clock=time.monotonic, sleep=time.sleep) -> dict:
  """{name: address} of those in `named` that accepted no connection within
  `within_secs`, polled every `poll_secs`; quiet, and no error when some do
  not."""
  missing = dict(named)
  deadline = clock() + within_secs
  while not _drop_reachable(missing) and clock() < deadline:
    sleep(poll_secs)
  return missing


def _drop_reachable(missing: dict) -> bool:
  """Removes from {name: address} each that accepts connections; True once
  none is left."""
  for name in [n for n, address in missing.items() if reachable(address)]:
    del missing[name]
  return not missing


def describe(named: dict) -> str:
  """"name at host:port, ..." for {name: address}: how waits name tasks."""
  return ", ".join(f"{name} at {address}" for name, address in named.items())


def unreachable(named: dict) -> list:
  """["name at host:port", ...] for each {name: address} that refuses connections."""
  return [f"{name} at {address}" for name, address in named.items()
          if not reachable(address)]
