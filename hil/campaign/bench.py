"""Latency benchmarks of a real Modbus TCP or OPC UA endpoint, at a bounded request rate.

    modbus_bench(host, port, unit=1, table="input", address=0, count=10, rate_hz=50, requests=500)
    opcua_bench(url, nodes=None, count=10, rate_hz=50, requests=500, publish_ms=100, subscribe_s=5)

Requests go out on absolute deadlines (t0 + i / rate_hz: never faster than rate_hz, never in
a burst after a slow answer: missed slots are skipped and counted), one at a time. Series
(wall seconds, one sample per request):

    Modbus: <name>.rtt_1      read of 1 register (the request round trip)
            <name>.read_N     read of `count` consecutive registers
    OPC UA: <name>.rtt_1      Read of one node's Value
            <name>.read_N     one Read of `count` nodes' Values
            <name>.sub_interval   intervals between data-change notifications of a subscription
            <name>.sub_delay  notification receipt - the value's SourceTimestamp (meaningful when
                              the server's clock is this host's, e.g. on loopback; a remote
                              device's clock offset is in it)

`to_profile(report, time_scale)` turns the report into a latency profile file
(hil/gaps/profile.py; samples in their order, x time_scale = simulated seconds) that a
scenario's `[gaps.latency.*] dist = "profile"` replays.
"""

from __future__ import annotations

import math
import time

import numpy as np


def _stats(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return {"n": 0}
    q = np.percentile(x, [50, 90, 99, 99.9])
    return {"n": int(x.size), "mean_ms": round(float(x.mean()) * 1e3, 4), "min_ms": round(float(x.min()) * 1e3, 4),
            "p50_ms": round(float(q[0]) * 1e3, 4), "p90_ms": round(float(q[1]) * 1e3, 4),
            "p99_ms": round(float(q[2]) * 1e3, 4), "p999_ms": round(float(q[3]) * 1e3, 4),
            "max_ms": round(float(x.max()) * 1e3, 4)}


class _Pacer:
    """Absolute deadlines at rate_hz; skipped slots counted."""

    def __init__(self, rate_hz: float):
        if not (rate_hz > 0 and math.isfinite(rate_hz)):
            raise ValueError(f"rate {rate_hz} Hz: must be > 0")
        self.period = 1.0 / rate_hz
        self.t0 = time.monotonic()
        self.k = 0
        self.skipped = 0

    def wait(self) -> None:
        self.k += 1
        now = time.monotonic()
        due = self.t0 + self.k * self.period
        if now > due + self.period:  # behind: skip ahead, never burst
            behind = int((now - due) / self.period)
            self.skipped += behind
            self.k += behind
            due = self.t0 + self.k * self.period
        if due > now:
            time.sleep(due - now)


def modbus_bench(host: str, port: int, *, unit: int = 1, table: str = "input", address: int = 0, count: int = 10,
                 rate_hz: float = 50.0, requests: int = 500, timeout_s: float = 1.0, name: str = "modbus") -> dict:
    """Measure round trips against a Modbus TCP server (FC4 input or FC3 holding registers)."""
    import logging

    from pymodbus.client import ModbusTcpClient

    if table not in ("input", "holding"):
        raise ValueError(f"table {table!r}: input or holding")
    if not 1 <= count <= 125:
        raise ValueError(f"count {count}: 1..125 registers per read")
    logging.getLogger("pymodbus").setLevel(logging.CRITICAL)
    client = ModbusTcpClient(host, port=port, timeout=timeout_s, retries=0)
    t = time.perf_counter()
    if not client.connect():
        raise ConnectionError(f"cannot connect to {host}:{port}")
    connect_s = time.perf_counter() - t
    fn = client.read_input_registers if table == "input" else client.read_holding_registers
    series = {"rtt_1": [], "read_N": []}
    errors = {"rtt_1": 0, "read_N": 0}
    last_error = ""
    pacer = _Pacer(rate_hz)
    t_start = time.monotonic()
    try:
        for i in range(requests):
            for key, n in (("rtt_1", 1), ("read_N", count)):
                pacer.wait()
                t = time.perf_counter()
                try:
                    rr = fn(address, count=n, device_id=unit)
                    ok = rr is not None and not rr.isError() and len(rr.registers) == n
                except Exception as exc:  # noqa: BLE001  (timeouts, resets: counted, the bench goes on)
                    ok, last_error = False, f"{type(exc).__name__}: {exc}"
                    client.close()
                    client.connect()
                dt = time.perf_counter() - t
                if ok:
                    series[key].append(dt)
                else:
                    errors[key] += 1
                    if rr is not None and not last_error:
                        last_error = str(rr)
    finally:
        client.close()
    wall = time.monotonic() - t_start
    return {"kind": "modbus", "name": name, "endpoint": f"{host}:{port}", "unit": unit, "table": table,
            "address": address, "count": count, "rate_hz": rate_hz, "requests": requests,
            "achieved_rate_hz": round((len(series["rtt_1"]) + len(series["read_N"]) + sum(errors.values())) / wall, 2),
            "skipped_slots": pacer.skipped, "connect_ms": round(connect_s * 1e3, 3), "errors": errors,
            "last_error": last_error, "stats": {k: _stats(v) for k, v in series.items()},
            "series_s": {k: v for k, v in series.items()}}


def opcua_bench(url: str, *, nodes: list[str] | None = None, count: int = 10, rate_hz: float = 50.0,
                requests: int = 500, publish_ms: float = 100.0, subscribe_s: float = 5.0,
                timeout_s: float = 2.0, name: str = "opcua") -> dict:
    """Measure Read round trips and subscription delivery against an OPC UA server."""
    import asyncio

    return asyncio.run(_opcua(url, nodes, count, rate_hz, requests, publish_ms, subscribe_s, timeout_s, name))


async def _find_variables(client, limit: int) -> list:
    """The first `limit` Variable nodes under Objects (depth first, the Server object skipped)."""
    from asyncua import ua

    out, stack = [], [client.nodes.objects]
    while stack and len(out) < limit:
        node = stack.pop()
        for child in await node.get_children():
            if child.nodeid == ua.NodeId(ua.ObjectIds.Server):
                continue
            cls = await child.read_node_class()
            if cls == ua.NodeClass.Variable:
                out.append(child)
                if len(out) >= limit:
                    break
            elif cls == ua.NodeClass.Object:
                stack.append(child)
    return out


async def _opcua(url, node_ids, count, rate_hz, requests, publish_ms, subscribe_s, timeout_s, name) -> dict:
    import asyncio
    import logging

    from asyncua import Client, ua

    logging.getLogger("asyncua").setLevel(logging.ERROR)
    client = Client(url, timeout=timeout_s)
    t = time.perf_counter()
    await client.connect()
    connect_s = time.perf_counter() - t
    try:
        if node_ids:
            nodes = [client.get_node(n) for n in node_ids]
        else:
            nodes = await _find_variables(client, count)
        if not nodes:
            raise ValueError("no Variable node found under Objects (give --node)")
        series = {"rtt_1": [], "read_N": [], "sub_interval": [], "sub_delay": []}
        errors = {"rtt_1": 0, "read_N": 0}
        period = 1.0 / rate_hz
        t0 = time.monotonic()
        k = skipped = 0
        for i in range(requests):
            for key, batch in (("rtt_1", nodes[:1]), ("read_N", nodes[:count])):
                k += 1
                due = t0 + k * period
                now = time.monotonic()
                if now > due + period:
                    behind = int((now - due) / period)
                    skipped += behind
                    k += behind
                    due = t0 + k * period
                if due > now:
                    await asyncio.sleep(due - now)
                t = time.perf_counter()
                try:
                    await client.read_values(batch)
                    series[key].append(time.perf_counter() - t)
                except Exception:  # noqa: BLE001
                    errors[key] += 1
        # subscription delivery
        got: list[tuple[float, float]] = []

        class Handler:
            def datachange_notification(self, node, val, data):
                now_wall = time.time()
                src = data.monitored_item.Value.SourceTimestamp or data.monitored_item.Value.ServerTimestamp
                got.append((time.monotonic(), now_wall - src.timestamp() if src is not None else math.nan))

        sub = await client.create_subscription(publish_ms, Handler())
        params = ua.CreateSubscriptionParameters()  # noqa: F841  (revised values are in sub.parameters)
        await sub.subscribe_data_change(nodes[:count], sampling_interval=publish_ms / 2)
        await asyncio.sleep(subscribe_s)
        await sub.delete()
        revised_ms = float(getattr(sub.parameters, "RequestedPublishingInterval", publish_ms))
        ts = np.array([g[0] for g in got])
        # notifications of one publish arrive together: intervals between distinct publishes
        if ts.size > 1:
            gaps = np.diff(np.unique(np.round(ts, 4)))
            series["sub_interval"] = [float(x) for x in gaps if x > 1e-3]
        series["sub_delay"] = [float(g[1]) for g in got if math.isfinite(g[1]) and g[1] >= 0]
    finally:
        await client.disconnect()
    return {"kind": "opcua", "name": name, "endpoint": url, "nodes": [n.nodeid.to_string() for n in nodes[:count]],
            "count": min(count, len(nodes)), "rate_hz": rate_hz, "requests": requests, "skipped_slots": skipped,
            "connect_ms": round(connect_s * 1e3, 3), "errors": errors, "publish_ms": publish_ms,
            "revised_publish_ms": revised_ms, "notifications": len(got),
            "stats": {k: _stats(v) for k, v in series.items()}, "series_s": series}


def to_profile(report: dict, time_scale: float = 1.0) -> dict:
    """The report's series as a latency profile (simulated s = measured wall s x time_scale)."""
    from hil.gaps.profile import make_profile, series_entry

    series = {}
    for key, values in report["series_s"].items():
        if len(values) == 0:
            continue
        series[f"{report['name']}.{key}"] = series_entry(np.asarray(values) * time_scale,
                                                         f"hil bench {report['kind']} {report['endpoint']}: {key}")
    return make_profile(series, f"hil bench {report['kind']} {report['endpoint']} (x{time_scale:g})")
