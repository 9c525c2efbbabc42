"""Bus round trip: raw pyzmq through three processes vs hil's loop -> policy -> safety -> loop.

    python benchmarks/bus_latency.py [--quick] [--transport ipc|tcp] [--n 3000] [--policy demo|constant]

In one run, over the same transport:
- raw: this process PUSHes a msgpack observation to process B, B to C, C back here (PULL);
  each hop unpacks and packs, no checks: the floor of three Python hops;
- hil: this process is the loop (LoopBusEndpoint.after_step / before_step in lockstep), the
  policy process (`python -m hil.policy.runner`, the demo ensemble by default) and the safety
  process (`python -m hil.safety.wrapper`, mode full: projection, fallback PID, confidence
  gate, monitor, KPIs) are the real ones, with schema checks on every message;
- projection_us: Projector.project per call on the scenario's envelope (box, rate, linear
  limit), for a proposal that is clipped (the costlier path: the clip reasons are built).
Round trips are sequential (one message in flight), timed here with perf_counter_ns.
Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HOP = r"""
import sys, zmq, msgpack
ctx = zmq.Context()
pull = ctx.socket(zmq.PULL); pull.connect(sys.argv[1])
push = ctx.socket(zmq.PUSH); push.connect(sys.argv[2])
while True:
    m = msgpack.unpackb(pull.recv())
    if m.get("stop"):
        push.send(msgpack.packb(m)); break
    push.send(msgpack.packb(m))
"""


def constant_policy(x):
    """A policy that costs nothing: isolates the bus and the safety logic."""
    return np.array([0.0003, 13.0])


def _pct(v: np.ndarray) -> dict:
    return {"p50": round(float(np.percentile(v, 50)), 1), "p99": round(float(np.percentile(v, 99)), 1),
            "mean": round(float(v.mean()), 1), "max": round(float(v.max()), 1)}


def _addrs(transport: str, tmp: str, names) -> dict:
    if transport == "ipc":
        return {n: f"ipc://{tmp}/{n}" for n in names}
    import socket

    out, socks = {}, []
    for n in names:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        out[n] = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    for s in socks:
        s.close()
    return out


def raw_rtt(transport: str, tmp: str, n: int, warmup: int, n_out: int, n_in: int) -> np.ndarray:
    import msgpack
    import zmq

    a = _addrs(transport, tmp, ("ab", "bc", "ca"))
    ctx = zmq.Context()
    out = ctx.socket(zmq.PUSH)
    out.bind(a["ab"])
    back = ctx.socket(zmq.PULL)
    back.bind(a["ca"])
    b = subprocess.Popen([sys.executable, "-c", HOP, a["ab"], a["bc"]])
    # B connects its PUSH to a["bc"], so C binds its PULL there
    c_code = HOP.replace("pull.connect(sys.argv[1])", "pull.bind(sys.argv[1])")
    c = subprocess.Popen([sys.executable, "-c", c_code, a["bc"], a["ca"]])
    y, u = np.linspace(1, 2, n_out), np.linspace(0, 1, n_in)
    times = []
    try:
        time.sleep(0.5)
        for k in range(n + warmup):
            t0 = time.perf_counter_ns()
            out.send(msgpack.packb({"v": 1, "kind": "obs", "sid": 1, "seq": k + 1, "step": k, "t_s": float(k),
                                    "wall_ns": time.time_ns(),
                                    "payload": {"y": y.tolist(), "u": u.tolist(), "lockstep": True}}))
            m = msgpack.unpackb(back.recv())
            t1 = time.perf_counter_ns()
            assert m["step"] == k
            if k >= warmup:
                times.append((t1 - t0) / 1e3)
        out.send(msgpack.packb({"stop": True}))
        back.poll(2000)
    finally:
        for p in (b, c):
            try:
                p.wait(3)
            except subprocess.TimeoutExpired:
                p.kill()
        out.close(0)
        back.close(0)
        ctx.term()
    return np.array(times)


def _scenario(transport: str, tmp: str, policy: str, spin_us: float | None = None):
    from hil.config import parse_scenario

    data = tomllib.loads((ROOT / "configs" / "bioreactor_policy.toml").read_text())
    data["policy"]["directory"] = str(ROOT / "policies" / "bioreactor")
    if policy == "constant":
        data["policy"] = {"entry": "benchmarks.bus_latency:constant_policy",
                          "features": ["dissolved_oxygen"]}
    names = ("obs_policy", "obs_safety", "proposal", "action", "command", "advice", "control")
    data["bus"]["endpoints"] = _addrs(transport, tmp, names)
    if spin_us is not None:
        data["bus"]["spin_us"] = spin_us
    data["safety"]["mode"] = "full"
    data["safety"]["rollout"]["auto_promote"] = False
    data["safety"]["decision_log"] = os.path.join(tmp, "decisions.jsonl")
    return parse_scenario(data)


def hil_rtt(transport: str, tmp: str, n: int, warmup: int, policy: str,
            spin_us: float | None = None) -> tuple[np.ndarray, dict]:
    from hil.bus import LoopBusEndpoint
    from hil.safety import launch
    from plants.base import load_plant_module

    sc = _scenario(transport, tmp, policy, spin_us)
    spec = load_plant_module("bioreactor").SPEC
    ep = LoopBusEndpoint.build(sc.bus, sc, spec)
    handles = launch.start(sc, str(ROOT / "configs" / "bioreactor_policy.toml"), log_dir=tmp)
    y, u = spec.nominal("outputs"), spec.nominal("inputs")
    y[spec.index("outputs", "dissolved_oxygen")] = 40.0
    u[spec.index("inputs", "agitation_power")] = 13.0
    u_cmd = u.copy()
    times = []
    try:
        ep.before_step(0, 0.0, u_cmd, True)
        cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
        for k in range(n + warmup):
            t0 = time.perf_counter_ns()
            ep.after_step(k, k + 1.0, y, u)
            ep.before_step(k + 1, k + 1.0, u_cmd, True)
            t1 = time.perf_counter_ns()
            if k >= warmup:
                times.append((t1 - t0) / 1e3)
        counters = ep.counters()
        counters["loop_cpu_pct"] = 100.0 * (time.thread_time_ns() - cpu0) / (time.perf_counter_ns() - wall0)
    finally:
        launch.stop(handles)
        ep.close()
    if counters["lockstep_timeouts"] or counters["actions_applied"] != n + warmup:
        raise RuntimeError(f"hil chain did not answer every observation: {counters}")
    return np.array(times), counters


def projection_cost(n: int) -> dict:
    from hil.safety.projection import Projector
    from plants.base import load_plant_module

    sc = _scenario("ipc", tempfile.gettempdir(), "demo")
    spec = load_plant_module("bioreactor").SPEC
    p = Projector(sc.safety.projection, spec, ["base_flow", "agitation_power"])
    y, u = spec.nominal("outputs"), spec.nominal("inputs")
    prev = np.array([0.0003, 13.0])
    out = {}
    for label, a in (("clipped", np.array([0.02, 95.0])), ("inside", np.array([0.0003, 13.5]))):
        p.project(a, prev, 1.0, y, u)
        per = []
        for _ in range(20):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                p.project(a, prev, 1.0, y, u)
            per.append((time.perf_counter_ns() - t0) / n / 1e3)
        out[label] = float(np.median(per))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few round trips (smoke test)")
    ap.add_argument("--transport", choices=("ipc", "tcp"), default="ipc")
    ap.add_argument("--n", type=int, default=3000, help="timed round trips per path")
    ap.add_argument("--policy", choices=("demo", "constant"), default="demo")
    ap.add_argument("--spin-us", type=float, default=None,
                    help="[bus].spin_us for the loop's wait (default: the config's)")
    args = ap.parse_args(argv)
    n, warmup = (200, 50) if args.quick else (args.n, 300)
    tmp = tempfile.mkdtemp(prefix="hbb", dir="/tmp")
    try:
        from plants.base import load_plant_module

        spec = load_plant_module("bioreactor").SPEC
        raw = raw_rtt(args.transport, tmp, n, warmup, spec.n_outputs, spec.n_inputs)
        hil, counters = hil_rtt(args.transport, tmp, n, warmup, args.policy, args.spin_us)
        proj = projection_cost(200 if args.quick else 2000)
        status = json.loads(Path(tmp, "safety-status.json").read_text())
        sc_spin = _scenario(args.transport, tmp, args.policy, args.spin_us).bus.spin_us
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    raw_p, hil_p = _pct(raw), _pct(hil)
    result = {
        "benchmark": "bus_latency",
        "transport": args.transport,
        "policy": args.policy,
        "round_trips": int(n),
        "raw_rtt_us": raw_p,
        "hil_rtt_us": hil_p,
        "ratio_vs_raw": round(hil_p["p50"] / raw_p["p50"], 2),
        "ratio_vs_raw_p99": round(hil_p["p99"] / raw_p["p99"], 2),
        "projection_us": round(proj["clipped"], 2),
        "projection_inside_us": round(proj["inside"], 2),
        "safety_decisions": status["counters"]["decisions"],
        "loop_spin_us": sc_spin,
        "loop_cpu_pct": round(counters["loop_cpu_pct"], 1),
        "goal": {"ratio_vs_raw": 1.5, "hil_p99_us": 400, "projection_us": 20},
        "cpus": os.cpu_count(),
    }
    print(f"raw  p50 {raw_p['p50']:8.1f} us  p99 {raw_p['p99']:8.1f} us", file=sys.stderr)
    print(f"hil  p50 {hil_p['p50']:8.1f} us  p99 {hil_p['p99']:8.1f} us", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
