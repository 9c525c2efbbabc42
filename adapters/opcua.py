"""OPC UA server over the process image (asyncua 2.1): what a SCADA or PLC connects to.

Pieces: adapters/opcua_space.py (address space, values from the image, the poll task),
adapters/opcua_writes.py (client writes, reads, subscriptions and sessions, intercepted),
adapters/opcua_types.py (what a write of one variant type becomes in a node's data type),
adapters/opcua_security.py (endpoints, certificates, users, trusted clients),
adapters/opcua_limits.py (connection limit and idle timeout).

Process layout: `serve_forever(scenario, image_name, ready, stop, summary_path=None)` runs
the server in the calling process (its own, so that asyncio never shares the loop's
interpreter) until `stop` is set or SIGTERM/SIGINT arrives; `ready` is set once clients
can connect. At the end it logs and (to `summary_path`, JSON) reports `final_counters`:
sessions, connections, refused_connections, idle_closed, reads, values_read,
writes_accepted, writes_refused (by status code name), subscriptions, monitored_items.

Exposure: bound to a non-loopback host the server does not start unless users are
configured and client certificates are trusted explicitly, or `[opcua.security] insecure`
is true (then it logs a loud warning); the config check says the same first
(`OpcuaSection.exposure_problems`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
import time

from adapters import opcua_security
from adapters.opcua_limits import ConnectionLimits, LimitedServer
from adapters.opcua_space import MAX_POLL_S, OpcuaAdapter
from adapters.opcua_writes import GuardedInternalServer
from hil.atomic import write_json_atomic
from hil.image import H_PERIOD_NS, ProcessImage
from hil.tagmap.opcua import OpcuaSection

log = logging.getLogger("hil.opcua")

_IMMUTABLE = (float, int, bool, str, type(None))
# Nice value of the server process (the loop runs SCHED_FIFO on its own CPU; the servers and
# their clients share the others under SCHED_OTHER). 0 leaves the inherited value alone: measured
# with benchmarks/protocol_latency.py, nice -5 did not lower the loaded subscription latency
# (its end point is the client's callback, and a heavier server takes CPU from the clients on
# the same core; without sampler load shedding it made p99 several times worse). HIL_OPCUA_NICE
# overrides it per process (e.g. -5; needs CAP_SYS_NICE). Never a real-time policy.
SERVER_NICE = 0
# The start-up makes a few hundred thousand long-lived objects (nodes, attributes, DataValues)
# and no garbage cycles worth collecting; with the collector on, each of its full passes walks
# all of them again: the start of case118's server took 1.7-2x longer (measured with the
# collector on and off, same machine). `start_server` turns it off for the start-up and
# `serve_forever` then freezes the start-up's objects (gc.freeze: later passes skip them).
STARTUP_WITHOUT_GC = True


def raise_weight(nice: int | None = None) -> str:
    """Set the calling thread's nice value (threads created after inherit it); returns what happened.

    Linux applies setpriority(PRIO_PROCESS, 0) to the calling thread only, so call this
    before the server starts its threads. Needs CAP_SYS_NICE for a negative value; without
    it the nice value is left alone (logged).
    """
    if nice is None:
        env = os.environ.get("HIL_OPCUA_NICE", "").strip()
        nice = int(env) if env else SERVER_NICE
    if nice == 0:
        return "nice unchanged"
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except (PermissionError, OSError) as exc:
        return f"nice {nice} refused ({exc})"
    return f"nice {os.getpriority(os.PRIO_PROCESS, 0)}"


def _share_scalar_datavalues() -> None:
    """Make asyncua's monitored items keep scalar DataValues by reference, not deep copies.

    asyncua 2.1 deep-copies every DataValue written to a monitored node (~22 us each: at a
    1 ms sampling period with 20 monitored signals that alone is ~40 % of a core). The copy
    guards against later mutation of the value; a scalar of an immutable type cannot be
    mutated, and asyncua (like this adapter) replaces DataValues rather than editing them.
    Arrays and structures keep the deep copy. Idempotent; skipped if asyncua changed.
    """
    import copy

    from asyncua.server import monitored_item_service as mis

    cls = getattr(mis, "MonitoredItemValues", None)
    if cls is None or getattr(cls, "_hil_shared", False) or not hasattr(cls, "set_current_datavalue"):
        return

    def set_current_datavalue(self, cur_val):
        self.old_dvalue = self.current_dvalue
        v = cur_val.Value
        if v is None or (not v.is_array and isinstance(v.Value, _IMMUTABLE)):
            self.current_dvalue = cur_val
        else:
            self.current_dvalue = copy.deepcopy(cur_val)

    cls.set_current_datavalue = set_current_datavalue
    cls._hil_shared = True



def check_exposure(section: OpcuaSection) -> None:
    """Refuse (RuntimeError naming the keys) to serve a non-loopback host without users and
    trusted client certificates, unless `security.insecure`; warn loudly when insecure."""
    problems = section.exposure_problems()
    if problems:
        raise RuntimeError("OPC UA server not started: " + "; ".join(f"{k}: {r}" for k, r in problems))
    if not section.loopback and section.security.insecure:
        missing = [w for w, ok in (("no [opcua.users]: anonymous sessions may write actuators", section.users),
                                   ("no trusted_clients_dir: any client certificate is accepted",
                                    section.security.trusted_clients_dir)) if not ok]
        log.warning("!!! INSECURE OPC UA server on non-loopback host %s (opcua.security.insecure = true)%s",
                    section.host, ": " + "; ".join(missing) if missing else "")


def standard_cache_path():
    """Where the standard address space is cached (adapters/opcua_stdcache.py), or None when
    HIL_OPCUA_STANDARD_CACHE is "off" (then it is built at every start, as asyncua does)."""
    if os.environ.get("HIL_OPCUA_STANDARD_CACHE", "").strip().lower() in ("off", "0", "no", "false"):
        return None
    from adapters.opcua_stdcache import cache_path

    return cache_path()


async def start_server(section: OpcuaSection, spec, scenario, image: ProcessImage, period_s: float):
    """Build, configure and start the server; returns (server, adapter).

    The server's connection counters are `server.hil_limits` (adapters/opcua_limits.py);
    `server.hil_start_s` the wall seconds of each start-up phase: standard_space (asyncua's
    standard address space, read from its cache when there is one: `server.iserver.standard_space_note`),
    security (endpoints, certificates), nodes (the scenario's address space and first
    values), listen (the socket). The cyclic garbage collector is off meanwhile (STARTUP_WITHOUT_GC).
    """
    check_exposure(section)
    _share_scalar_datavalues()
    gc_was_on = gc.isenabled()
    if STARTUP_WITHOUT_GC:
        gc.disable()
    try:
        return await _start_server(section, spec, scenario, image, period_s)
    finally:
        if gc_was_on:
            gc.enable()


async def _start_server(section: OpcuaSection, spec, scenario, image: ProcessImage, period_s: float):
    t0 = time.perf_counter()
    iserver = GuardedInternalServer(user_manager=opcua_security.ConfiguredUsers(section))
    iserver.standard_cache = standard_cache_path()
    server = LimitedServer(iserver=iserver)
    server.hil_limits = ConnectionLimits(section.max_connections, section.idle_timeout_s)
    await server.init()
    t1 = time.perf_counter()
    server.hil_limits.apply_to(iserver)
    server.set_endpoint(section.endpoint_url())
    server.set_server_name(section.server_name)
    await server.set_application_uri(section.application_uri)
    server.product_uri = "urn:hil"
    await opcua_security.configure(server, section)
    t2 = time.perf_counter()
    adapter = OpcuaAdapter(section, spec, scenario, image, period_s)
    iserver.guard = adapter.guard
    await adapter.build(server)
    t3 = time.perf_counter()
    await server.start()
    server.hil_start_s = {"standard_space": t1 - t0, "security": t2 - t1, "nodes": t3 - t2,
                          "listen": time.perf_counter() - t3}
    return server, adapter


def _period_s(scenario, image: ProcessImage) -> float:
    ns = int(image.header[H_PERIOD_NS])
    if ns > 0:
        return ns / 1e9
    return MAX_POLL_S if scenario.loop is None else min(scenario.loop.period_s, MAX_POLL_S)


def final_counters(adapter: OpcuaAdapter, limits: ConnectionLimits) -> dict:
    """The server's totals for the run summary (JSON-able)."""
    g = adapter.counters()
    lim = limits.as_dict()
    return {"sessions": g["sessions"], "connections": lim["connections"],
            "refused_connections": lim["refused_connections"], "idle_closed": lim["idle_closed"],
            "reads": g["reads"], "values_read": g["values_read"], "writes_accepted": g["accepted"],
            "writes_refused": dict(sorted(g["rejected_by_code"].items())),
            "subscriptions": g["subscriptions"], "monitored_items": g["monitored_items"]}


async def _build_pending(adapter: OpcuaAdapter, freeze: bool) -> None:
    """Once the server listens, build the nodes no client looked up yet (adapters/opcua_space.py
    LAZY_NODES), a chunk at a time between client requests; without the cyclic collector
    meanwhile, as during the start-up (STARTUP_WITHOUT_GC), then frozen with the rest."""
    gc_was_on = gc.isenabled()
    if STARTUP_WITHOUT_GC:
        gc.disable()
    try:
        t = time.perf_counter()
        await adapter.build_pending()
        if adapter.lazily_added:
            log.info("OPC UA address space complete: %d nodes built after listening (%.2f s)",
                     adapter.lazily_added, time.perf_counter() - t)
        if freeze:
            gc.freeze()
    finally:
        if gc_was_on:
            gc.enable()


async def serve(scenario, image: ProcessImage, stop: asyncio.Event, ready=None, spec=None,
                freeze_startup: bool = False) -> dict:
    """Serve until `stop` is set; returns `final_counters`. `freeze_startup` (the server's own
    process): gc.freeze() the objects made by the start-up once it is done."""

    section = scenario.opcua if scenario.opcua is not None else OpcuaSection()
    spec = spec or scenario.plant.load().spec
    server, adapter = await start_server(section, spec, scenario, image, _period_s(scenario, image))
    if freeze_startup:
        gc.freeze()  # the address space lives as long as the process: later collections skip it
    limits = server.hil_limits
    log.info("OPC UA server on %s (namespace %s, %d nodes, sampling every %.1f ms, at most %d connections, "
             "idle timeout %s); start-up %s; standard address space %s", section.endpoint_url(),
             section.namespace(scenario.name),
             len(adapter.nodes), 1e3 * adapter.poll_s, section.max_connections,
             f"{section.idle_timeout_s:g} s" if section.idle_timeout_s > 0 else "off",
             ", ".join(f"{k} {v:.2f} s" for k, v in server.hil_start_s.items()), server.iserver.standard_space_note)
    sweeper = asyncio.ensure_future(limits.sweep_idle())
    builder = asyncio.ensure_future(_build_pending(adapter, freeze_startup))
    try:
        if ready is not None:
            ready.set()
        await adapter.poll(stop)
    finally:
        sweeper.cancel()
        builder.cancel()
        await server.stop()
        log.info("OPC UA sampler: %d samples, %d postponed under load", adapter.samples, adapter.shed)
    return final_counters(adapter, limits)


def serve_forever(scenario, image_name: str, ready=None, stop=None, *, summary_path: str | None = None,
                  spec=None) -> None:
    """Run the OPC UA server for `scenario` over the image `image_name` (blocking).

    `ready` (e.g. multiprocessing.Event) is set once clients can connect; the server stops
    when `stop` is set, or on SIGTERM / SIGINT (main thread only). `spec`: the plant's
    PlantSpec (as the loop has it); without it the plant is loaded here.
    """
    if not logging.getLogger().handlers:  # a spawned process: its lines as the Modbus server's
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("asyncua").setLevel(logging.WARNING)
    log.info("OPC UA server process %d: %s", os.getpid(), raise_weight())
    image = ProcessImage.attach(image_name)

    async def main() -> dict:
        stop_event = asyncio.Event()
        loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop_event.set)
        if stop is not None:
            async def watch() -> None:
                while not stop_event.is_set():
                    if stop.is_set():
                        stop_event.set()
                    await asyncio.sleep(0.05)
            watcher = asyncio.create_task(watch())
        try:
            return await serve(scenario, image, stop_event, ready, spec=spec, freeze_startup=True)
        finally:
            if stop is not None:
                watcher.cancel()

    try:
        c = asyncio.run(main())
        log.info("OPC UA server stopped: %d sessions over %d connections (%d refused, %d closed idle), "
                 "%d reads, writes %d accepted, refused %s, %d subscriptions, %d monitored items",
                 c["sessions"], c["connections"], c["refused_connections"], c["idle_closed"], c["reads"],
                 c["writes_accepted"], c["writes_refused"] or "none", c["subscriptions"], c["monitored_items"])
        if summary_path:
            write_json_atomic(summary_path, c, indent=1)
    finally:
        image.close()


