"""Shared pieces of the Modbus / SoftPLC tests: a small plant, a scenario, processes.

The plant `mbtank` (registered as `plants.mbtank` on import, so the config loader and the
server process find it) is two first-order lags, exactly discretized (time unit: s):

    level'       = (gain_level * inflow - level) / tau_level        (%)
    temperature' = (t_hot - gain_cool * coolant - temperature) / tau_temp   (K)
    high_level   = 1 if level >= 80 else 0
    pump_running = pump

Steady state: level = 5 * inflow, temperature = 330 - 2 * coolant (nominal parameters),
so a level setpoint of 50 % needs inflow 10 L/min and 310 K needs coolant 10 L/min.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import sys
import time
from contextlib import contextmanager

import numpy as np

from plants.spec import PlantSpec, Quantity
from tests.integration.net import free_port

Q = Quantity
SPEC = PlantSpec(
    name="mbtank",
    states=(Q("level", "%", 0.0, 0.0, 100.0), Q("temperature", "K", 330.0, 250.0, 400.0)),
    inputs=(
        Q("inflow", "L/min", 0.0, 0.0, 20.0, "feed pump flow"),
        Q("coolant", "L/min", 0.0, 0.0, 50.0, "cooling water flow"),
        Q("pump", "1", 0.0, 0.0, 1.0, "auxiliary pump on/off"),
        Q("valve", "%", 0.0, 0.0, 100.0, "a valve the policy drives (driver bus)"),
        Q("trim", "1", 0.0, -1.0, 1.0, "signed trim"),
    ),
    outputs=(
        Q("level", "%", 0.0, 0.0, 100.0, "tank level"),
        Q("temperature", "K", 330.0, 250.0, 400.0, "tank temperature"),
        Q("high_level", "1", 0.0, 0.0, 1.0, "level switch"),
        Q("pump_running", "1", 0.0, 0.0, 1.0, "pump feedback"),
        Q("flow_total", "L", 0.0, -1e6, 1e6, "a large signed signal"),
    ),
    params=(
        Q("gain_level", "%/(L/min)", 5.0, 1.0, 10.0),
        Q("tau_level", "s", 2.0, 0.1, 100.0),
        Q("t_hot", "K", 330.0, 300.0, 360.0),
        Q("gain_cool", "K/(L/min)", 2.0, 0.5, 5.0),
        Q("tau_temp", "s", 3.0, 0.1, 100.0),
    ),
)
DEFAULT_SUBSTEPS = 1
MAX_SUBSTEP = math.inf  # s; `step` is exact (two first-order lags): any sub-step is stable


def derivatives(t, x, u, p, dxdt):
    dxdt[0] = (p[0] * u[0] - x[0]) / p[1]
    dxdt[1] = (p[2] - p[3] * u[1] - x[1]) / p[4]


def outputs(x, u, p, y):
    y[0] = x[0]
    y[1] = x[1]
    y[2] = 1.0 if x[0] >= 80.0 else 0.0
    y[3] = u[2]
    y[4] = 0.0


def step(t, x, u, p, dt, n_sub, work):
    """Exact step of both lags with u held over dt (s)."""
    x[0] = p[0] * u[0] + (x[0] - p[0] * u[0]) * math.exp(-dt / p[1])
    x[1] = (p[2] - p[3] * u[1]) + (x[1] - (p[2] - p[3] * u[1])) * math.exp(-dt / p[4])
    return t + dt


def run_batch(t, X, U, P, dt, n_sub, n_steps):
    for i in range(X.shape[0]):
        tt = t
        for _ in range(n_steps):
            tt = step(tt, X[i], U[i], P[i], dt, n_sub, None)
    return t + n_steps * dt


sys.modules.setdefault("plants.mbtank", sys.modules[__name__])


# ---------------------------------------------------------------------------- scenario

MAP = [
    # sensors
    {"signal": "level", "table": "input_register", "address": 0, "encoding": "float32"},
    {"signal": "temperature", "table": "input_register", "address": 2, "encoding": "float32",
     "word_order": "little"},
    {"signal": "level", "table": "input_register", "address": 10, "encoding": "int16", "scale": 100.0},
    {"signal": "temperature", "table": "input_register", "address": 11, "encoding": "uint16",
     "scale": 10.0},
    {"signal": "flow_total", "table": "input_register", "address": 12, "encoding": "int32",
     "scale": 100.0},
    {"signal": "temperature", "table": "input_register", "address": 14, "encoding": "float64"},
    {"signal": "level", "table": "holding_register", "address": 100, "encoding": "float32"},
    {"signal": "high_level", "table": "discrete_input", "address": 0},
    {"signal": "pump_running", "table": "discrete_input", "address": 1},
    # actuators (driver plc -> writable)
    {"signal": "inflow", "table": "holding_register", "address": 0, "encoding": "float32"},
    {"signal": "coolant", "table": "holding_register", "address": 2, "encoding": "float32"},
    {"signal": "inflow", "table": "holding_register", "address": 4, "encoding": "uint16",
     "scale": 100.0},
    {"signal": "trim", "table": "holding_register", "address": 5, "encoding": "int16",
     "scale": 10000.0},
    {"signal": "coolant", "table": "holding_register", "address": 6, "encoding": "float32",
     "byte_order": "little"},
    {"signal": "pump", "table": "coil", "address": 0},
    # read-only views of actuators
    {"signal": "valve", "table": "holding_register", "address": 20, "encoding": "float32"},
    {"signal": "inflow", "table": "input_register", "address": 20, "encoding": "float32",
     "source": "applied"},
]


def scenario_dict(port: int, *, softplc: dict | None = None, modbus: dict | None = None,
                  time_scale: float = 1.0) -> dict:
    data = {
        "scenario": {"name": "mbtank"},
        "plant": {"model": "mbtank"},
        "loop": {"step_s": 0.02, "time_scale": time_scale, "duration_s": 3600.0},
        "inputs": {"valve": {"driver": "bus", "value": 0.0}},
        "recording": {"enabled": False},
        "modbus": {"host": "127.0.0.1", "port": port, "unit_id": 1, "map": MAP, **(modbus or {})},
    }
    if softplc is not None:
        data["softplc"] = softplc
    return data


def scenario(port: int, **kw):
    from hil.scenario.config import parse_scenario

    return parse_scenario(scenario_dict(port, **kw))


# ---------------------------------------------------------------------------- processes


def publisher_main(image_name: str, period_s: float, stop, time_scale: float = 1.0) -> None:
    """A minimal loop: read inputs, step `mbtank`, publish, on absolute deadlines."""
    from hil.image import ProcessImage

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    img = ProcessImage.attach(image_name)
    x = SPEC.nominal("states")
    p = SPEC.nominal("params")
    u = np.zeros(SPEC.n_inputs)
    y = np.zeros(SPEC.n_outputs)
    t, k = 0.0, 0
    t0 = time.monotonic()
    try:
        while not stop.is_set():
            img.read_inputs_into(u)
            u_app = np.clip(np.nan_to_num(u), SPEC.lows("inputs"), SPEC.highs("inputs"))
            t = step(t, x, u_app, p, period_s * time_scale, 1, None)
            outputs(x, u_app, p, y)
            k += 1
            img.publish(y, u_app, k, t)
            delay = t0 + k * period_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                t0 -= delay  # overrun: skip ahead, never burst
    finally:
        img.close()


def server_main(sc, image_name, ready, stop, log_path=None, stats_path=None):
    from adapters.modbus import serve_forever

    serve_forever(sc, image_name, ready, stop, request_log_path=log_path, stats_path=stats_path)


class Rig:
    """A process image, optionally a publisher process and a server process."""

    def __init__(self, sc, image):
        self.sc, self.image = sc, image
        self.ctx = mp.get_context("spawn")
        self.procs: list = []
        self.server = None
        self.server_stop = None

    @property
    def port(self) -> int:
        return self.sc.modbus.port

    def start_publisher(self, period_s: float = 0.01, time_scale: float = 1.0):
        stop = self.ctx.Event()
        p = self.ctx.Process(target=publisher_main, args=(self.image.name, period_s, stop, time_scale),
                             daemon=True)
        p.start()
        self.procs.append((p, stop))
        return p

    def start_server(self, log_path=None, stats_path=None, timeout_s: float | None = None):
        ready, stop = self.ctx.Event(), self.ctx.Event()
        p = self.ctx.Process(target=server_main, args=(self.sc, self.image.name, ready, stop,
                                                       log_path, stats_path), daemon=True)
        p.start()
        self.procs.append((p, stop))
        from hil import readiness  # by handshake: as long as it lives and makes progress

        why = readiness.wait_ready(ready.is_set, [p.pid], p.is_alive, wait=ready.wait, poll_s=0.1,
                                   max_s=readiness.MAX_S if timeout_s is None else timeout_s)
        if why is not None:
            raise RuntimeError(f"modbus server did not start: {why} (exit code {p.exitcode})")
        self.server, self.server_stop = p, stop
        return p

    def stop_server(self, graceful: bool = True, timeout_s: float = 10.0) -> int | None:
        p = self.server
        if graceful:
            self.server_stop.set()
        else:
            os.kill(p.pid, signal.SIGKILL)
        p.join(timeout_s)
        if p.is_alive():
            p.kill()
            p.join(5)
        self.server = None
        return p.exitcode

    def close(self) -> None:
        for p, stop in self.procs:
            stop.set()
        for p, _ in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        self.image.close()


@contextmanager
def rig(port: int | None = None, publisher: bool = True, server: bool = True, time_scale: float = 1.0, **kw):
    from hil.image import ProcessImage

    sc = scenario(port or free_port(), **kw)
    image = ProcessImage.create(SPEC.n_inputs, SPEC.n_outputs)
    r = Rig(sc, image)
    try:
        # as the loop's initial publish (the server answers 06, busy, before any)
        image.publish(np.zeros(SPEC.n_outputs), np.zeros(SPEC.n_inputs), 0, 0.0)
        if publisher:
            r.start_publisher(time_scale=time_scale)
        if server:
            r.start_server()
        yield r
    finally:
        r.close()


def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.02):
    """Poll until predicate() is truthy; returns its value or raises TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached in time")
        time.sleep(interval_s)


def to_toml(data: dict) -> str:
    """A scenario dict as TOML (sections as tables, nested values inline)."""
    import json

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(float(v)) if isinstance(v, float) else str(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return "[" + ", ".join(value(x) for x in v) + "]"

    out = []
    for section, body in data.items():
        out.append(f"[{section}]")
        out += [f"{k} = {value(v)}" for k, v in body.items()]
        out.append("")
    return "\n".join(out)
