"""Connection limits of the OPC UA server: at most N connections, idle ones closed, counted.

asyncua 2.1 refuses connections beyond `InternalServer.max_connections` but does not count
them, and closes a silent connection only before ActivateSession. `LimitedServer` (an
asyncua `Server` whose listener makes `LimitedProtocol`s) adds what hil needs:

- `[opcua] max_connections`: one more TCP connection is closed as soon as it is accepted,
  counted (`refused_connections`) and logged (rate limited);
- `[opcua] idle_timeout_s`: a connection from which nothing arrived for that long is closed
  and counted (`idle_closed`). OPC UA clients are never silent for long while they use a
  session: subscribers send Publish requests, and the revised session timeout, which this
  also caps, obliges every client to call within it. 0 turns the sweep off.

Counters: `ConnectionLimits.as_dict()` -> connections (accepted), refused_connections,
idle_closed, open.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from asyncua import Server
from asyncua.crypto import uacrypto
from asyncua.server.binary_server_asyncio import BinaryServer, OPCUAProtocol

from adapters.ratelog import RateLimitedLog

log = logging.getLogger("hil.opcua")
IDLE_SWEEP_MAX_S = 1.0  # idle connections are looked for at least this often (s)


class ConnectionLimits:
    """Limits (max_connections, idle_timeout_s in s) and what they did."""

    def __init__(self, max_connections: int, idle_timeout_s: float):
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.connections = 0
        self.refused = 0
        self.idle_closed = 0
        self.rlog = RateLimitedLog(log)
        self.clients: list = []  # the listener's open connections (asyncua's list)

    def apply_to(self, iserver) -> None:
        """Make asyncua's own limits agree: connection count and the longest session timeout
        (asyncua's own wait for ActivateSession, 30 s, stays: it closes connections that talk
        but never activate a session)."""
        iserver.max_connections = self.max_connections
        t = self.idle_timeout_s
        if t > 0:
            iserver.max_session_timeout_ms = 1000.0 * t
            iserver.min_session_timeout_ms = min(iserver.min_session_timeout_ms, 1000.0 * t)

    def as_dict(self) -> dict:
        return {"connections": self.connections, "refused_connections": self.refused,
                "idle_closed": self.idle_closed, "open": len(self.clients)}

    async def sweep_idle(self) -> None:
        """Close connections silent for idle_timeout_s (runs until cancelled)."""
        timeout = self.idle_timeout_s
        if timeout <= 0:
            return
        while True:
            await asyncio.sleep(min(IDLE_SWEEP_MAX_S, timeout / 4))
            now = time.monotonic()
            for proto in list(self.clients):
                idle = now - getattr(proto, "last_rx_s", now)
                if idle >= timeout and proto.transport is not None and not proto.transport.is_closing():
                    self.idle_closed += 1
                    self.rlog.info("idle", "OPC UA: closed %s after %.1f s without a request ([opcua] "
                                   "idle_timeout_s = %g)", _peer(proto.peer_name), idle, timeout)
                    proto.transport.close()


def _peer(name) -> str:
    if isinstance(name, tuple) and len(name) >= 2:
        return f"{name[0]}:{name[1]}"
    return str(name)


class LimitedProtocol(OPCUAProtocol):
    """asyncua's per-connection protocol, refusing beyond the limit and time-stamping data."""

    hil_limits: ConnectionLimits

    def connection_made(self, transport) -> None:
        lim = self.hil_limits
        self.last_rx_s = time.monotonic()
        if len(self.clients) >= lim.max_connections:
            lim.refused += 1
            lim.rlog.warning("refused", "OPC UA: refused a connection from %s: %d connections open "
                             "([opcua] max_connections = %d)", _peer(transport.get_extra_info("peername")),
                             len(self.clients), lim.max_connections)
            transport.close()
            return
        super().connection_made(transport)
        lim.connections += 1

    def data_received(self, data: bytes) -> None:
        self.last_rx_s = time.monotonic()
        super().data_received(data)


class LimitedBinaryServer(BinaryServer):
    hil_limits: ConnectionLimits

    def _make_protocol(self) -> OPCUAProtocol:
        proto = LimitedProtocol(iserver=self.iserver, policies=self._policies, clients=self.clients,
                                closing_tasks=self.closing_tasks, limits=self.limits)
        proto.hil_limits = self.hil_limits
        return proto


class LimitedServer(Server):
    """asyncua Server listening through `LimitedBinaryServer`; set `hil_limits` before start().

    `start` is asyncua 2.1's `Server.start` with the listener class replaced (asyncua has no
    hook for the protocol factory).
    """

    hil_limits: ConnectionLimits

    async def start(self) -> None:
        if self.iserver.certificate is not None:
            uacrypto.check_certificate(self.iserver.certificate, self._application_uri, socket.gethostname())
        await self._setup_server_nodes()
        await self.iserver.start()
        try:
            host, port = self._get_bind_socket_info()
            self.bserver = LimitedBinaryServer(self.iserver, host, port, self.limits)
            self.bserver.hil_limits = self.hil_limits
            self.hil_limits.clients = self.bserver.clients
            self.bserver.set_policies(self._policies)
            await self.bserver.start()
        except Exception:
            await self.iserver.stop()
            raise
