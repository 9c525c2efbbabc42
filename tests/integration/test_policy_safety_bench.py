"""benchmarks/bus_latency.py runs (--quick) and prints its JSON last; no speed is asserted."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bus_latency_benchmark_quick():
    out = subprocess.run([sys.executable, "benchmarks/bus_latency.py", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("raw_rtt_us", "raw_topology_rtt_us", "hil_rtt_us"):
        assert set(res[key]) >= {"p50", "p99", "p99.9"} and 0 < res[key]["p50"] <= res[key]["p99"] <= res[key]["p99.9"]
    assert res["ratio_vs_raw"] > 0 and res["ratio_vs_topology_p99"] > 0 and res["projection_us"] > 0
    assert res["auth"]["tag_us"] > 0 and set(res["goal_met"]) == {"ratio_vs_topology_p99", "hil_p99.9_us"}
    assert res["safety_decisions"] >= res["round_trips"]
    hops = res["hop_cpu_us"]  # each hop's CPU time, in process: present and positive
    assert all(hops[k]["p50"] > 0 for k in ("loop_publish", "policy_answer", "safety_decide", "loop_take"))
    assert res["auth"]["obs_decode_us"] > 0 and res["auth"]["action_bytes"] > 16
