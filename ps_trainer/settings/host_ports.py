"""Host:port lists: the part of a cluster description written by hand.

Every rule here is about text a user typed (a flag or a TF_CONFIG list), so
each failure is one line that names where the text came from. Two tasks on
one machine and port cannot both listen, so duplicates are refused here too.
"""

import re
import socket
from typing import List, Sequence

_HOST_PORT = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):([0-9]+)")
# One machine's own addresses: a server listening on one listens on them all.
_LOOPBACK = re.compile(r"localhost|ip6-localhost|127(\.[0-9]+){3}|\[::1\]",
                       re.IGNORECASE)


class ClusterError(ValueError):
  """A cluster description that cannot work. The message is one line."""


def parse_hosts(flag: str, value: str) -> list:
  """Splits a comma-separated host:port list and checks every entry.

  Args:
    flag: the flag name used in messages, e.g. "--ps_hosts".
    value: the flag's value.

  Returns:
    The list of "host:port" strings (empty for an empty value).

  Raises:
    ClusterError: an empty entry (a host left out?), an entry without a
      port, a port out of range, or a duplicate.
  """
  hosts = [h.strip() for h in value.split(",")] if value else []
  if "" in hosts:
    # The entries as read, not the raw value: one from a file may end in "\n".
    raise ClusterError(
        f"{flag}={','.join(hosts)}: entry {hosts.index('') + 1} of "
        f"{len(hosts)} is empty; list every task's host:port, separated by "
        "single commas")
  for host in hosts:
    check_address(flag, host)
  check_unique(flag, hosts)
  return hosts


def check_address(where: str, address: str) -> None:
  """Raises ClusterError unless `address` is host:port with 1 <= port <= 65535."""
  match = _HOST_PORT.fullmatch(address)
  if not match:
    raise ClusterError(
        f"{where}: {address!r} is not host:port; expected e.g. 10.0.0.1:2222 "
        "or ps-0.example:2222")
  port = int(match.group(2))
  if not 1 <= port <= 65535:
    raise ClusterError(
        f"{where}: port {port} in {address!r} is out of range; "
        "accepted ports are 1-65535")


def machine_of(address: str) -> str:
  """The machine a host:port names: the loopback names (localhost,
  127.0.0.1, [::1], ...) are one, and host names ignore case."""
  host = address.rpartition(":")[0]
  return "loopback" if _LOOPBACK.fullmatch(host) else host.lower()


def check_unique(where: str, addresses: Sequence[str]) -> None:
  """Two tasks on one host:port cannot both listen. A TF server listens on
  every interface, so one machine's names for itself are one host."""
  seen = {}
  for address in addresses:
    key = (machine_of(address), address.rpartition(":")[2])
    if key in seen:
      first = seen[key]
      same = ("appears twice" if first == address else
              f"and {first} are the same host:port")
      raise ClusterError(f"{where}: {address} {same}; every task needs its "
                         "own host:port")
    seen[key] = address


def free_ports(count: int) -> List[int]:
  """`count` distinct TCP ports free right now, for servers on this machine.

  All the sockets are held open together, so the kernel cannot hand out one
  port twice. They bind the wildcard address because a TF server listens on
  0.0.0.0:PORT whatever host the cluster names: a port free only on
  127.0.0.1 could still be taken. Free now is not free later: a caller that
  binds them retries with fresh ones if one was taken in between.
  """
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind(("", 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()
