"""Hosts for multi-process tests: Linux network namespaces on a private switch.

`Network` builds, with `ip` (root only), one namespace that holds nothing but a Linux bridge (the
switch) and one namespace per host, each joined to the bridge by a veth pair (`eth0` in the host,
named after the host on the switch side), with its own IPv4 address in a private /24 and loopback
up. Every host thus has its own address, its own ports and its own link that a test can cut.
Nothing is added to the machine's own namespace: the veth pairs are created inside the switch's
namespace with their peer moved straight into the host's, and deleting the namespaces removes them.
(The first `ip netns add` on a machine makes /run/netns a shared bind mount, as iproute2 always
does; that mount stays, empty.)

Typical use::

    reason = netns.unavailable_reason()
    if reason:
      self.skipTest(reason)
    net = netns.Network(["ps0", "worker0", "worker1"])
    self.addCleanup(net.destroy)  # Before the processes' cleanups: those run first.
    net.create()
    proc = testutil.start(net.exec_args("ps0", [testutil.PYTHON, ...]), log_path)
    net.link_down("worker1"); ...; net.link_up("worker1")

Every `ip` call is bounded; a failing one raises NetnsError with the command and its stderr.
"""

import ipaddress
import os
import re
import shutil
import subprocess
import time
from typing import Dict, List, Optional, Sequence

IP_TIMEOUT_SECS = 20
# Private subnets tried in order: 10.213.<n>.0/24; the first that nothing on this machine (its
# addresses and routes) overlaps is used. The namespaces have their own routing tables, so a clash
# could not break anything; avoiding one keeps `ip` listings unambiguous.
SUBNET_FORMAT = "10.213.{}.0/24"
SUBNET_CANDIDATES = (47, 83, 121, 167, 211, 29)
# Namespace names: "pst-<pid>-<n>-<role>", where pid is the test process; a leftover of a test
# process that no longer runs (killed with SIGKILL), with no process inside, is deleted by the next
# Network.create().
_PREFIX = "pst-"
_NAME_RE = re.compile(r"^pst-(\d+)-")
HOST_DEV = "eth0"
BRIDGE_DEV = "br0"

_counter = 0


# iproute2's `ip`, also where a minimal PATH (Bazel's strict action env) leaves out sbin.
IP = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin") or "ip"


class NetnsError(RuntimeError):
  """An `ip` command failed; the message names the command and what it printed."""


def ip(*args: str, check: bool = True, timeout: float = IP_TIMEOUT_SECS) -> str:
  """Runs `ip args...`, returns its stdout; raises NetnsError if it fails (when check)."""
  cmd = [IP, *args]
  try:
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, check=False)
  except subprocess.TimeoutExpired:
    raise NetnsError(f"`{' '.join(cmd)}` still running after {timeout:.0f} s") from None
  if check and done.returncode != 0:
    raise NetnsError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): "
                     f"{(done.stderr or done.stdout).strip()}")
  return done.stdout


def list_namespaces() -> List[str]:
  """Names of the named network namespaces (`ip netns list`, ids stripped)."""
  return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def unavailable_reason() -> Optional[str]:
  """Why namespaces cannot be made here (a skip reason), or None if they can.

  Tries the real thing: adds and deletes a namespace, and a bridge inside it.
  """
  if os.geteuid() != 0:
    return "network namespaces need root (run the test as root)"
  if shutil.which(IP) is None:
    return "no `ip` command (install iproute2)"
  name = f"{_PREFIX}{os.getpid()}-probe"
  try:
    ip("netns", "add", name)
  except NetnsError as e:
    return f"cannot create a network namespace: {e}"
  try:
    ip("-n", name, "link", "add", BRIDGE_DEV, "type", "bridge")
    ip("-n", name, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
  except NetnsError as e:
    return f"cannot create a bridge or veth pair in a network namespace: {e}"
  finally:
    ip("netns", "delete", name, check=False)
  return None


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def remove_stale_namespaces() -> List[str]:
  """Deletes "pst-<pid>-..." namespaces whose test process is gone and in which no process runs
  (a test killed with SIGKILL leaves them); returns their names."""
  removed = []
  for name in list_namespaces():
    match = _NAME_RE.match(name)
    if (match and not _pid_alive(int(match.group(1)))
        and not ip("netns", "pids", name, check=False).split()):
      ip("netns", "delete", name, check=False)
      removed.append(name)
  return removed


def _used_networks() -> List[ipaddress.IPv4Network]:
  """IPv4 networks of this namespace's addresses and routes."""
  nets = []
  for text in (ip("-4", "-o", "addr", "show"), ip("-4", "route", "show", "table", "all")):
    for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", text):
      try:
        nets.append(ipaddress.ip_network(token, strict=False))
      except ValueError:
        pass
  return nets


def pick_subnet() -> ipaddress.IPv4Network:
  """The first of SUBNET_CANDIDATES that no address or route of this machine overlaps."""
  used = _used_networks()
  for n in SUBNET_CANDIDATES:
    subnet = ipaddress.ip_network(SUBNET_FORMAT.format(n))
    # A default route (0.0.0.0/0) overlaps everything and means nothing here.
    if not any(u.prefixlen > 0 and u.overlaps(subnet) for u in used):
      return subnet
  raise NetnsError(f"every candidate subnet {SUBNET_FORMAT} for n in {SUBNET_CANDIDATES} is in "
                   "use on this machine")


class Network:
  """A switch namespace and one namespace per host, each host on the switch by a veth pair.

  Args:
    hosts: host names, short and distinct ([a-z0-9], up to 12 characters); host i gets the
      address .(i+1) of the subnet.
    subnet: an IPv4 /24 (or larger); default: pick_subnet().
  """

  def __init__(self, hosts: Sequence[str], subnet: Optional[str] = None):
    global _counter
    _counter += 1
    for host in hosts:
      if not re.fullmatch(r"[a-z0-9]{1,12}", host):
        raise ValueError(f"host name {host!r}: use 1-12 characters of [a-z0-9]")
    if len(set(hosts)) != len(hosts):
      raise ValueError(f"host names repeat: {list(hosts)}")
    self.hosts = list(hosts)
    self._subnet_arg = subnet
    self.subnet: Optional[ipaddress.IPv4Network] = None
    base = f"{_PREFIX}{os.getpid()}-{_counter}"
    self.switch_ns = f"{base}-sw"
    self.namespaces: Dict[str, str] = {h: f"{base}-{h}" for h in self.hosts}
    self._created: List[str] = []  # Namespaces made so far, for destroy().

  # --- set-up and tear-down ------------------------------------------------------------------

  def create(self) -> "Network":
    """Builds the switch and the hosts; on failure removes what it made and raises NetnsError."""
    remove_stale_namespaces()
    self.subnet = ipaddress.ip_network(self._subnet_arg) if self._subnet_arg else pick_subnet()
    try:
      self._add_namespace(self.switch_ns)
      ip("-n", self.switch_ns, "link", "add", BRIDGE_DEV, "type", "bridge")
      ip("-n", self.switch_ns, "link", "set", BRIDGE_DEV, "up")
      ip("-n", self.switch_ns, "link", "set", "lo", "up")
      for host in self.hosts:
        ns = self.namespaces[host]
        self._add_namespace(ns)
        ip("-n", ns, "link", "set", "lo", "up")
        # Made in the switch's namespace, its peer moved straight into the host's: the root
        # namespace never holds either end.
        ip("-n", self.switch_ns, "link", "add", host, "type", "veth",
           "peer", "name", HOST_DEV, "netns", ns)
        ip("-n", self.switch_ns, "link", "set", host, "master", BRIDGE_DEV)
        ip("-n", self.switch_ns, "link", "set", host, "up")
        ip("-n", ns, "addr", "add", f"{self.address(host)}/{self.subnet.prefixlen}",
           "dev", HOST_DEV)
        ip("-n", ns, "link", "set", HOST_DEV, "up")
    except BaseException:
      self.destroy(check=False)
      raise
    return self

  def _add_namespace(self, name: str) -> None:
    ip("netns", "add", name)
    self._created.append(name)

  def destroy(self, check: bool = True) -> None:
    """Deletes every namespace this Network made (and with them the veths and the bridge).

    Safe to call twice. Processes still inside a namespace keep it alive after its name is gone,
    so end them first. Raises NetnsError (when check) if a namespace is still listed after.
    """
    for name in reversed(self._created):
      ip("netns", "delete", name, check=False)
    left = [n for n in self._created if n in list_namespaces()]
    self._created = left
    if check and left:
      raise NetnsError(f"network namespaces still there after `ip netns delete`: {left}")

  # --- use -----------------------------------------------------------------------------------

  def address(self, host: str) -> str:
    """The IPv4 address of host (without prefix length)."""
    if self.subnet is None:
      raise NetnsError("call create() first: the subnet is picked then")
    return str(self.subnet.network_address + self.hosts.index(host) + 1)

  def exec_args(self, host: str, argv: Sequence[str]) -> List[str]:
    """argv run inside host's namespace (`ip netns exec` execs it: same pid, same group)."""
    return [IP, "netns", "exec", self.namespaces[host], *[str(a) for a in argv]]

  def link_down(self, host: str) -> None:
    """Takes host's interface down: its peer loses carrier and IPv4 drops the subnet route."""
    ip("-n", self.namespaces[host], "link", "set", HOST_DEV, "down")

  def link_up(self, host: str, timeout: float = 10.0) -> None:
    """Brings host's interface back, re-adding its address and route if they went, and waits
    (bounded) until the link carries traffic again (LOWER_UP)."""
    ns, cidr = self.namespaces[host], f"{self.address(host)}/{self.subnet.prefixlen}"
    ip("-n", ns, "link", "set", HOST_DEV, "up")
    if self.address(host) not in ip("-n", ns, "-4", "addr", "show", "dev", HOST_DEV):
      ip("-n", ns, "addr", "add", cidr, "dev", HOST_DEV)
    if str(self.subnet) not in ip("-n", ns, "-4", "route", "show", "dev", HOST_DEV):
      ip("-n", ns, "route", "add", str(self.subnet), "dev", HOST_DEV, "src", self.address(host))
    deadline = time.monotonic() + timeout
    while "LOWER_UP" not in self.link_state(host):
      if time.monotonic() >= deadline:
        raise NetnsError(f"{host}'s {HOST_DEV} not up {timeout:.0f} s after `link set up`: "
                         f"{self.link_state(host)}")
      time.sleep(0.1)

  def link_state(self, host: str) -> str:
    """host's interface line of `ip -o link`, e.g. "... <BROADCAST,...,UP,LOWER_UP> ..."."""
    return ip("-n", self.namespaces[host], "-o", "link", "show", "dev", HOST_DEV).strip()

  def describe(self) -> str:
    """One line per namespace: addresses and routes, for failure messages."""
    lines = []
    for host, ns in self.namespaces.items():
      addr = " ".join(ip("-n", ns, "-br", "-4", "addr", "show", "dev", HOST_DEV,
                         check=False).split())
      link = " ".join(ip("-n", ns, "-br", "link", "show", "dev", HOST_DEV, check=False).split())
      route = ip("-n", ns, "-4", "route", "show", check=False).strip().replace("\n", "; ")
      lines.append(f"{host} ({ns}): {link} | {addr} | routes: {route or '(none)'}")
    return "\n".join(lines)
