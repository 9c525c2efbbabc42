"""`hil demo`: loop + Modbus/OPC UA servers + SoftPLC in closed loop, then a plot."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
from tests.integration.net import free_port as _free_port

ROOT = Path(__file__).resolve().parents[2]


def test_demo_closes_the_loop_and_leaves_a_plot(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "hil.cli", "demo", "--wall", "8", "--out", str(tmp_path), "--json",
         "--set", f"modbus.port={_free_port()}", "--set", f"opcua.port={_free_port()}"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    url = summary["dashboard_url"]  # the live dashboard beside the demo, its URL printed first
    assert url.startswith("http://127.0.0.1:") and f"dashboard: {url}" in out.stderr
    png = Path(summary["plot_path"])
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plc = summary["softplc"]
    assert plc["scans"] >= 40 and plc["comm_losses"] == 0  # 8 s at 100 ms
    assert summary["input_writes"] >= plc["scans"]  # the PLC wrote every scan, over Modbus
    df = pd.read_parquet(summary["record_path"])
    # the PLC, not the scenario, moved the actuators: agitation leaves its nominal 30 W
    # as the DO loop acts, and the coolant loop opens the valve against reaction heat
    assert df["app.agitation_power"].iloc[-1] < 25.0
    assert df["app.coolant_flow"].max() > 0.0
    scan_log = pd.read_csv(plc["record_path"])
    assert {"sp.do", "pv.do", "out.do"} <= set(scan_log.columns)
    # the Modbus server logged every request of the PLC into the recording: `hil profile`
    # turns it into a latency profile (PLC scan intervals, write-to-effect delays)
    prof = subprocess.run([sys.executable, "-m", "hil.cli", "profile", summary["record_path"], "-o",
                           str(tmp_path / "profile.json"), "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert prof.returncode == 0, prof.stderr[-2000:]
    series = json.loads(prof.stdout.strip().splitlines()[-1])["series"]
    reads = [v for k, v in series.items() if k.endswith(".read_interval")]
    assert len(reads) == 1 and reads[0]["n"] >= plc["scans"] - 5, (reads, plc)  # one connection, a read per scan
    assert any(k.endswith("write_to_effect") for k in series), sorted(series)
