"""The TCP ports a scenario will bind, checked before anything starts.

`hil run` starts the Modbus and OPC UA servers (real time) and binds the bus's tcp
endpoints (transport = "tcp" or explicit tcp:// endpoints). A port already held by another
process used to surface as a server that died without naming the port; `check_ports` tries
every bind first and names host:port, the scenario key and, where /proc lets us see it, the
process holding it (pid and command line), so `hil run` can exit at once with nothing started.

Finding the holder (Linux): the listening socket's inode from /proc/net/tcp and tcp6, then
the process whose /proc/<pid>/fd has `socket:[inode]`. Another user's processes are not
readable without privileges: then the owner's uid is named instead.
"""

from __future__ import annotations

import errno
import os
import pwd
import socket
from dataclasses import dataclass

from hil.errors import ConfigError

# Which process binds which bus endpoint (hil/bus/config.py): the loop binds the observation
# and action endpoints; the safety process (started by `hil run` when [policy].launch) the rest.
LOOP_BUS_ENDPOINTS = ("obs_policy", "obs_safety", "action")
SAFETY_BUS_ENDPOINTS = ("proposal", "command", "advice", "control")
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


@dataclass(frozen=True)
class Binding:
    """One TCP port a run will listen on."""

    key: str  # scenario key path that sets it, e.g. "modbus.port"
    what: str  # who listens there, e.g. "Modbus TCP server"
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _tcp_address(addr: str) -> tuple[str, int] | None:
    """('host', port) of a zmq "tcp://host:port" address, else None (ipc, inproc, ...)."""
    if not addr.startswith("tcp://"):
        return None
    hostport = addr[len("tcp://"):]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host.strip("[]")
    return ("0.0.0.0" if host in ("*", "") else host), int(port)


def scenario_bindings(scenario, *, servers: bool = True, bus: bool = True) -> list[Binding]:
    """Every TCP port `hil run` will listen on for this scenario.

    servers: the Modbus/OPC UA servers will start (real time, or forced);
    bus: the bus endpoints will be bound (the loop's always; the safety's when it is launched).
    """
    out: list[Binding] = []
    if servers:
        if scenario.served("modbus") is not None:
            out.append(Binding("modbus.port", "Modbus TCP server", scenario.modbus.host, scenario.modbus.port))
        if scenario.served("opcua") is not None:
            out.append(Binding("opcua.port", "OPC UA server", scenario.opcua.host, scenario.opcua.port))
        if scenario.served("iec104") is not None:
            out.append(Binding("iec104.port", "IEC 60870-5-104 server", scenario.iec104.host, scenario.iec104.port))
    if bus and scenario.bus is not None:
        names = list(LOOP_BUS_ENDPOINTS)
        if scenario.policy is not None and getattr(scenario.policy, "launch", False):
            names += SAFETY_BUS_ENDPOINTS
        section = scenario.bus
        for name in names:
            hp = _tcp_address(section.endpoint(name, scenario.name))
            if hp is None:
                continue
            key = f"bus.endpoints.{name}" if name in section.endpoints else "bus.tcp_base_port"
            out.append(Binding(key, f"bus endpoint {name}", hp[0], hp[1]))
    return out


# ---- who holds a port ----

def _listening_inodes(port: int) -> list[tuple[int, int]]:
    """(inode, uid) of every listening TCP socket on `port` (any address), from /proc/net."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port:
                found.append((int(fields[9]), int(fields[7])))
    return found


def _pids_with_socket(inodes: set[int]) -> list[int]:
    """Processes (visible to us) that have one of these socket inodes open."""
    targets = {f"socket:[{i}]" for i in inodes}
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") in targets:
                    pids.append(int(entry))
                    break
            except OSError:
                continue
    return pids


def _cmdline(pid: int, limit: int = 120) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = " ".join(f.read().replace(b"\0", b" ").decode(errors="replace").split())
    except OSError:
        return "?"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def port_holders(port: int) -> list[dict]:
    """Who listens on TCP `port`: [{"pid", "cmdline", "uid", "user"}], pid None if not visible."""
    socks = _listening_inodes(port)
    if not socks:
        return []
    pids = _pids_with_socket({inode for inode, _ in socks})
    if pids:
        return [{"pid": p, "cmdline": _cmdline(p)} for p in sorted(pids)]
    holders = []
    for uid in sorted({uid for _, uid in socks}):
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        holders.append({"pid": None, "cmdline": None, "uid": uid, "user": user})
    return holders


def describe_holders(port: int) -> str:
    holders = port_holders(port)
    if not holders:
        return "by a process this user cannot see (or a socket closing)"
    parts = []
    for h in holders:
        if h["pid"] is not None:
            parts.append(f"pid {h['pid']} ({h['cmdline']})")
        else:
            parts.append(f"a process of user {h['user']} (uid {h['uid']}; its pid is not visible to this user)")
    return "by " + ", ".join(parts)


# ---- the check ----

def try_bind(host: str, port: int) -> OSError | None:
    """Bind (no listen) host:port as a server would (SO_REUSEADDR); the error, or None if free."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return OSError(errno.EADDRNOTAVAIL, f"cannot resolve {host!r}: {exc.strerror}")
    last: OSError | None = None
    bound = False
    for family, stype, proto, _, sockaddr in infos:  # every address the name resolves to
        with socket.socket(family, stype, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(sockaddr)
                bound = True
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return exc
                last = exc
    return None if bound else last


def _overlap(a: str, b: str) -> bool:
    wild = ("0.0.0.0", "::", "")
    return a == b or a in wild or b in wild


def port_problems(bindings: list[Binding]) -> list[tuple[str, str]]:
    """(key path, reason) for every binding that cannot be made, and for ports used twice."""
    problems: list[tuple[str, str]] = []
    seen: list[Binding] = []
    for b in bindings:
        other = next((o for o in seen if o.port == b.port and _overlap(o.host, b.host)), None)
        if other is not None:
            problems.append((b.key, f"{b.address} ({b.what}) is also {other.key} ({other.what}); "
                                    "each needs its own port"))
            continue
        seen.append(b)
        exc = try_bind(b.host, b.port)
        if exc is None:
            continue
        if exc.errno == errno.EADDRINUSE:
            reason = (f"{b.address} ({b.what}) is already in use {describe_holders(b.port)}; "
                      f"stop it or choose another port (--set {b.key}=N)")
        elif exc.errno == errno.EACCES:
            reason = f"{b.address} ({b.what}): permission denied (ports below 1024 need privileges)"
        elif exc.errno == errno.EADDRNOTAVAIL:
            reason = f"{b.address} ({b.what}): {b.host!r} is not an address of this machine"
        else:
            reason = f"{b.address} ({b.what}): cannot bind ({exc.strerror or exc})"
        problems.append((b.key, reason))
    return problems


def check_ports(scenario, *, servers: bool = True, bus: bool = True, source: str | None = None) -> list[Binding]:
    """Raise ConfigError naming every port the run could not bind; return the bindings if all are free."""
    bindings = scenario_bindings(scenario, servers=servers, bus=bus)
    problems = port_problems(bindings)
    if problems:
        raise ConfigError("", problems=problems, source=source)
    return bindings


# ---- free ports chosen at run time (campaign runs, the link proxy, benchmarks) ----

MAX_PORT_ATTEMPTS = 5  # fresh ports tried before giving up (a busy loopback, not a config error)


def bind_free(host: str = "127.0.0.1") -> socket.socket:
    """A TCP socket bound to a port the OS chose, held from here on (nobody else can take it):
    the caller listens on it, or hands the socket to the process that will (a spawned
    multiprocessing child receives a duplicate). Its port: `sock.getsockname()[1]`."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now, released again: for a listener in another program that binds by
    number (hil run's servers). Another process may take it before that bind, so the caller
    checks the bind at start and retries with a fresh port (`with_free_ports`); a listener of
    our own takes `bind_free` instead."""
    with bind_free(host) as sock:
        return sock.getsockname()[1]


def with_free_ports(attempt, n: int, host: str = "127.0.0.1", attempts: int = MAX_PORT_ATTEMPTS):
    """attempt(ports) with n fresh free ports, again with fresh ones while it raises OSError
    EADDRINUSE or a ConfigError from check_ports (a port taken between the choice and the
    bind); its result. The last failure propagates."""
    for i in range(attempts):
        held = [bind_free(host) for _ in range(n)]  # held together: n distinct ports
        ports = [s.getsockname()[1] for s in held]
        for s in held:
            s.close()
        try:
            return attempt(ports)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or i == attempts - 1:
                raise
        except ConfigError as exc:
            if "already in use" not in str(exc) or i == attempts - 1:
                raise
    raise AssertionError("unreachable")
