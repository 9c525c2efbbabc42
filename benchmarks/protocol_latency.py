"""Protocol latency of hil's Modbus TCP and OPC UA servers, and the loop's lateness under their load.

    python benchmarks/protocol_latency.py [--duration S] [--quick]

Scenario: configs/bioreactor_plc.toml with 50 float32 input registers added at 300..398
(cycling over the plant outputs, so one FC4 read of 100 registers is all mapped), free
ports, SecurityPolicy None on 127.0.0.1, no recording, no SoftPLC. Loop at 1 kHz (step 1 s,
time_scale 1000), SCHED_FIFO 80 pinned to CPU 1 (if there are 2+ CPUs). Each phase runs
its own loop: `hil.runtime.Runtime` in a spawned child over a process image this script
creates; the child starts the Modbus and OPC UA server processes, then raises its own
priority. Every client is a process of this script (normal priority; checked).

1. idle: no client for --duration s -> lateness_us.idle.
2. probes, one client at a time from this process (a plain pymodbus server with a static
   SimDevice datastore runs beside, in its own process):
   - modbus_read100_us: FC4 read of 100 registers, sync ModbusTcpClient, hil and plain
     alternating in blocks of 50; ratio_p50_vs_plain = what our image mapping costs.
   - opcua_read_us: one Read of 1 node, and one Read of 100 node ids (the 25 distinct
     signal variables repeated 4 times), asyncua client, alternating blocks.
   - write_to_effect_periods: FC16 write of aeration_rate (holding 6..7) every 12-20 ms;
     after the ack, this process busy-polls the image header until the loop's
     H_IN_APPLIED_WRITES reaches the write's H_IN_WRITES count (the loop sets it when it
     reads the inputs at the start of a step). The poll brackets the instant the loop took
     the write; it is placed on the loop's deadline grid (see `wte_report`).
   - opcua_sub_latency_ms: a subscriber process (publishing interval 10 ms, sampling 1 ms,
     queue 100) on Status.Step (changes every step) and Applied.aeration_rate (changes
     once per write, each value held >= 12 ms). Latency = wall time at the client's
     datachange callback - SourceTimestamp (the wall time of the loop's publish of that
     step). Lost changes: see `subscription_report`.
3. loaded: 10 Modbus client processes at 100 Hz (FC4, 100 registers) + 2 OPC UA client
   processes at 50 Hz (100-node Read) + the subscriber on every signal node, for
   --duration s -> lateness_us.loaded, misses_per_10k_loaded, achieved load.

value_age_periods: from the Modbus server's request log (modbus.request_log, dumped at
shutdown): per read, publish_ns of the image publish it was served from, served_ns (right
after that snapshot was taken), t_ns (decode) and dur_ns (decode -> response handed to the
socket), all CLOCK_MONOTONIC. value_age = served_ns - publish_ns (age when the values left
the image); transport_inclusive = t_ns + dur_ns - publish_ns; at_decode = t_ns - publish_ns.

server_cpu_fraction_loaded: CPU time (user + system) of the Modbus and OPC UA server
processes over the loaded phase, as a fraction of one CPU (psutil).

Last stdout line: one JSON object. Timing is reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import queue
import signal
import socket
import struct
import sys
import tempfile
import time
import tomllib
from datetime import timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hil.scenario.ports import free_port  # noqa: E402
from hil.image import (  # noqa: E402
    H_IN_APPLIED_WRITES, H_IN_WRITE_NS, H_IN_WRITES, H_PERIOD_NS, H_STEP, ProcessImage,
)

BASE = ROOT / "configs/bioreactor_plc.toml"
READ_ADDR, READ_COUNT, UNIT = 300, 100, 1
WRITE_SIGNAL, WRITE_ADDR = "aeration_rate", 6  # float32 holding register of the PLC map
PUB_MS, SAMPLING_MS, QUEUE_SIZE = 10.0, 1.0, 100
TIME_SCALE, PRIORITY = 1000.0, 80
SUB_WARMUP_S = 0.3  # notifications before this (initial values) are not latency samples


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def stats(values, scale: float = 1.0, nd: int = 3, qs=(50, 99)) -> dict:
    """p50/p99/max (and n) of `values` * scale; None entries when empty."""
    a = np.asarray(values, dtype=np.float64) * scale
    out = {f"p{q}": (round(float(np.percentile(a, q)), nd) if a.size else None) for q in qs}
    out["max"] = round(float(a.max()), nd) if a.size else None
    out["n"] = int(a.size)
    return out


def _normal_priority() -> str:
    from hil.loop.rt import set_normal

    set_normal()
    return _policy_name(os.sched_getscheduler(0))


def _policy_name(p: int) -> str:
    return {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_FIFO: "SCHED_FIFO", os.SCHED_RR: "SCHED_RR"}.get(p, str(p))


def _dt_ns(dt) -> int:
    if dt is None:
        return 0
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(round(dt.timestamp() * 1e6)) * 1000


# ---------------------------------------------------------------------------- scenario


def scenario_dict(modbus_port: int, opcua_port: int, request_log: str, cpu: int) -> dict:
    from plants.base import load_plant_module

    data = tomllib.loads(BASE.read_text())
    data.pop("softplc", None)
    spec = load_plant_module(data["plant"]["model"]).SPEC
    outs = spec.names("outputs")
    data["loop"].update(time_scale=TIME_SCALE, priority=PRIORITY, cpu=cpu, duration_s=3600.0)
    data["recording"] = {"enabled": False}
    mb = data["modbus"]
    mb.update(port=modbus_port, request_log=request_log)
    mb["map"] = list(mb["map"]) + [
        {"signal": outs[i % len(outs)], "table": "input_register", "address": READ_ADDR + 2 * i, "encoding": "float32"}
        for i in range(READ_COUNT // 2)
    ]
    data["opcua"].update(port=opcua_port)
    data["opcua"]["security"] = {"policies": [], "allow_none": True}
    from hil.scenario.config import parse_scenario

    parse_scenario(data, source=f"{BASE.name} + benchmark overrides")  # raises ConfigError with key paths
    return data


def node_paths(spec) -> list[str]:
    """The 25 distinct signal variables: Sensors, Actuators (all inputs are plc), Applied, Step, SimTime."""
    return ([f"Sensors.{n}" for n in spec.names("outputs")] + [f"Actuators.{n}" for n in spec.names("inputs")]
            + [f"Applied.{n}" for n in spec.names("inputs")] + ["Status.Step", "Status.SimTime"])


# ---------------------------------------------------------------------------- loop process


def _loop_child(data: dict, image_name: str, wall_s: float, started, go, out_q, clients_stop, clients_done) -> None:
    from hil.scenario.config import parse_scenario
    from hil.runtime import Runtime

    sc = parse_scenario(data)
    runtime = Runtime(sc, image_name=image_name, duration_s=wall_s * sc.loop.time_scale, record=False,
                      start_servers=True)

    def on_started(_r) -> None:  # servers listen; the loop starts (and raises priority) on `go`
        started.set()
        go.wait(300)

    def on_stopping(_r) -> None:  # the loop has stopped; its servers stop once the clients have
        if clients_stop is not None:
            clients_stop.set()
            clients_done.wait(120)

    try:
        summary = runtime.run(on_started=on_started, on_stopping=on_stopping)
        clock = runtime.clock
        out_q.put({"summary": summary.as_dict(), "above_1ms": clock.lateness.count_above(1_000_000),
                   "t0_ns": clock.t0_ns, "end_ns": clock.t0_ns + clock.k * clock.period_ns,
                   "period_ns": clock.period_ns})
    except BaseException as exc:
        out_q.put({"error": repr(exc)})
        raise
    finally:
        runtime.close()


class LoopRun:
    """One loop process (and its server processes) over an image this process owns."""

    def __init__(self, ctx, data: dict, spec, wall_s: float, clients_stop=None):
        """clients_stop: an Event the loop process sets when the loop ends; it then waits for
        `clients_done` before stopping its servers (clients never see a server go away)."""
        self.image = ProcessImage.create(spec.n_inputs, spec.n_outputs)
        self.started, self.go, self.q, self.clients_done = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Event()
        self.proc = ctx.Process(target=_loop_child, name="bench-loop",
                                args=(data, self.image.name, wall_s, self.started, self.go, self.q,
                                      clients_stop, self.clients_done))
        self.family: list = []
        self.wall_s = wall_s

    def start(self, timeout_s: float = 120.0) -> None:
        import psutil

        self.proc.start()
        deadline = time.monotonic() + timeout_s
        while not self.started.wait(0.2):
            if not self.proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"loop process did not start its servers (exit code {self.proc.exitcode})")
        self.family = psutil.Process(self.proc.pid).children(recursive=True)

    def release(self, timeout_s: float = 30.0) -> None:
        """Let the loop start; return once it has published a few steps."""
        self.go.set()
        deadline = time.monotonic() + timeout_s
        while int(self.image.header[H_STEP]) < 3:
            if not self.proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"loop did not start (exit code {self.proc.exitcode})")
            time.sleep(0.005)

    def sched(self) -> dict:
        """Scheduling policy, priority and CPUs of the loop and of its server processes."""
        out = {}
        kids = []
        for p in self.family:
            try:
                cmd = " ".join(p.cmdline())
            except Exception:
                cmd = ""
            kids.append((f"{'resource_tracker' if 'resource_tracker' in cmd else 'server'}:{p.pid}", p.pid))
        for name, pid in [("loop", self.proc.pid)] + kids:
            try:
                out[name] = {"policy": _policy_name(os.sched_getscheduler(pid)),
                             "priority": os.sched_getparam(pid).sched_priority,
                             "cpus": sorted(os.sched_getaffinity(pid))}
            except (OSError, Exception) as exc:  # psutil.NoSuchProcess too
                out[name] = {"error": str(exc)}
        return out

    def server_procs(self, ports: dict[str, int]) -> dict:
        """{role: psutil.Process} of the server processes listening on `ports` ({role: port})."""
        found = {}
        for p in self.family:
            try:
                conns = p.net_connections(kind="tcp")
            except Exception:
                continue
            for c in conns:
                for role, port in ports.items():
                    if c.status == "LISTEN" and c.laddr and c.laddr.port == port:
                        found[role] = p
        return found

    def stop(self) -> None:
        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGTERM)

    def result(self, timeout_s: float) -> dict:
        try:
            r = self.q.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError("loop process gave no summary") from None
        self.proc.join(30)
        if "error" in r:
            raise RuntimeError(f"loop process failed: {r['error']}")
        return r

    def close(self) -> None:
        self.go.set()
        self.clients_done.set()
        if self.proc.is_alive():
            self.stop()
            self.proc.join(15)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        for p in self.family:  # servers left behind by a killed loop process
            try:
                if p.is_running():
                    p.kill()
            except Exception:
                pass
        self.image.close()


def _cpu_times(procs: dict) -> dict:
    out = {}
    for role, p in procs.items():
        try:
            t = p.cpu_times()
            out[role] = (time.monotonic(), t.user + t.system)
        except Exception:
            pass
    return out


def _cpu_use(procs: dict, before: dict) -> dict:
    """Fraction of one CPU each server process used since `before` (user + system)."""
    out = {}
    for role, (t0, c0) in before.items():
        try:
            t = procs[role].cpu_times()
            out[role] = round((t.user + t.system - c0) / max(time.monotonic() - t0, 1e-9), 3)
        except Exception as exc:
            out[role] = repr(exc)
    return out


def lateness(r: dict) -> dict:
    s = r["summary"]
    lat = s["lateness_us"]
    n = max(int(lat["n"]), 1)
    return {"p50": lat["p50"], "p99": lat["p99"], "p999": lat["p999"], "max": lat["max"], "n": lat["n"],
            "late_steps": s["late_steps"], "overruns": s["overruns"], "above_1ms": r["above_1ms"],
            "misses_per_10k": round(s["late_steps"] * 10_000 / n, 3), "spin_cpu_fraction": s["spin_cpu_fraction"],
            "torn_input_reads": s["torn_input_reads"], "state": s["state"], "warnings": s["warnings"]}


# ---------------------------------------------------------------------------- client processes


def _plain_server_child(port: int, ready, stop) -> None:
    """pymodbus 3.16 server, static SimDevice: 50 float32 at 300..398, unit 1."""
    import logging

    from pymodbus.server import ModbusTcpServer
    from pymodbus.simulator import DataType, SimData, SimDevice

    _normal_priority()
    logging.getLogger("pymodbus").setLevel(logging.CRITICAL)

    async def main() -> None:
        dev = SimDevice(id=UNIT, simdata=[SimData(READ_ADDR, values=[i + 0.5 for i in range(READ_COUNT // 2)],
                                                  datatype=DataType.FLOAT32)])
        server = ModbusTcpServer(dev, address=("127.0.0.1", port))
        await server.serve_forever(background=True)
        ready.set()
        end = time.monotonic() + 900
        while not stop.is_set() and time.monotonic() < end:
            await asyncio.sleep(0.05)
        await server.shutdown()

    asyncio.run(main())


def _modbus_load_child(idx: int, port: int, rate_hz: float, phase: float, ready_q, go, stop, out_q) -> None:
    import logging

    from pymodbus.client import ModbusTcpClient

    policy = _normal_priority()
    logging.getLogger("pymodbus").setLevel(logging.CRITICAL)
    c = ModbusTcpClient("127.0.0.1", port=port, timeout=2.0)
    ok = c.connect()
    ready_q.put(("modbus", idx, ok))
    starts, rtts, oks, skipped = [], [], [], 0
    if ok and go.wait(300):
        period = 1.0 / rate_hz
        t_next = time.monotonic() + phase * period
        end = time.monotonic() + 900
        while not stop.is_set() and time.monotonic() < end:
            delay = t_next - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t0 = time.monotonic_ns()
            try:
                rr = c.read_input_registers(READ_ADDR, count=READ_COUNT, device_id=UNIT)
                bad = rr.isError() or len(rr.registers) != READ_COUNT
            except Exception:
                bad = True
            t1 = time.monotonic_ns()
            oks.append(not bad)
            starts.append(t0)
            rtts.append(t1 - t0)
            t_next += period
            late = time.monotonic() - t_next
            if late > 0:  # skip missed slots, never burst
                n = int(late // period) + 1
                skipped += n
                t_next += n * period
    c.close()
    out_q.put({"kind": "modbus", "idx": idx, "policy": policy, "cpus": sorted(os.sched_getaffinity(0)),
               "starts": np.array(starts, dtype=np.int64), "rtt": np.array(rtts, dtype=np.int64),
               "ok": np.array(oks, dtype=bool), "skipped": skipped})


def _opcua_load_child(idx: int, url: str, ns_uri: str, name: str, paths: list, rate_hz: float, phase: float,
                      ready_q, go, stop, out_q) -> None:
    import logging

    from asyncua import Client, ua

    policy = _normal_priority()
    logging.getLogger("asyncua").setLevel(logging.ERROR)
    starts, rtts, oks = [], [], []
    res = {"skipped": 0}

    async def main() -> None:
        async with Client(url, timeout=10) as c:
            ns = await c.get_namespace_index(ns_uri)
            nodes = [c.get_node(ua.NodeId(f"{name}.{p}", ns)) for p in paths]
            ready_q.put(("opcua", idx, True))
            loop = asyncio.get_running_loop()
            if not await loop.run_in_executor(None, go.wait, 300):
                return
            period = 1.0 / rate_hz
            t_next = time.monotonic() + phase * period
            end = time.monotonic() + 900
            while not stop.is_set() and time.monotonic() < end:
                delay = t_next - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                t0 = time.monotonic_ns()
                try:
                    dvs = await c.read_attributes(nodes)
                    good = len(dvs) == len(nodes) and all(dv.StatusCode.is_good() for dv in dvs)
                except Exception:
                    good = False
                oks.append(good)
                starts.append(t0)
                rtts.append(time.monotonic_ns() - t0)
                t_next += period
                late = time.monotonic() - t_next
                if late > 0:
                    n = int(late // period) + 1
                    res["skipped"] += n
                    t_next += n * period

    try:
        asyncio.run(main())
    except Exception as exc:
        ready_q.put(("opcua", idx, False))
        res["error"] = repr(exc)
    out_q.put({"kind": "opcua", "idx": idx, "policy": policy, "cpus": sorted(os.sched_getaffinity(0)),
               "starts": np.array(starts, dtype=np.int64), "rtt": np.array(rtts, dtype=np.int64),
               "ok": np.array(oks, dtype=bool), **res})


def _subscriber_child(url: str, ns_uri: str, name: str, paths: list, ready_q, stop, out_q) -> None:
    """Subscribe to `paths` (10 ms publishing, 1 ms sampling, queue 100) until `stop`."""
    import logging

    from asyncua import Client, ua

    policy = _normal_priority()
    logging.getLogger("asyncua").setLevel(logging.ERROR)
    recs: dict[str, list] = {p: [] for p in paths}
    seqs: list[int] = []
    info: dict = {}
    by_id: dict = {}  # NodeId -> path

    class Handler:
        def datachange_notification(self, node, val, data) -> None:
            now = time.time_ns()
            dv = data.monitored_item.Value
            v = math.nan if val is None else float(val)
            recs[by_id[node.nodeid]].append((now, v, _dt_ns(dv.SourceTimestamp), _dt_ns(dv.ServerTimestamp)))

        def status_change_notification(self, status) -> None:
            info.setdefault("status_changes", []).append(str(status))

    async def main() -> None:
        async with Client(url, timeout=10) as c:
            ns = await c.get_namespace_index(ns_uri)
            nodes = [c.get_node(ua.NodeId(f"{name}.{p}", ns)) for p in paths]
            by_id.update({n.nodeid: p for n, p in zip(nodes, paths)})
            sub = await c.create_subscription(PUB_MS, Handler())
            info["publishing_interval_ms"] = sub.parameters.RequestedPublishingInterval
            callbacks = c.uaclient._subscription_callbacks  # asyncua 2.1: looked up per PublishResponse
            original = callbacks[sub.subscription_id]

            async def counted(params):  # notification message sequence numbers: gaps = lost messages
                if params.NotificationMessage.NotificationData:
                    seqs.append(int(params.NotificationMessage.SequenceNumber))
                r = original(params)
                if asyncio.iscoroutine(r):
                    await r

            callbacks[sub.subscription_id] = counted
            await sub.subscribe_data_change(nodes, queuesize=QUEUE_SIZE, sampling_interval=SAMPLING_MS)
            info["ready_ns"] = time.time_ns()
            ready_q.put(("sub", 0, True))
            end = time.monotonic() + 900
            while not stop.is_set() and time.monotonic() < end:
                await asyncio.sleep(0.02)
            await sub.delete()

    try:
        asyncio.run(main())
    except Exception as exc:
        ready_q.put(("sub", 0, False))
        info["error"] = repr(exc)
    out_q.put({"kind": "sub", "policy": policy, "seqs": seqs, **info,
               "recs": {p: np.array(r, dtype=np.float64).reshape(-1, 4) for p, r in recs.items()}})


def wait_ready(ready_q, n: int, procs: list, timeout_s: float) -> None:
    got, deadline = 0, time.monotonic() + timeout_s
    while got < n:
        try:
            kind, idx, ok = ready_q.get(timeout=0.5)
        except queue.Empty:
            if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
                raise RuntimeError(f"only {got} of {n} clients connected") from None
            continue
        if not ok:
            raise RuntimeError(f"{kind} client {idx} could not connect")
        got += 1


def collect(out_q, n: int, procs: list, timeout_s: float) -> list[dict]:
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        try:
            out.append(out_q.get(timeout=0.5))
        except queue.Empty:
            if all(not p.is_alive() for p in procs):
                break
    return out


def reap(procs: list) -> None:
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.terminate()
            p.join(3)
        if p.is_alive():
            p.kill()
            p.join(2)


# ---------------------------------------------------------------------------- probes


def modbus_probe(hil_port: int, plain_port: int, n: int, block: int = 50) -> dict:
    from pymodbus.client import ModbusTcpClient

    clients = {k: ModbusTcpClient("127.0.0.1", port=p, timeout=2.0) for k, p in (("hil", hil_port),
                                                                                 ("plain", plain_port))}
    try:
        for k, c in clients.items():
            if not c.connect():
                raise RuntimeError(f"cannot connect to the {k} Modbus server")

        def one(c) -> int:
            t0 = time.perf_counter_ns()
            rr = c.read_input_registers(READ_ADDR, count=READ_COUNT, device_id=UNIT)
            t1 = time.perf_counter_ns()
            if rr.isError() or len(rr.registers) != READ_COUNT:
                raise RuntimeError(f"Modbus read failed: {rr}")
            return t1 - t0

        samples: dict[str, list] = {"hil": [], "plain": []}
        for c in clients.values():
            for _ in range(block):  # warm-up: connection, plan cache
                one(c)
        for b in range(max(1, n // block)):
            for k in (("hil", "plain") if b % 2 == 0 else ("plain", "hil")):
                samples[k] += [one(clients[k]) for _ in range(block)]
        return samples
    finally:
        for c in clients.values():
            c.close()


async def opcua_probe(url: str, ns_uri: str, name: str, paths: list, n: int, block: int = 25) -> dict:
    from asyncua import Client, ua

    async with Client(url, timeout=10) as c:
        ns = await c.get_namespace_index(ns_uri)
        single = [c.get_node(ua.NodeId(f"{name}.Sensors.dissolved_oxygen", ns))]
        batch = [c.get_node(ua.NodeId(f"{name}.{paths[i % len(paths)]}", ns)) for i in range(100)]

        async def one(nodes) -> int:
            t0 = time.perf_counter_ns()
            dvs = await c.read_attributes(nodes)
            t1 = time.perf_counter_ns()
            if len(dvs) != len(nodes) or not all(dv.StatusCode.is_good() for dv in dvs):
                raise RuntimeError("OPC UA read returned bad values")
            return t1 - t0

        samples: dict[str, list] = {"single": [], "batch100": []}
        for nodes in (single, batch):
            for _ in range(10):
                await one(nodes)
        for b in range(max(1, n // block)):
            for k, nodes in ((("single", single), ("batch100", batch)) if b % 2 == 0
                             else (("batch100", batch), ("single", single))):
                samples[k] += [await one(nodes) for _ in range(block)]
        return samples


def f32(v: float) -> float:
    return struct.unpack(">f", struct.pack(">f", v))[0]


def write_to_effect(port: int, image: ProcessImage, n: int, seed: int = 7) -> tuple[dict, list[float]]:
    """FC16 writes of aeration_rate; after each ack, busy-poll until the loop has taken it.

    Returns ({"rows": int64 [t_send, t_ack, write_ns, lower, upper] per write, counters},
    the values written, float32-exact, in order). The loop took the write at a time in
    (lower, upper]: upper = end of the first poll that saw H_IN_APPLIED_WRITES reach the
    write's count, lower = start of the last poll that did not (or the image write).
    """
    from pymodbus.client import ModbusTcpClient

    rng = np.random.default_rng(seed)
    h = image.header
    c = ModbusTcpClient("127.0.0.1", port=port, timeout=2.0)
    if not c.connect():
        raise RuntimeError("cannot connect to hil's Modbus server")
    rows, written, foreign, timeouts, errors = [], [], 0, 0, 0
    period_ns = int(h[H_PERIOD_NS]) or 1_000_000
    try:
        for i in range(n):
            time.sleep(rng.uniform(0.012, 0.020))  # random phase vs. the loop; each value held >= 12 ms
            value = f32(5.0 + 15.0 * ((i * 0.6180339887498949) % 1.0))
            regs = list(struct.unpack(">HH", struct.pack(">f", value)))
            w0 = int(h[H_IN_WRITES])
            t_send = time.monotonic_ns()
            rr = c.write_registers(WRITE_ADDR, regs, device_id=UNIT)
            t_ack = time.monotonic_ns()
            if rr.isError():
                errors += 1
                continue
            target = int(h[H_IN_WRITES])
            write_ns = int(h[H_IN_WRITE_NS])
            if target != w0 + 1:
                foreign += 1  # someone else wrote too: waiting for the later count is conservative
            written.append(value)
            lower = write_ns  # the loop cannot take the write before it is in the image
            deadline = t_ack + 200 * period_ns
            while True:
                t_before = time.monotonic_ns()
                taken = int(h[H_IN_APPLIED_WRITES]) >= target
                t_after = time.monotonic_ns()
                if taken or t_after > deadline:
                    break
                lower = t_before
            if not taken:
                timeouts += 1
                continue
            rows.append((t_send, t_ack, write_ns, lower, t_after))
    finally:
        c.close()
    return {"rows": np.array(rows, dtype=np.int64).reshape(-1, 5), "timeouts": timeouts, "errors": errors,
            "foreign_writes": foreign}, written


def wte_report(w: dict, t0_ns: int, period_ns: int, slack_ns: int = 50_000) -> dict:
    """Write-to-effect in loop periods, from the poll brackets and the loop's deadline grid.

    A step reads its inputs right after its deadline t0 + k*period (lateness p99 < 1 us
    here). The apply instant is placed on the first deadline in (max(lower, write) -
    slack, upper]; a bracket holding none (a step more than `slack` late) keeps the
    conservative `upper`. Effect before the ack reached the client counts as 0 periods.
    """
    a = w["rows"]
    t_send, t_ack, write_ns, lower, upper = (a[:, i] for i in range(5))
    start = np.maximum(lower, write_ns) - slack_ns
    k = -((t0_ns - start) // period_ns)  # ceil((start - t0) / period)
    first = t0_ns + k * period_ns
    on_grid = (first <= upper) & (first > start)
    est = np.where(on_grid, first, upper)
    eff = (est - t_ack) / period_ns
    return {
        **stats(np.clip(eff, 0.0, None)),
        "applied_before_ack": int((eff < 0).sum()),
        "from_image_write": stats((est - write_ns) / period_ns),
        "upper_bound_from_ack": stats((upper - t_ack) / period_ns),
        "bracket_us": stats((upper - lower) * 1e-3, nd=2),
        "placed_on_deadline": int(on_grid.sum()),
        "write_rtt_us": stats((t_ack - t_send) * 1e-3, nd=1),
        "timeouts": w["timeouts"], "errors": w["errors"], "foreign_writes": w["foreign_writes"],
    }


# ---------------------------------------------------------------------------- analysis


def read_request_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def value_age(records: list[dict], t0_ns: int, end_ns: int, period_ns: int) -> dict:
    """Age of served values in loop periods, from reads answered while the loop ran.

    Main figure: served_ns - publish_ns, the age of the values when their snapshot left the
    image (exact, one CLOCK_MONOTONIC). transport_inclusive: t_ns + dur_ns - publish_ns,
    when the answer was handed to the socket (adds the server's decode and encode);
    at_decode: t_ns - publish_ns (the request's arrival, before the snapshot).
    """
    rows = [(r["t_ns"], r["dur_ns"], r["publish_ns"], r.get("served_ns", -1)) for r in records
            if r["fc"] in (3, 4) and r["exc"] == 0 and r["step"] > 0 and r["publish_ns"] > 0
            and t0_ns + period_ns <= r["t_ns"] <= end_ns]
    a = np.array(rows, dtype=np.int64).reshape(-1, 4)
    served = a[a[:, 3] > 0]
    return {**stats((served[:, 3] - served[:, 2]) / period_ns),
            "transport_inclusive": stats((a[:, 0] + a[:, 1] - a[:, 2]) / period_ns),
            "at_decode": stats((a[:, 0] - a[:, 2]) / period_ns),
            "snapshot_after_decode_us": stats((served[:, 3] - served[:, 0]) * 1e-3, nd=1),
            "server_time_us": stats(a[:, 1] * 1e-3, nd=1)}


def subscription_report(sub: dict, written: list[float] | None = None) -> dict:
    """Latency and lost changes of one subscriber's records.

    Status.Step changes every loop period (1 ms) and the server samples the image every
    1 ms on an asyncio timer, so a step overwritten between two samples is never seen:
    that is sampling (`steps_not_sampled`), not loss. Lost changes are counted where the
    sampling cannot explain them: notification messages missing from the sequence numbers,
    Step values out of order or repeated, and written aeration_rate values (each held
    >= 12 ms, i.e. >= 12 sampling intervals and longer than the publishing interval) that
    never arrived on Applied.aeration_rate.
    """
    t_from = sub.get("ready_ns", 0) + int(SUB_WARMUP_S * 1e9)
    step = sub["recs"].get("Status.Step", np.zeros((0, 4)))
    step = step[step[:, 0] >= t_from]
    lat_ms = (step[:, 0] - step[:, 2]) * 1e-6
    v = step[:, 1]
    d = np.diff(v)
    seqs = np.array(sub.get("seqs", []), dtype=np.int64)
    seq_gaps = int(np.clip(np.diff(seqs) - 1, 0, None).sum()) if seqs.size > 1 else 0
    out_of_order = int((d <= 0).sum())
    expected = int(v[-1] - v[0] + 1) if v.size else 0
    interval = float(sub.get("publishing_interval_ms", PUB_MS))
    rep = {
        **stats(lat_ms),
        "publishing_interval_ms": interval,
        "goal_p99_ms": interval + 3.0,
        "steps_published": expected,
        "steps_delivered": int(v.size),
        "steps_not_sampled": int(np.clip(d - 1, 0, None).sum()) if v.size else 0,
        "max_step_gap": int(d.max()) if d.size else 0,
        "lost_notification_messages": seq_gaps,
        "step_out_of_order_or_repeated": out_of_order,
    }
    lost = seq_gaps + out_of_order
    if written is not None:
        app = sub["recs"].get(f"Applied.{WRITE_SIGNAL}", np.zeros((0, 4)))
        got = app[:, 1]
        firsts, missing = [], 0
        for w in written:
            hit = np.flatnonzero(np.isclose(got, w, rtol=1e-12, atol=0.0))
            if hit.size == 0:
                missing += 1
            else:
                firsts.append(hit[0])
        order_errors = int((np.diff(firsts) <= 0).sum()) if len(firsts) > 1 else 0
        rep["applied_changes"] = {"written": len(written), "delivered": len(written) - missing, "lost": missing,
                                  "out_of_order": order_errors,
                                  "latency_ms": stats((app[firsts, 0] - app[firsts, 2]) * 1e-6 if firsts else [])}
        lost += missing + order_errors
    rep["lost_changes"] = lost
    rep["error"] = sub.get("error")
    return rep


def client_load(results: list[dict], kind: str, t0_ns: int, end_ns: int) -> dict:
    rs = [r for r in results if r["kind"] == kind]
    window_s = max((end_ns - t0_ns) * 1e-9, 1e-9)
    starts = [r["starts"] for r in rs]
    n_in = sum(int(((s >= t0_ns) & (s <= end_ns)).sum()) for s in starts)
    inside = [(r["starts"] >= t0_ns) & (r["starts"] <= end_ns) for r in rs]
    rtt = np.concatenate([r["rtt"][m] for r, m in zip(rs, inside)]) if rs else []
    errors = sum(int((~r["ok"][m]).sum()) for r, m in zip(rs, inside))
    return {"clients": len(rs), "requests_per_s": round(n_in / window_s, 1), "rtt_us": stats(np.asarray(rtt) * 1e-3, nd=1),
            "errors": errors, "skipped_slots": sum(r["skipped"] for r in rs),
            "client_policies": sorted({r["policy"] for r in rs})}


# ---------------------------------------------------------------------------- phases


def phase_idle(ctx, spec, wall_s: float, cpu: int, tmp: Path) -> dict:
    data = scenario_dict(free_port(), free_port(), str(tmp / "idle_requests.jsonl"), cpu)
    run = LoopRun(ctx, data, spec, wall_s)
    try:
        run.start()
        run.release()
        sched = run.sched()
        r = run.result(wall_s + 120)
    finally:
        run.close()
    return {"lateness": lateness(r), "sched": sched}


def phase_probes(ctx, spec, args, cpu: int, tmp: Path) -> dict:
    name = "bioreactor"
    mb_port, ua_port, plain_port = free_port(), free_port(), free_port()
    log_path = tmp / "probe_requests.jsonl"
    data = scenario_dict(mb_port, ua_port, str(log_path), cpu)
    url, ns_uri, paths = f"opc.tcp://127.0.0.1:{ua_port}/hil", f"urn:hil:{name}", node_paths(spec)
    run = LoopRun(ctx, data, spec, 900.0)  # stopped with SIGTERM when the probes are done
    plain_ready, plain_stop = ctx.Event(), ctx.Event()
    plain = ctx.Process(target=_plain_server_child, args=(plain_port, plain_ready, plain_stop), name="bench-plain")
    ready_q, sub_stop, sub_q = ctx.Queue(), ctx.Event(), ctx.Queue()
    sub = ctx.Process(target=_subscriber_child, name="bench-sub",
                      args=(url, ns_uri, name, ["Status.Step", f"Applied.{WRITE_SIGNAL}"], ready_q, sub_stop, sub_q))
    procs = [plain, sub]
    try:
        plain.start()
        run.start()
        if not plain_ready.wait(60):
            raise RuntimeError("plain pymodbus server did not start")
        run.release()
        sched = run.sched()
        log(f"probe: Modbus read of {READ_COUNT} registers x {args.modbus_n} (hil, plain)")
        mb = modbus_probe(mb_port, plain_port, args.modbus_n)
        log(f"probe: OPC UA reads x {args.opcua_n} (1 node, 100 nodes)")
        ua_s = asyncio.run(opcua_probe(url, ns_uri, name, paths, args.opcua_n))
        sub.start()
        wait_ready(ready_q, 1, [sub], 60)
        time.sleep(SUB_WARMUP_S + 0.2)
        log(f"probe: write-to-effect x {args.writes} with a subscriber on Status.Step and Applied.{WRITE_SIGNAL}")
        wte, written = write_to_effect(mb_port, run.image, args.writes)
        time.sleep(0.2)  # the last change reaches the subscriber
        sub_stop.set()
        sub_res = collect(sub_q, 1, [sub], 30)
        run.stop()
        r = run.result(60)
    finally:
        plain_stop.set()
        sub_stop.set()
        reap(procs)
        run.close()
    if not sub_res:
        raise RuntimeError("subscriber returned nothing")
    age = value_age(read_request_log(log_path), r["t0_ns"], r["end_ns"], r["period_ns"])
    wte = wte_report(wte, r["t0_ns"], r["period_ns"])
    return {"modbus": mb, "opcua": ua_s, "wte": wte, "sub": subscription_report(sub_res[0], written),
            "age": age, "lateness": lateness(r), "sched": sched}


def phase_loaded(ctx, spec, wall_s: float, cpu: int, tmp: Path, n_mb: int, mb_hz: float, n_ua: int, ua_hz: float,
                 subscriber: bool) -> dict:
    name = "bioreactor"
    mb_port, ua_port = free_port(), free_port()
    log_path = tmp / "loaded_requests.jsonl"
    data = scenario_dict(mb_port, ua_port, str(log_path), cpu)
    url, ns_uri, paths = f"opc.tcp://127.0.0.1:{ua_port}/hil", f"urn:hil:{name}", node_paths(spec)
    ready_q, stop, out_q, sub_q = ctx.Queue(), ctx.Event(), ctx.Queue(), ctx.Queue()
    run = LoopRun(ctx, data, spec, wall_s, clients_stop=stop)
    procs = [ctx.Process(target=_modbus_load_child, name=f"bench-mb{i}",
                         args=(i, mb_port, mb_hz, i / n_mb, ready_q, run.go, stop, out_q)) for i in range(n_mb)]
    procs += [ctx.Process(target=_opcua_load_child, name=f"bench-ua{i}",
                          args=(i, url, ns_uri, name, [paths[j % len(paths)] for j in range(100)], ua_hz,
                                i / max(n_ua, 1), ready_q, run.go, stop, out_q)) for i in range(n_ua)]
    if subscriber:
        procs.append(ctx.Process(target=_subscriber_child, name="bench-sub",
                                 args=(url, ns_uri, name, paths, ready_q, stop, sub_q)))
    try:
        run.start()
        for p in procs:
            p.start()
        wait_ready(ready_q, len(procs), procs, 120)
        run.release()
        time.sleep(0.5)
        sched = run.sched()
        servers = run.server_procs({"modbus": mb_port, "opcua": ua_port})
        cpu0 = _cpu_times(servers)
        if not stop.wait(wall_s + 120):  # set by the loop process when the loop has ended
            raise RuntimeError("the loaded loop did not end in time")
        server_cpu = _cpu_use(servers, cpu0)
        results = collect(out_q, n_mb + n_ua, procs, 60)
        sub_res = collect(sub_q, 1, procs, 30) if subscriber else []
        run.clients_done.set()
        r = run.result(120)
    finally:
        stop.set()
        run.go.set()
        run.clients_done.set()
        reap(procs)
        run.close()
    records = read_request_log(log_path)
    t0, end = r["t0_ns"], r["end_ns"]
    window_s = (end - t0) * 1e-9
    served = sum(1 for rec in records if t0 <= rec["t_ns"] <= end)
    load = {"window_s": round(window_s, 3),
            "modbus_requests_per_s_served": round(served / window_s, 1),
            "modbus": client_load(results, "modbus", t0, end),
            "opcua_reads_per_s": client_load(results, "opcua", t0, end),
            "opcua_read_nodes": 100,
            "clients_returned": len(results), "clients_started": n_mb + n_ua}
    return {"lateness": lateness(r), "load": load, "sched": sched, "server_cpu": server_cpu,
            "age": value_age(records, t0, end, r["period_ns"]),
            "sub": subscription_report(sub_res[0]) if sub_res else None}


# ---------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=10.0, help="wall seconds of the idle and of the loaded phase")
    ap.add_argument("--quick", action="store_true", help="very short run (smoke test)")
    ap.add_argument("--no-loaded-subscriber", action="store_true",
                    help="loaded phase without the subscriber on every node")
    args = ap.parse_args()
    import logging

    logging.getLogger("asyncua").setLevel(logging.ERROR)
    if args.quick:
        args.duration = min(args.duration, 2.0)
    args.modbus_n = 200 if args.quick else 2000
    args.opcua_n = 50 if args.quick else 500
    args.writes = 40 if args.quick else 300
    n_mb, mb_hz, n_ua, ua_hz = 10, 100.0, 2, 50.0

    from plants.base import load_plant_module

    spec = load_plant_module("bioreactor").SPEC
    cpu = 1 if (os.cpu_count() or 1) > 1 else -1
    ctx = mp.get_context("spawn")
    load_before = os.getloadavg()
    t_start = time.monotonic()
    log(f"protocol_latency: 1 kHz loop, SCHED_FIFO {PRIORITY} on CPU {cpu}, phases of {args.duration:g} s"
        + (" (quick)" if args.quick else ""))
    with tempfile.TemporaryDirectory(prefix="hil-protobench-") as tmpdir:
        tmp = Path(tmpdir)
        idle = phase_idle(ctx, spec, args.duration, cpu, tmp)
        log(f"idle:   lateness p99 {idle['lateness']['p99']} us, p99.9 {idle['lateness']['p999']} us")
        probes = phase_probes(ctx, spec, args, cpu, tmp)
        log(f"probes: write-to-effect p99 {probes['wte']['p99']} periods, sub latency p99 {probes['sub']['p99']} ms")
        loaded = phase_loaded(ctx, spec, args.duration, cpu, tmp, n_mb, mb_hz, n_ua, ua_hz,
                              not args.no_loaded_subscriber)
        log(f"loaded: lateness p99 {loaded['lateness']['p99']} us, p99.9 {loaded['lateness']['p999']} us, "
            f"{loaded['load']['modbus_requests_per_s_served']} Modbus req/s, "
            f"{loaded['load']['opcua_reads_per_s']['requests_per_s']} OPC UA reads/s")

    mb_hil = stats(np.array(probes["modbus"]["hil"]) * 1e-3, nd=1)
    mb_plain = stats(np.array(probes["modbus"]["plain"]) * 1e-3, nd=1)
    ua_single = stats(np.array(probes["opcua"]["single"]) * 1e-3, nd=1)
    ua_batch = stats(np.array(probes["opcua"]["batch100"]) * 1e-3, nd=1)
    sub = probes["sub"]
    wte = probes["wte"]
    age = {**loaded["age"], "phase": "loaded", "unloaded": probes["age"],
           "method": "Modbus server request log, per FC3/FC4 read: served_ns (right after the image snapshot "
                     "the read was served from) - publish_ns of that publish, one CLOCK_MONOTONIC: the age of the "
                     "values when they left the image; transport_inclusive = t_ns (decode) + dur_ns (answer "
                     "handed to the socket) - publish_ns; at_decode = t_ns - publish_ns"}
    lat_idle, lat_loaded = idle["lateness"], loaded["lateness"]
    result = {
        "benchmark": "protocol_latency",
        "modbus_read100_us": {"hil": mb_hil, "plain": mb_plain,
                              "method": f"FC4 read of {READ_COUNT} registers at {READ_ADDR} (50 float32), sync "
                                        "pymodbus ModbusTcpClient, hil and plain alternating in blocks of 50; "
                                        "plain = pymodbus 3.16 ModbusTcpServer with a static SimDevice "
                                        "(50 float32), in its own process"},
        "ratio_p50_vs_plain": round(mb_hil["p50"] / mb_plain["p50"], 3),
        "ratio_p99_vs_plain": round(mb_hil["p99"] / mb_plain["p99"], 3),
        "opcua_read_us": {"single": ua_single, "batch100": ua_batch,
                          "method": "asyncua Client.read_attributes (one Read request), SecurityPolicy None; "
                                    "single = Sensors.dissolved_oxygen; batch100 = 100 node ids: the 25 distinct "
                                    "variables (9 Sensors, 7 Actuators, 7 Applied, Status.Step, Status.SimTime) "
                                    "repeated 4 times"},
        "opcua_sub_latency_ms": {**sub, "loaded": loaded["sub"],
                                 "method": f"subscriber process, publishing {PUB_MS:g} ms, sampling "
                                           f"{SAMPLING_MS:g} ms, queue {QUEUE_SIZE}, on Status.Step: latency = wall "
                                           "time at the datachange callback - SourceTimestamp (wall time of the "
                                           "loop's publish of that step); lost_changes = missing notification "
                                           "sequence numbers + Step out of order/repeated + written "
                                           f"{WRITE_SIGNAL} values (held >= 12 ms) never delivered on Applied; "
                                           "steps_not_sampled = steps overwritten between two 1 ms samples"},
        "write_to_effect_periods": {**wte,
                                    "method": f"FC16 write of {WRITE_SIGNAL} every 12-20 ms (random phase); "
                                              "after the ack, busy-poll of the image header until "
                                              "H_IN_APPLIED_WRITES >= the write's H_IN_WRITES count; the loop "
                                              "took it inside the poll bracket (bracket_us wide), placed on the "
                                              "first loop deadline (t0 + k*period, from the loop's clock) in the "
                                              "bracket (placed_on_deadline of n; else the bracket's end); value "
                                              "= (that step start - ack) / period, 0 if before the ack; "
                                              "upper_bound_from_ack = bracket end - ack, no grid; "
                                              "from_image_write: from the server's H_IN_WRITE_NS"},
        "value_age_periods": age,
        "lateness_us": {"idle": lat_idle, "loaded": lat_loaded, "probes": probes["lateness"]},
        "misses_per_10k_loaded": lat_loaded["misses_per_10k"],
        "misses_per_10k_idle": lat_idle["misses_per_10k"],
        "load_achieved": loaded["load"],
        "server_cpu_fraction_loaded": loaded["server_cpu"],
        "goals": {
            "write_to_effect_p99_le_1_period": wte["p99"] is not None and wte["p99"] <= 1.0,
            "value_age_p99_le_1_period": age["p99"] is not None and age["p99"] <= 1.0,
            "value_age_p99_le_1_period_transport_inclusive": (age["transport_inclusive"]["p99"] is not None
                                                              and age["transport_inclusive"]["p99"] <= 1.0),
            "sub_latency_p99_le_interval_plus_3ms": sub["p99"] is not None and sub["p99"] <= sub["goal_p99_ms"],
            "no_lost_changes": sub["lost_changes"] == 0,
            "loaded_p99_le_100us": lat_loaded["p99"] <= 100.0,
            "loaded_p999_le_500us": lat_loaded["p999"] <= 500.0,
            "loaded_misses_le_5_per_10k": lat_loaded["misses_per_10k"] <= 5.0,
        },
        "sched": {"idle": idle["sched"], "probes": probes["sched"], "loaded": loaded["sched"]},
        "settings": {"duration_s": args.duration, "quick": args.quick, "rate_hz": 1000, "time_scale": TIME_SCALE,
                     "priority": PRIORITY, "cpu": cpu, "scenario": str(BASE.relative_to(ROOT)),
                     "security": "None (loopback)", "modbus_probe_reads": args.modbus_n,
                     "opcua_probe_reads": args.opcua_n, "writes": args.writes,
                     "load": {"modbus_clients": n_mb, "modbus_hz_each": mb_hz, "opcua_read_clients": n_ua,
                              "opcua_hz_each": ua_hz, "opcua_read_nodes": 100,
                              "subscriber_on_every_node": not args.no_loaded_subscriber}},
        "machine": {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "wall_time_s": round(time.monotonic() - t_start, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
