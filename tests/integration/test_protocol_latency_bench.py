"""Smoke test of benchmarks/protocol_latency.py: a --quick run prints the figures as JSON.

Timing is never asserted here (the machine is shared); only that every figure the issue
asks for is present and numeric, and that no client process ran at real-time priority.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks/protocol_latency.py"

REQUIRED = [
    ("modbus_read100_us", "hil", "p50"), ("modbus_read100_us", "hil", "p99"),
    ("modbus_read100_us", "plain", "p50"), ("modbus_read100_us", "plain", "p99"),
    ("ratio_p50_vs_plain",),
    ("opcua_read_us", "single", "p50"), ("opcua_read_us", "single", "p99"),
    ("opcua_read_us", "batch100", "p50"), ("opcua_read_us", "batch100", "p99"),
    ("opcua_sub_latency_ms", "p50"), ("opcua_sub_latency_ms", "p99"), ("opcua_sub_latency_ms", "lost_changes"),
    ("write_to_effect_periods", "p50"), ("write_to_effect_periods", "p99"), ("write_to_effect_periods", "max"),
    ("value_age_periods", "p50"), ("value_age_periods", "p99"), ("value_age_periods", "max"),
    ("value_age_periods", "transport_inclusive", "p99"), ("value_age_periods", "at_decode", "p99"),
    ("server_cpu_fraction_loaded", "modbus"), ("server_cpu_fraction_loaded", "opcua"),
    ("lateness_us", "idle", "p99"), ("lateness_us", "idle", "p999"),
    ("lateness_us", "loaded", "p99"), ("lateness_us", "loaded", "p999"),
    ("misses_per_10k_loaded",),
    ("load_achieved", "modbus_requests_per_s_served"),
    ("load_achieved", "opcua_reads_per_s", "requests_per_s"),
]


def _get(d: dict, path: tuple):
    for key in path:
        assert isinstance(d, dict) and key in d, f"missing {'.'.join(path)}"
        d = d[key]
    return d


@pytest.mark.timeout(300)
def test_quick_run_prints_every_figure():
    out = subprocess.run([sys.executable, str(BENCH), "--quick"], cwd=ROOT, capture_output=True, text=True,
                         timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for path in REQUIRED:
        v = _get(result, path)
        assert isinstance(v, (int, float)) and not isinstance(v, bool), f"{'.'.join(path)} = {v!r}"
        assert math.isfinite(v), f"{'.'.join(path)} = {v!r}"
    assert result["settings"]["quick"] is True
    # every sample the figures claim was taken
    assert result["write_to_effect_periods"]["n"] == result["settings"]["writes"]
    assert result["modbus_read100_us"]["hil"]["n"] == result["settings"]["modbus_probe_reads"]
    # clients never inherit real-time scheduling; the server processes drop it too
    load = result["load_achieved"]
    assert load["modbus"]["client_policies"] == ["SCHED_OTHER"]
    assert load["opcua_reads_per_s"]["client_policies"] == ["SCHED_OTHER"]
    for phase in result["sched"].values():
        servers = [v for k, v in phase.items() if k.startswith("server:")]
        assert len(servers) >= 2 and all(s["policy"] == "SCHED_OTHER" for s in servers), phase
