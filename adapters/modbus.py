"""Modbus TCP server over the process image (pymodbus 3.16, pinned to 3.16.x).

Run it in its own process (the loop must not share a GIL with asyncio servers):

    serve_forever(scenario, image_name, ready=None, stop=None, *,
                  request_log_path=None, stats_path=None, summary_path=None)

blocks, attaches to the image by name, listens on [modbus] host:port (default
127.0.0.1:5020), sets `ready` (a multiprocessing.Event) once listening and returns when
`stop` is set or on SIGTERM/SIGINT, after writing the request log (format: see
adapters/modbus_log.py) and the per-client counters (JSON) if paths were given (here or
as [modbus] request_log / client_stats), and logging the counters. In-process (tests,
benchmarks): `await serve(scenario, image, stop=asyncio.Event(), on_started=cb)`; the
server object handed to `cb` has `.stats.as_dict()` and `.request_log`.

How it hooks into pymodbus, and why. pymodbus 3.16 routes every request through
`pdu.datastore_update(context, device_id)`, which calls the context's async
`getValues`/`setValues`. Its own contexts are a register memory (SimDevice/SimData, or the
deprecated ModbusServerContext): they would hold a second copy of the image, the
SimDevice action hook sees register counts rather than bit counts for coil reads, and the
context never learns which client asked. So we keep pymodbus for what it is good at
(framing, PDU decoding and encoding) and own the dispatch: our connection handler
(`_Handler`, a `ServerRequestHandler` subclass returned by `callback_new_connection`)
decodes every complete frame of a segment, runs each PDU's `datastore_update` against
our `ImageDatastore` (adapters/modbus_datastore.py: reads from the image on every
request, all-or-nothing writes with bound checks), answers, counts exceptions for that
peer and time-stamps the request. It never clears the receive buffer on send (pymodbus's
default does, which loses a pipelined request's first bytes). The server is constructed
with a placeholder SimDevice only because pymodbus's base class insists on a datastore.

Function codes: 1, 2, 3, 4, 5, 6, 15, 16, 22 (mask write) and 23, on the mapped tables,
and nothing else: every other code (7, 8 and all its sub-functions, 11, 12, 17, 20, 21, 24,
43, ...) answers ILLEGAL FUNCTION (0x01) before pymodbus's own handler runs, so no
pymodbus dummy or diagnostic path is reachable from the wire. Client-triggered events
(unserved codes, undecodable frames, refused or idle connections, a request that failed
inside the server) log rate-limited one-liners (adapters/ratelog.py), never a traceback
per request. Pipelined requests in one TCP segment are all answered, in order. Unit ids
served: the configured one, 0 and 255; others answer GATEWAY TARGET FAILED TO RESPOND
(0x0B), as a TCP gateway would.

Connections: at most `[modbus] max_connections` at once; one more is closed as soon as it
is accepted and counted (`refused_connections`); a connection that sends nothing for
`idle_timeout_s` seconds is closed and counted (`idle_closed`). `max_clients` only bounds
the per-client statistics table.

Final counters (`final_counters(server)`): connections, refused_connections, idle_closed,
requests, reads, writes, exceptions by code ("0x02": n), written as JSON to
`summary_path` at shutdown when given (adapters/process.py hands them to the loop).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import struct
import time
from pathlib import Path

from pymodbus.constants import ExcCodes
from pymodbus.exceptions import ModbusIOException
from pymodbus.pdu import ExceptionResponse
from pymodbus.server import ModbusTcpServer
from pymodbus.server.requesthandler import ServerRequestHandler
from pymodbus.simulator import DataType, SimData, SimDevice
from pymodbus.transaction import TransactionManager

from adapters.modbus_datastore import ImageDatastore
from adapters.modbus_log import ClientStats, RequestLog
from adapters.modbus_requests import check_request
from adapters.ratelog import RateLimitedLog
from hil.atomic import write_json_atomic
from hil.image import ProcessImage
from hil.tagmap.modbus import CompiledMap, compile_map, describe_shared_views

log = logging.getLogger("hil.modbus")
WRITE_FCS = frozenset({5, 6, 15, 16, 22, 23})
# Data access on the image, and nothing else. Every other code (diagnostics 8, identity 43,
# 7, 11, 12, 17, file records 20/21, FIFO 24 ...) would reach pymodbus's own dummy handlers
# (an unknown FC 8 sub-function even raises inside pymodbus): refused with ILLEGAL FUNCTION.
SERVED_FCS = WRITE_FCS | {1, 2, 3, 4}
IDLE_SWEEP_MAX_S = 1.0  # idle connections are looked for at least this often (s)
MAX_CLIENT_LINES = 20  # per-client exception lines logged at shutdown


def _request_span(pdu) -> tuple[int, int]:
    """(first address, count) of a request for the log."""
    if pdu.function_code == 23:
        if getattr(pdu, "write_registers", None):
            return pdu.write_address, len(pdu.write_registers)
        return pdu.read_address, pdu.read_count
    address = getattr(pdu, "address", 0)
    if pdu.function_code in (5, 6):
        return address, 1
    if pdu.function_code in (15, 16):
        return address, len(getattr(pdu, "bits", None) or getattr(pdu, "registers", None) or [])
    return address, getattr(pdu, "count", 0) or 0


class _Handler(ServerRequestHandler):
    """One client connection: decode, dispatch against the image, answer, account."""

    def __init__(self, owner: "ImageModbusServer"):
        super().__init__(owner, owner.trace_packet, owner.trace_pdu, owner.trace_connect)
        self.owner = owner
        self.peer = "?"
        self.refused = False
        self.last_rx_s = time.monotonic()  # last bytes received (idle timeout)
        self._tasks: set = set()  # strong references until each request is answered

    def callback_connected(self) -> None:
        super().callback_connected()
        info = self.transport.get_extra_info("peername") if self.transport else None
        if info:
            self.peer = f"{info[0]}:{info[1]}"
        owner = self.owner
        # the listener lists this connection already (pymodbus adds it before connecting)
        if len(owner.active_connections) > owner.max_connections:
            self.refused = True
            owner.stats.refused()
            owner.rlog.warning("refused", "modbus: refused a connection from %s: %d connections open "
                               "([modbus] max_connections = %d)", self.peer,
                               len(owner.active_connections) - 1, owner.max_connections)
            self.close()  # not counted as a client, never served
            return
        self.last_rx_s = time.monotonic()
        owner.stats.connected(self.peer, time.monotonic_ns())

    def callback_disconnected(self, exc: Exception | None) -> None:
        super().callback_disconnected(exc)
        if not self.refused:
            self.owner.stats.disconnected(self.peer, time.monotonic_ns())

    def close_idle(self, idle_s: float) -> None:
        """Close this connection after `idle_s` seconds without a byte from the client."""
        owner = self.owner
        owner.stats.idle_closed()
        owner.rlog.info("idle", "modbus: closed %s after %.1f s without a request ([modbus] "
                        "idle_timeout_s = %g)", self.peer, idle_s, owner.idle_timeout_s)
        self.close()  # pymodbus then skips callback_disconnected: account here
        owner.stats.disconnected(self.peer, time.monotonic_ns())

    def send(self, data: bytes, addr: tuple | None = None) -> None:
        if self.transport and not self.transport.is_closing():
            self.transport.write(data)

    def callback_data(self, data: bytes, addr: tuple | None = None) -> int:
        if self.refused:
            return len(data)
        self.last_rx_s = time.monotonic()
        used_total = 0
        while used_total < len(data):
            t_ns = time.monotonic_ns()
            refused = self._malformed(data, used_total)
            if refused:
                used_total += refused[0]
                self._spawn(self._refuse(*refused[1:], addr, t_ns))
                continue
            try:
                used = TransactionManager.callback_data(self, data[used_total:], addr)
            except ModbusIOException as exc:  # undecodable: answer with the frame's function code
                frame = data[used_total:]
                fc = exc.fcode if exc.fcode is not None else (frame[7] & 0x7F if len(frame) > 7 else 0)
                response = ExceptionResponse(fc, ExcCodes.ILLEGAL_FUNCTION, device_id=exc.dev_id,
                                             transaction=exc.transaction_id)
                self.pdu_send(response, addr)
                self.owner.rlog.warning("undecodable", "modbus: undecodable request (function code %d) "
                                        "from %s: ILLEGAL FUNCTION", fc & 0x7F, self.peer)
                self.owner.account(self.peer, t_ns, fc & 0x7F, exc.dev_id or 0, 0, 0,
                                   False, int(ExcCodes.ILLEGAL_FUNCTION))
                return len(data)
            used_total += used
            pdu = self.last_pdu
            if pdu is None or used == 0:
                break
            self._spawn(self._handle(pdu, addr, t_ns))
        return used_total

    def _spawn(self, coro) -> None:
        """Answer in a task, kept referenced until done; tasks run (and answer) in order."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _malformed(self, data: bytes, start: int):
        """(frame length, tid, unit, refusal) if the complete request frame at `start` has
        malformed fields (adapters/modbus_requests.py), else None: pymodbus decodes it (an
        incomplete frame, another protocol id, an unserved code or unit id)."""
        if len(data) - start < 8:
            return None
        tid, pid, length, unit, fc = struct.unpack_from(">HHHBB", data, start)
        end = start + 6 + length
        if pid != 0 or length < 2 or end > len(data) or fc not in SERVED_FCS \
                or unit not in self.owner.datastore.unit_ids:
            return None
        refusal = check_request(data[start + 7:end])
        return None if refusal is None else (end - start, tid, unit, fc, refusal)

    async def _refuse(self, tid: int, unit: int, fc: int, refusal, addr, t_ns: int) -> None:
        """Answer a malformed request with its exception code; nothing is read or written."""
        owner = self.owner
        self.pdu_send(ExceptionResponse(fc, refusal.code, device_id=unit, transaction=tid), addr)
        owner.rlog.warning("malformed", "modbus: %s from %s: ILLEGAL DATA VALUE", refusal.reason,
                           self.peer)
        owner.account(self.peer, t_ns, fc, unit, refusal.address, refusal.count, fc in WRITE_FCS,
                      int(refusal.code))

    async def _handle(self, pdu, addr, t_ns: int) -> None:
        owner = self.owner
        ds = owner.datastore
        # The datastore never suspends (its async methods await nothing), so begin() ..
        # last_* below belong to this request even with many connections on the loop.
        ds.begin()
        fc = pdu.function_code
        if fc not in SERVED_FCS:
            sub = getattr(pdu, "sub_function_code", -1)
            owner.rlog.warning("unserved", "modbus: %s asked for function code %d%s: ILLEGAL FUNCTION",
                               self.peer, fc, f" sub-function {sub}" if sub is not None and sub >= 0 else "")
            response = ExceptionResponse(fc, ExcCodes.ILLEGAL_FUNCTION)
        elif pdu.dev_id not in ds.unit_ids:
            response = ExceptionResponse(fc, ExcCodes.GATEWAY_NO_RESPONSE)
        elif not ds.published():  # before the loop's first publish: no placeholder values, no writes
            response = ExceptionResponse(fc, ExcCodes.DEVICE_BUSY)
        elif fc == 23 and isinstance(bad := ds.check_read(23, pdu.read_address, pdu.read_count), ExcCodes):
            response = ExceptionResponse(fc, bad)  # FC23 refuses before writing anything
        else:
            try:
                response = await pdu.datastore_update(ds, pdu.dev_id)
            except Exception as exc:  # nothing on the wire may take the server down
                owner.rlog.error("failed", "modbus: function code %d from %s failed: %s: %s",
                                 fc, self.peer, type(exc).__name__, exc)
                log.debug("request %s from %s failed", pdu, self.peer, exc_info=True)
                response = ExceptionResponse(fc, ExcCodes.DEVICE_FAILURE)
        if response is None:  # e.g. "force listen only" expects no answer
            return
        response.transaction_id = pdu.transaction_id
        response.dev_id = pdu.dev_id
        self.pdu_send(response, addr)
        exc = response.exception_code if response.isError() else 0
        address, count = _request_span(pdu)
        owner.account(self.peer, t_ns, fc, pdu.dev_id, address, count,
                      fc in WRITE_FCS, int(exc), ds.last_step, ds.last_publish_ns, ds.last_write_seq,
                      ds.last_served_ns)


class ImageModbusServer(ModbusTcpServer):
    """pymodbus TCP server whose connections are served by `_Handler` over the image."""

    def __init__(self, cmap: CompiledMap, image: ProcessImage, *, host: str | None = None,
                 port: int | None = None, request_log_size: int = 100_000, max_clients: int = 1024,
                 max_connections: int = 32, idle_timeout_s: float = 120.0):
        placeholder = SimDevice(id=0, simdata=[SimData(0, datatype=DataType.REGISTERS)])
        super().__init__(placeholder, address=(host or cmap.host, cmap.port if port is None else port))
        self.datastore = ImageDatastore(cmap, image)
        self.context = self.datastore  # pymodbus's own paths (broadcast) see ours too
        self.stats = ClientStats(max_clients)
        self.request_log = RequestLog(request_log_size)
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.rlog = RateLimitedLog(log)

    def callback_new_connection(self):
        return _Handler(self)

    async def sweep_idle(self) -> None:
        """Close connections silent for `idle_timeout_s` (runs until cancelled; 0 = never)."""
        timeout = self.idle_timeout_s
        if timeout <= 0:
            return
        while True:
            await asyncio.sleep(min(IDLE_SWEEP_MAX_S, timeout / 4))
            now = time.monotonic()
            for handler in list(self.active_connections.values()):
                if isinstance(handler, _Handler) and not handler.refused and not handler.is_closing:
                    idle = now - handler.last_rx_s
                    if idle >= timeout:
                        handler.close_idle(idle)

    def account(self, peer, t_ns, fc, unit, address, count, write_attempt, exc,
                step=-1, publish_ns=-1, write_seq=-1, served_ns=-1) -> None:
        dur = time.monotonic_ns() - t_ns
        self.stats.request(peer, t_ns, write_attempt, exc)
        wrote = write_seq >= 0
        self.request_log.append((t_ns, dur, peer, unit, fc, address, count, wrote, exc,
                                 step, publish_ns, write_seq, served_ns))


SHARED_LIST_SHOWN = 5  # actuators named in the one log line; the rest go to the run directory


def _shared_with_opcua(scenario, spec, cmap: CompiledMap, list_path: str | None = None) -> list[str]:
    """One line summarizing the actuators writable over both protocols (the last write wins), if
    any; the full list, one signal per line, goes to `list_path` (the run directory) when given."""
    section = getattr(scenario, "opcua", None)
    if section is None or not section.enabled:
        return []
    from hil.tagmap.opcua import resolve_nodes

    ua = {n.signal for n in resolve_nodes(section, spec, scenario) if n.kind == "actuator" and n.writable}
    both = sorted({t.signal for t in cmap.tags if t.writable} & ua)
    if not both:
        return []
    shown = ", ".join(both[:SHARED_LIST_SHOWN]) + (f" and {len(both) - SHARED_LIST_SHOWN} more"
                                                   if len(both) > SHARED_LIST_SHOWN else "")
    where = ""
    if list_path:
        try:
            Path(list_path).write_text("".join(f"{name}\n" for name in both))
            where = f"; full list in {list_path}"
        except OSError as exc:
            where = f"; full list not written ({exc})"
    return [f"{len(both)} actuators also writable over OPC UA (Actuators/<signal>), the last write of either "
            f"protocol wins: {shown}{where}"]


def final_counters(server: ImageModbusServer) -> dict:
    """The server's totals for the run summary (JSON-able)."""
    t = server.stats.as_dict()["totals"]
    return {"connections": t["connects"], "refused_connections": t["refused_connections"],
            "idle_closed": t["idle_closed"], "requests": t["requests"], "reads": t["reads"],
            "writes": t["writes"], "exceptions": dict(sorted(t["exceptions"].items())),
            "log_lines_suppressed": server.rlog.suppressed_total}


async def serve(scenario, image: ProcessImage, ready=None, stop: asyncio.Event | None = None,
                *, spec=None, request_log_path=None, stats_path=None, summary_path=None,
                shared_list_path=None, on_started=None) -> ImageModbusServer:
    """Serve until `stop` is set (or the task is cancelled); returns the server (stats)."""

    section = scenario.modbus
    if section is None:
        raise ValueError(f"scenario {scenario.name!r} has no [modbus] section")
    spec = spec or scenario.plant.load().spec
    cmap = compile_map(section, spec, scenario)
    server = ImageModbusServer(cmap, image, request_log_size=section.request_log_size,
                               max_clients=section.max_clients, max_connections=section.max_connections,
                               idle_timeout_s=section.idle_timeout_s)
    stop = stop or asyncio.Event()
    await server.serve_forever(background=True)
    log.info("modbus: listening on %s:%d (unit %d, %d tags, at most %d connections, idle timeout %s)",
             cmap.host, cmap.port, cmap.unit_id, len(cmap.tags), section.max_connections,
             f"{section.idle_timeout_s:g} s" if section.idle_timeout_s > 0 else "off")
    for line in describe_shared_views(cmap) + _shared_with_opcua(scenario, spec, cmap, shared_list_path):
        log.info("modbus: %s", line)
    sweeper = asyncio.ensure_future(server.sweep_idle())
    if on_started is not None:
        on_started(server)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        sweeper.cancel()
        await server.shutdown()
        _report(server, request_log_path or section.request_log, stats_path or section.client_stats)
        if summary_path:
            write_json_atomic(summary_path, final_counters(server), indent=1)
    return server


def _report(server: ImageModbusServer, request_log_path, stats_path) -> None:
    stats = server.stats.as_dict()
    t = stats["totals"]
    log.info("modbus: %d requests (%d writes) over %d connections, exceptions %s, %d connections "
             "refused, %d closed idle, %d log records dropped", t["requests"], t["writes"], t["connects"],
             t["exceptions"] or "none", t["refused_connections"], t["idle_closed"],
             server.request_log.dropped)
    with_exc = [(peer, c["exceptions"]) for peer, c in stats["clients"].items() if c["exceptions"]]
    for peer, exc in with_exc[:MAX_CLIENT_LINES]:
        log.info("modbus: client %s exceptions %s", peer, exc)
    if len(with_exc) > MAX_CLIENT_LINES:
        log.info("modbus: %d more clients had exceptions (client_stats has them all)",
                 len(with_exc) - MAX_CLIENT_LINES)
    if request_log_path:
        server.request_log.dump(request_log_path)
    if stats_path:
        p = Path(stats_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({**stats, "request_log_dropped": server.request_log.dropped}, indent=1))


def serve_forever(scenario, image_name: str, ready=None, stop=None, *,
                  request_log_path: str | None = None, stats_path: str | None = None,
                  summary_path: str | None = None, shared_list_path: str | None = None, spec=None) -> None:
    """Process entry point: serve the image `image_name` until `stop`, SIGTERM or SIGINT.
    `spec`: the plant's PlantSpec (as the loop has it); without it the plant is loaded here."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("pymodbus").setLevel(logging.CRITICAL)  # our log says what matters
    image = ProcessImage.attach(image_name)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, done.set)
            except (ValueError, RuntimeError):  # not the main thread
                pass

        async def watch_stop() -> None:
            while not done.is_set():
                if stop is not None and stop.is_set():
                    done.set()
                    return
                await asyncio.sleep(0.05)

        watcher = asyncio.ensure_future(watch_stop())
        try:
            await serve(scenario, image, ready, done, spec=spec, request_log_path=request_log_path,
                        stats_path=stats_path, summary_path=summary_path, shared_list_path=shared_list_path)
        finally:
            watcher.cancel()

    try:
        asyncio.run(main())
    finally:
        image.close()
