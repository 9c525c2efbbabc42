"""A loopback TCP proxy process that injects link faults between a client (the SoftPLC, a PLC)
and a server (hil's Modbus or OPC UA server), as toxiproxy would: the client's own timeouts,
reconnects and comm-loss handling are what gets exercised.

    proxy = LinkProxy(bind_free(), target_host, target_port, seed)   # starts the process (hil/scenario/ports.py)
    proxy.set("delay", delay_s=0.2, jitter_s=0.05)                    # from any thread
    proxy.set("pass")
    counters = proxy.stop()

Modes (each applies to both directions, per chunk read from a socket; a Modbus TCP request or
response is one chunk in practice):
    pass        forward as is
    drop        every open connection is reset (SO_LINGER 0 -> RST) and new ones are accepted
                and reset at once, while the mode lasts
    delay       each chunk is held delay_s + U(-jitter_s, +jitter_s) (at least 0) and released in
                order (no overtaking within a direction)
    loss        each chunk is dropped with `probability` (seeded): a lost request or answer,
                so the client sees a timeout (the stream is not repaired, as a dropped PDU)
    half_open   nothing is forwarded any more and nothing is closed: the client's requests
                vanish and no FIN or RST tells it so (a peer that lost power). When the mode
                ends, those connections are reset (the peer came back and knows nothing of them)
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import socket
import struct
import time


def _reset(writer) -> None:
    try:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
    except Exception:  # noqa: BLE001
        pass


class _Proxy:
    def __init__(self, listen_port: int, host: str, port: int, seed: int):
        self.listen_port, self.host, self.port = listen_port, host, port
        self.mode, self.args = "pass", {}
        self.rng = random.Random(seed)
        self.conns: set = set()  # (client writer, server writer)
        self.stale: set = set()  # connections caught in a half-open window
        self.c = {"connections": 0, "refused": 0, "chunks": 0, "bytes": 0, "dropped": 0, "delayed": 0, "resets": 0}

    def set_mode(self, mode: str, args: dict) -> None:
        old = self.mode
        self.mode, self.args = mode, dict(args)
        if mode == "drop":
            for cw, sw in list(self.conns):
                _reset(cw)
                _reset(sw)
                self.c["resets"] += 1
            self.conns.clear()
        if mode == "half_open":
            self.stale |= self.conns
        if old == "half_open" and mode != "half_open":
            for cw, sw in list(self.stale):
                _reset(cw)
                _reset(sw)
                self.c["resets"] += 1
            self.conns -= self.stale
            self.stale.clear()

    async def handle(self, cr, cw) -> None:
        if self.mode in ("drop",):
            self.c["refused"] += 1
            _reset(cw)
            return
        try:
            sr, sw = await asyncio.open_connection(self.host, self.port)
        except OSError:
            self.c["refused"] += 1
            _reset(cw)
            return
        self.c["connections"] += 1
        pair = (cw, sw)
        self.conns.add(pair)
        if self.mode == "half_open":
            self.stale.add(pair)
        await asyncio.gather(self.pump(cr, sw, pair), self.pump(sr, cw, pair), return_exceptions=True)
        self.conns.discard(pair)
        self.stale.discard(pair)
        for w in (cw, sw):
            try:
                w.close()
            except Exception:  # noqa: BLE001
                pass

    async def pump(self, reader, writer, pair) -> None:
        release = 0.0  # monotonic time the last delayed chunk is released at (order kept)
        while True:
            data = await reader.read(65536)
            if not data:
                try:
                    writer.write_eof()
                except Exception:  # noqa: BLE001
                    pass
                return
            self.c["chunks"] += 1
            self.c["bytes"] += len(data)
            mode, a = self.mode, self.args
            if mode == "half_open" or pair in self.stale:
                self.c["dropped"] += 1
                continue
            if mode == "loss" and self.rng.random() < float(a.get("probability", 0.0)):
                self.c["dropped"] += 1
                continue
            if mode == "delay":
                d = float(a.get("delay_s", 0.0)) + self.rng.uniform(-1, 1) * float(a.get("jitter_s", 0.0))
                release = max(release, time.monotonic() + max(0.0, d))
                self.c["delayed"] += 1
                wait = release - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()


def _main(listen: socket.socket, host: str, port: int, seed: int, conn, ready) -> None:
    async def run() -> None:
        proxy = _Proxy(listen.getsockname()[1], host, port, seed)
        listen.setblocking(False)
        server = await asyncio.start_server(proxy.handle, sock=listen)
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def on_command() -> None:
            try:
                msg = conn.recv()
            except EOFError:
                msg = ("stop", {})
            if msg[0] == "stop":
                if not done.done():
                    done.set_result(None)
            else:
                proxy.set_mode(msg[0], msg[1])
                conn.send(("ok", msg[0]))

        loop.add_reader(conn.fileno(), on_command)
        ready.set()
        await done
        server.close()
        for cw, sw in list(proxy.conns):
            cw.close()
            sw.close()
        conn.send(("counters", proxy.c))

    asyncio.run(run())


class LinkProxy:
    """The proxy process and its control pipe."""

    def __init__(self, listen: socket.socket, host: str, port: int, seed: int = 0, timeout_s: float | None = None):
        """listen: a bound TCP socket (hil/scenario/ports.py bind_free), held from its choice to the
        proxy's listen: no other process can take the port in between. Closed here once
        the child holds its duplicate. timeout_s: None waits by handshake (hil/readiness.py)."""
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        ready = ctx.Event()
        listen_port = listen.getsockname()[1]
        self.proc = ctx.Process(target=_main, args=(listen, host, port, seed, child, ready), name="hil-proxy",
                                daemon=True)
        try:
            self.proc.start()
        finally:
            listen.close()
        self.listen_port = listen_port
        from hil import readiness  # by handshake: as long as it lives and makes progress

        why = readiness.wait_ready(ready.is_set, [self.proc.pid], self.proc.is_alive, wait=ready.wait, poll_s=0.1,
                                   max_s=readiness.MAX_S if timeout_s is None else timeout_s)
        if why is not None:
            self.proc.kill()
            self.proc.join(5.0)
            raise RuntimeError(f"link proxy on 127.0.0.1:{listen_port} did not start: {why}")
        self.log: list[tuple[float, str]] = []

    def set(self, mode: str, **args) -> None:
        if mode not in ("pass", "drop", "delay", "loss", "half_open"):
            raise ValueError(f"link mode {mode!r}")
        self.conn.send((mode, args))
        if self.conn.poll(5.0):
            self.conn.recv()
        self.log.append((time.monotonic(), mode))

    def stop(self) -> dict:
        counters: dict = {}
        try:
            self.conn.send(("stop", {}))
            if self.conn.poll(5.0):
                tag, counters = self.conn.recv()
        except (OSError, EOFError):
            pass
        self.proc.join(5.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2.0)
        return counters
