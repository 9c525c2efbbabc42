"""The `unix` bus transport: one Unix datagram socket per receiving endpoint, no broker threads.

Why: a ZeroMQ ipc/tcp message wakes three threads per hop (the sender's I/O thread, the
receiver's I/O thread, then the receiving thread). A Unix datagram `sendto` puts the message in
the receiver's queue and wakes the receiving thread directly: one wake-up per hop, three on the
loop -> policy -> safety -> loop path instead of nine. On a loaded machine each wake-up is a
scheduling delay, so this is where the round trip's tail goes.

    unix://<run dir>/<endpoint>   the receiver binds the path (unlinking a stale one); senders
                                  `sendto` it (a restarted receiver is found again at once)

`DgramSocket` offers the part of the zmq socket API the bus uses (send/recv with zmq.NOBLOCK
raising zmq.Again, RCVTIMEO, poll, fileno, close), so LoopBusEndpoint, the policy runner and
the safety process run unchanged over either transport; `Poller` polls both kinds. Messages
keep their msgpack body and tag (hil/bus_auth.py). Limits: the kernel queue of a datagram
socket holds net.unix.max_dgram_qlen messages (often 10): a full queue makes a non-blocking send
fail (counted as unsent, as a zmq high-water mark would); a message longer than
MAX_DGRAM_BYTES is cut and then fails its tag check. Only on this host; the run directory's
mode (0700) keeps other users out, the tag keeps out everyone without the run's secret.
"""

from __future__ import annotations

import os
import select
import socket

import zmq

MAX_DGRAM_BYTES = 1 << 16  # a bus message is a few hundred bytes; an ensemble proposal a few kB
SCHEME = "unix://"


class DgramSocket:
    """One end of a unix:// bus endpoint: the receiver (bound) or a sender."""

    def __init__(self, path: str, receiver: bool):
        from hil.bus_auth import ensure_private_dir

        self.path = os.path.abspath(path)
        self.receiver = receiver
        self._timeout_ms = -1
        self._s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._ino = None
        if receiver:
            ensure_private_dir(os.path.dirname(self.path))
            try:
                os.unlink(self.path)  # a previous life's socket file
            except FileNotFoundError:
                pass
            self._s.bind(self.path)
            self._ino = os.stat(self.path).st_ino
            self._buf = bytearray(MAX_DGRAM_BYTES)
            self._view = memoryview(self._buf)
        self._fd = self._s.fileno()
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)

    def fileno(self) -> int:
        return self._fd

    def send(self, data: bytes, flags: int = 0) -> None:
        """Send one message; with zmq.NOBLOCK raise zmq.Again if the receiver is not there (yet)
        or its queue is full."""
        try:
            self._s.sendto(data, socket.MSG_DONTWAIT if flags & zmq.NOBLOCK else 0, self.path)
        except (BlockingIOError, FileNotFoundError, ConnectionRefusedError):
            raise zmq.Again() from None

    def recv(self, flags: int = 0) -> bytes:
        """The next message; zmq.Again if none (zmq.NOBLOCK) or none within RCVTIMEO."""
        if not flags & zmq.NOBLOCK and self._timeout_ms >= 0 and not self.poll(self._timeout_ms):
            raise zmq.Again()
        try:
            n = self._s.recv_into(self._buf, 0, socket.MSG_DONTWAIT | socket.MSG_TRUNC
                                  if flags & zmq.NOBLOCK or self._timeout_ms >= 0 else socket.MSG_TRUNC)
        except BlockingIOError:
            raise zmq.Again() from None
        if n > MAX_DGRAM_BYTES:
            return b""  # cut: fails the tag check, counted by the receiver
        return bytes(self._view[:n])

    def poll(self, timeout: int | None = None, flags: int = zmq.POLLIN) -> int:
        """zmq.POLLIN if a message waits (within timeout ms; None = forever), else 0."""
        return zmq.POLLIN if self._poll.poll(timeout) else 0

    def setsockopt(self, option: int, value) -> None:
        if option == zmq.RCVTIMEO:
            self._timeout_ms = int(value)

    def close(self, linger=None) -> None:
        if self._s.fileno() < 0:
            return
        self._s.close()
        if self.receiver:
            try:
                if os.stat(self.path).st_ino == self._ino:  # not a newer process's socket
                    os.unlink(self.path)
            except FileNotFoundError:
                pass


class Poller:
    """zmq.Poller over zmq sockets and DgramSockets; poll() returns the registered objects."""

    def __init__(self):
        self._p = zmq.Poller()
        self._by_fd: dict[int, object] = {}

    def register(self, sock, flags: int = zmq.POLLIN) -> None:
        if isinstance(sock, DgramSocket):
            self._by_fd[sock.fileno()] = sock
        self._p.register(sock, flags)

    def poll(self, timeout=None) -> list:
        return [(self._by_fd.get(s, s) if type(s) is int else s, ev) for s, ev in self._p.poll(timeout)]
