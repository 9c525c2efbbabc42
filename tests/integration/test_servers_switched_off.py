"""`[opcua] enabled = false` / `[modbus] enabled = false` (in the scenario or with --set): a
real `hil run` binds nothing for that section, its port is not even checked, and the
banner says the section is switched off."""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from tests.integration.net import free_port, listening

ROOT = Path(__file__).resolve().parents[2]
HIL = [sys.executable, "-m", "hil.cli"]
pytestmark = pytest.mark.timeout(180)


def _session_listens(sid: int) -> set[int]:
    """TCP ports any process of session `sid` (the hil run and its children) listens on."""
    ports = set()
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) != sid:
                continue
            ports |= {c.laddr.port for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return ports


def _loop_stepping(pid: int) -> bool:
    """True once the run's loop has published a step (every server it starts is up by then)."""
    from hil.image import ProcessImage

    for path in glob.glob(f"/dev/shm/hil_{pid}_*"):
        try:
            img = ProcessImage.attach(os.path.basename(path))
        except (OSError, ValueError):
            continue
        try:
            return img.counters()["step"] > 0
        finally:
            img.close()
    return False


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2.0)
        return s.connect_ex(("127.0.0.1", port)) != 0


def _stop(proc) -> tuple[str, str]:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGINT)  # the loop only: it stops its children itself
    try:
        return proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()


def test_opcua_switched_off_on_the_command_line_binds_nothing():
    mb, ua = free_port(), free_port()
    proc = subprocess.Popen(
        HIL + ["run", "configs/bioreactor_plc.toml", "--duration", "100000", "--json", "--quiet", "--no-record",
               "--set", f"modbus.port={mb}", "--set", f"opcua.port={ua}", "--set", "opcua.enabled=false"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not _loop_stepping(proc.pid):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        assert _loop_stepping(proc.pid), "the loop never stepped"
        # the loop steps (the servers it starts are up before): Modbus listens, OPC UA never started
        assert listening(mb)
        assert _refused(ua)
        assert _session_listens(proc.pid) == {mb}
    finally:
        out, err = _stop(proc)
    summary = json.loads(out.strip().splitlines()[-1])
    assert "opcua" not in summary and summary["modbus"]["connections"] >= 1
    assert f"servers: modbus 127.0.0.1:{mb}" in err and "opcua 127.0.0.1" not in err, err[-3000:]
    assert "opcua: switched off ([opcua] enabled = false)" in err, err[-3000:]


def test_both_switched_off_in_the_scenario_bind_nothing_and_their_ports_are_not_checked(tmp_path):
    """[opcua] enabled = false in the file, [modbus] by --set; the Modbus port is even taken."""
    text = (ROOT / "configs/bioreactor_plc.toml").read_text()
    assert "\n[opcua]\n" in text
    scenario = tmp_path / "plc_off.toml"
    scenario.write_text(text.replace("\n[opcua]\n", "\n[opcua]\nenabled = false\n"))
    ua = free_port()
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()  # a port in use makes a run exit 2 if it is checked (tests/integration/test_run_cli.py)
    mb = holder.getsockname()[1]
    seen: set[int] = set()
    proc = subprocess.Popen(
        HIL + ["run", str(scenario), "--duration", "1200", "--json", "--quiet", "--no-record",  # 4 s wall
               "--set", f"modbus.port={mb}", "--set", f"opcua.port={ua}", "--set", "modbus.enabled=false"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        refused = True
        while proc.poll() is None:  # the whole run, servers would start before its first step
            seen |= _session_listens(proc.pid)
            refused = refused and _refused(ua)
            time.sleep(0.1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            out, err = _stop(proc)
        holder.close()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 1200 and "modbus" not in summary and "opcua" not in summary
    assert seen == set() and refused
    assert "servers:" not in err
    for kind in ("modbus", "opcua"):
        assert f"{kind}: switched off ([{kind}] enabled = false)" in err, err[-3000:]
