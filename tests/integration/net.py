"""Loopback helpers shared by the integration tests: a port free now, a port that listens."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, timeout_s: float = 0.5) -> bool:
    """True if something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket() as s:
        s.settimeout(timeout_s)
        return s.connect_ex(("127.0.0.1", port)) == 0
