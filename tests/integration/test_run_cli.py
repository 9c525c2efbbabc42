"""`hil run` as a user runs it: JSON summary, and a recording that survives SIGKILL."""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
HIL = [sys.executable, "-m", "hil.cli"]


def test_run_prints_json_summary_last(tmp_path):
    out = subprocess.run(
        HIL + ["run", "configs/bioreactor.toml", "--duration", "10", "--json", "--record", str(tmp_path / "rec")],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("steps", "sim_time_s", "wall_time_s", "overruns", "lateness_us", "record_path"):
        assert key in summary
    assert summary["steps"] == 10 and summary["sim_time_s"] == 10.0
    assert set(summary["lateness_us"]) >= {"p50", "p99", "p999", "max"}
    df = pd.read_parquet(summary["record_path"])  # pandas reads the directory as it is
    assert len(df) == 10


def test_bad_config_exits_2_and_names_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "configs/bioreactor.toml").read_text().replace("step_s = 1.0", "step_s = -1.0"))
    out = subprocess.run(HIL + ["run", str(bad), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "loop.step_s" in out.stderr and "greater than 0" in out.stderr
    assert out.stdout == ""  # nothing started, no summary


def _start_long_run(tmp_path) -> tuple[subprocess.Popen, Path]:
    rec = tmp_path / "rec"
    proc = subprocess.Popen(
        HIL + ["run", "configs/bioreactor.toml", "--duration", "100000", "--quiet", "--record", str(rec),
               "--set", "loop.time_scale=500"],  # 2 ms period
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(list(rec.glob("part-*.parquet"))) < 3:
        time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read().decode()
    assert len(list(rec.glob("part-*.parquet"))) >= 3, "recorder wrote no parts"
    return proc, rec


def _last_row_age_s(rec: Path, killed_ns: int) -> float:
    df = pd.read_parquet(rec)  # must be readable as left on disk
    return (killed_ns - df["wall_ns"].max()) * 1e-9, df


@pytest.mark.parametrize("whole_group", [False, True], ids=["loop-only", "loop-and-recorder"])
def test_sigkill_loses_at_most_about_a_second(tmp_path, whole_group):
    proc, rec = _start_long_run(tmp_path)
    try:
        time.sleep(1.5)
        killed_ns = time.monotonic_ns()
        if whole_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        time.sleep(2.0)  # an orphaned recorder drains the ring and exits
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    age_s, df = _last_row_age_s(rec, killed_ns)
    assert df["step"].is_monotonic_increasing and df["step"].diff().dropna().eq(1).all()
    leftovers = glob.glob(f"/dev/shm/hil_{proc.pid}_*") + glob.glob(f"/dev/shm/hil_rec_{proc.pid}_*")
    if whole_group:
        # flush interval 1 s: whole parts only, the last one at most ~1 s (+ write time) old
        assert age_s < 1.6, age_s
        for path in leftovers:  # nobody survived to free the shared memory: do it here
            os.unlink(path)
    else:
        # the recorder outlives the loop, writes what the ring still held, frees the memory
        assert age_s < 0.1, age_s
        assert leftovers == [], leftovers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_servers_do_not_outlive_a_killed_loop(tmp_path):
    """SIGKILL of the loop: its Modbus and OPC UA server processes stop, nothing serves stale data."""
    import psutil

    mb, ua = _free_port(), _free_port()
    proc = subprocess.Popen(
        HIL + ["run", "configs/bioreactor_plc.toml", "--duration", "100000", "--quiet", "--no-record",
               "--set", f"modbus.port={mb}", "--set", f"opcua.port={ua}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        children = []
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()
            children = psutil.Process(proc.pid).children()
            listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == "LISTEN"}
            if {mb, ua} <= listening:
                break
            time.sleep(0.2)
        assert {mb, ua} <= listening and children, "servers never listened"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert alive == [], [p.cmdline() for p in alive]
        listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == "LISTEN"}
        assert not ({mb, ua} & listening)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for path in glob.glob(f"/dev/shm/hil_{proc.pid}_*"):
            os.unlink(path)
