"""`hil run` as a user runs it when something around the loop breaks: a protocol server
SIGKILLed mid-run, a stderr pipe nobody reads."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.net import wait_for
from tests.integration.test_run_cli import _free_port

ROOT = Path(__file__).resolve().parents[2]
HIL = [sys.executable, "-m", "hil.cli"]


def _listener_pid(port: int) -> int | None:
    for c in psutil.net_connections("tcp"):
        if c.status == "LISTEN" and c.laddr.port == port:
            return c.pid
    return None


@pytest.mark.parametrize("required", [True, False], ids=["required", "not-required"])
def test_modbus_server_killed_mid_run_alarms_and_exits_4(tmp_path, required):
    mb, ua = _free_port(), _free_port()
    proc = subprocess.Popen(
        HIL + ["run", "configs/bioreactor_plc.toml", "--duration", "100000" if required else "4500",
               "--json", "--no-record", "--set", f"modbus.port={mb}", "--set", f"opcua.port={ua}",
               "--set", "loop.status_interval_s=0.2", "--set", f"loop.require_servers={str(required).lower()}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        got: list = []

        def both_listen() -> bool:
            got[:] = [_listener_pid(mb) if _listener_pid(ua) else None]
            return got[0] is not None

        wait_for(both_listen, proc, "the servers never listened")
        pid = got[0]
        assert pid and pid != proc.pid, "the Modbus server never listened in its own process"
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["dead_processes"] == {"modbus server": "killed by SIGKILL"}
    assert [a["source"] for a in summary["alarms"] if a["kind"] == "process_died"] == ["modbus server"]
    status_lines = [line for line in err.splitlines() if line.startswith("t_sim")]
    assert any("ALARM modbus server process died (killed by SIGKILL)" in line for line in status_lines), err[-3000:]
    assert "alarm: modbus server process died" in err
    assert _listener_pid(ua) is None  # the OPC UA server was stopped with the run
    if required:
        assert proc.returncode == 4, err[-3000:]
        assert summary["exit_code"] == 4 and summary["state"] == "failed"
        assert summary["stop_reason"] == "process died" and summary["steps"] < 100000
        assert "modbus server process died (killed by SIGKILL)" in summary["error"]
    else:  # an alarm, and the run goes on to its duration
        assert proc.returncode == 0, err[-3000:]
        assert summary["exit_code"] == 0 and summary["steps"] == 4500


def test_full_stderr_pipe_does_not_stall_the_loop(tmp_path):
    """Nobody reads stderr; status lines every 1 ms fill the pipe within a second. The loop
    still runs to its duration: its recording is complete and its meta says so (written
    before the CLI prints the summary). Then the test drains stderr and the CLI exits 0."""
    rec = tmp_path / "rec"
    proc = subprocess.Popen(
        HIL + ["run", "configs/bioreactor.toml", "--duration", "1500", "--record", str(rec),
               "--set", "loop.time_scale=500", "--set", "loop.status_interval_s=0.001"],  # 2 ms period, 3 s
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        meta_path = rec / "_meta.json"
        deadline = time.monotonic() + 120
        meta = {}
        while time.monotonic() < deadline and meta.get("state") is None:
            assert proc.poll() is None, "the CLI exited while its stderr was full"
            time.sleep(0.2)
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                pass
        assert meta.get("state") == "stopped", "the loop never finished with a full stderr pipe"
        assert meta["summary"]["steps"] == 1500 and meta["summary"]["status_lines_dropped"] > 0
        _, err = proc.communicate(timeout=60)  # drain: now the CLI can print its summary and exit
        assert proc.returncode == 0, err[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
