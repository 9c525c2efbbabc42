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


def wait_for(ready, proc, what: str, poll_s: float = 0.2) -> None:
    """Readiness by handshake for a process a test started (`hil run`, a client): `ready()` polled
    while `proc` (a Popen) lives and it or its descendants make progress (hil/readiness.py). Slow
    on a loaded machine is no failure; dead or stuck is: AssertionError naming why (and the
    process's stderr tail if it died and its stderr is a pipe)."""
    from hil import readiness

    why = readiness.wait_ready(ready, [proc.pid], lambda: proc.poll() is None, poll_s=poll_s, tree=True)
    if why is None:
        return
    err = ""
    if proc.poll() is not None and proc.stderr is not None:
        data = proc.stderr.read()
        err = (data.decode(errors="replace") if isinstance(data, bytes) else data)[-3000:]
    raise AssertionError(f"{what}: {why}\n{err}")
