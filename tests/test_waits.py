"""Waits that say whom they wait for, give up in time and end on a stop (waits.py; no servers)."""

import contextlib
import io
import signal
import socket
import time
from unittest import mock

from absl.testing import absltest

from ps_trainer.cluster import waits
from ps_trainer.faults import stops
import testutil


class WaitsTest(absltest.TestCase):

  def test_a_requested_stop_ends_a_wait(self):
    stop = stops.StopRequest("worker 1")
    with contextlib.redirect_stdout(io.StringIO()):
      stop.request(signal.SIGTERM)
    self.addCleanup(stop.ended)
    with self.assertRaisesRegex(waits.Stopped,
                                r"^stopped on SIGTERM while waiting for ps 0 at h:1$"):
      waits.wait_until(lambda: False, "ps 0 at h:1", timeout_secs=60, stop=stop,
                       sleep=lambda secs: None)

  def test_note_at_once_names_whom_it_waits_for_before_the_first_pause(self):
    polls = iter([False, False, True])
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      waits.wait_until(lambda: next(polls), "ps 0 at h:1", timeout_secs=60,
                       note_at_once=True, sleep=lambda secs: None)
    self.assertEqual(output.getvalue(),
                     "waiting for ps 0 at h:1 (giving up after 60 s)\n")

  def test_each_line_of_a_wait_starts_with_the_task_that_waits(self):
    # Its lines then read like the task's others in a log shared by several tasks; the task is
    # the one its stop request is for.
    polls = iter([False, False, True])
    now = iter([0.0, 11.0])
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
      waits.wait_until(lambda: next(polls), "ps 0 at h:1", timeout_secs=60,
                       note_at_once=True, clock=lambda: next(now),
                       sleep=lambda secs: None, stop=stops.StopRequest("worker 1"))
    self.assertEqual(output.getvalue(),
                     "worker 1: waiting for ps 0 at h:1 (giving up after 60 s)\n"
                     "worker 1: still waiting for ps 0 at h:1 (11 s so far, giving up after "
                     "60 s)\n")

  def test_unreachable_names_the_addresses_that_refuse(self):
    port, = testutil.pick_free_ports(1)
    self.assertEqual(waits.unreachable({"worker 1": f"127.0.0.1:{port}"}),
                     [f"worker 1 at 127.0.0.1:{port}"])

  def test_a_host_name_whose_lookup_hangs_is_unreachable_within_the_bound(self):
    def hung_lookup():
      time.sleep(3)
      raise socket.gaierror("Temporary failure in name resolution")
    lookups = []
    with mock.patch.object(socket, "getaddrinfo",
                           lambda *args: (lookups.append(args), hung_lookup())[1]):
      started = time.monotonic()
      self.assertFalse(waits.reachable("ps-0.example:2222", timeout_secs=0.3))
      self.assertLess(time.monotonic() - started, 1.5)
      # Asked again while that lookup still hangs: it waits for the same one, not a new thread.
      self.assertFalse(waits.reachable("ps-0.example:2222", timeout_secs=0.3))
      self.assertEqual(len(lookups), 1)

  def test_a_host_name_that_resolves_is_reachable(self):
    with _one_open_address_one_closed() as (open_address, closed_address):
      port = open_address.rpartition(":")[2]
      self.assertTrue(waits.reachable(f"localhost:{port}"))
      self.assertFalse(waits.reachable(f"localhost:{closed_address.rpartition(':')[2]}"))

  def test_still_unreachable_polls_for_its_grace_then_keeps_the_silent(self):
    clock = _FakeClock()
    with _one_open_address_one_closed() as (open_address, closed_address):
      missing = waits.still_unreachable(
          {0: open_address, 1: closed_address}, within_secs=2.0,
          poll_secs=0.5, clock=clock.now, sleep=clock.sleep)
      self.assertEqual(missing, {1: closed_address})
      self.assertEqual(clock.pauses, [0.5] * 4)  # Polled until the grace ran out.
      self.assertEqual(waits.still_unreachable({0: open_address}, 2.0,
                                               sleep=clock.sleep), {})
      self.assertEqual(len(clock.pauses), 4)  # No pause once every one answers.

  def test_wait_for_addresses_gives_up_naming_those_that_never_answered(self):
    clock = _FakeClock()
    with _one_open_address_one_closed() as (open_address, closed_address):
      with self.assertRaises(waits.WaitTimeout) as raised:
        waits.wait_for_addresses({"ps 0": open_address, "ps 1": closed_address}, 2.0,
                                 clock=clock.now, sleep=clock.sleep)
    self.assertEqual(str(raised.exception),
                     f"gave up after 2 s waiting for ps 1 at {closed_address} (connection refused "
                     f"at {closed_address}: nothing listens there)")
    self.assertEqual(raised.exception.missing, {"ps 1": closed_address})


class _FakeClock:
  """A monotonic clock that moves only when slept on, and the pauses it was asked for."""

  def __init__(self):
    self.time = 0.0
    self.pauses = []

  def now(self) -> float:
    return self.time

  def sleep(self, secs: float) -> None:
    self.pauses.append(secs)
    self.time += secs


@contextlib.contextmanager
def _one_open_address_one_closed():
  """Yields ("127.0.0.1:port" that accepts connections, one that refuses them)."""
  closed, = testutil.pick_free_ports(1)
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    yield f"127.0.0.1:{listener.getsockname()[1]}", f"127.0.0.1:{closed}"


if __name__ == "__main__":
  absltest.main()
