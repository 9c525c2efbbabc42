"""configs/grid118.toml: a lockstep run records the grid per element and shows a protection
trip; a short real-time run serves the grid over real sockets (Modbus blocks, OPC UA folders)
to clients and to the SoftPLC (AGC loop + load-shedding rules, 100 ms scan with jitter)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from asyncua import Client, ua
from pymodbus.client import ModbusTcpClient

from hil.scenario.config import load_scenario
from hil.recorder import read_recording
from hil.softplc.scan import SoftPlc
from tests.integration.net import free_port as _free_port, listening as _listening, wait_for

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "grid118.toml"
pytestmark = pytest.mark.timeout(240)


def test_lockstep_records_per_element_and_a_protection_trip(tmp_path):
    """Unit 40 (607 MW) trips at t = 5 s: a line goes above its rating, protection opens it after
    the allowed overflow steps (nobody commanded it), the cascade is in the recording."""
    proc = subprocess.run(
        [sys.executable, "-m", "hil.cli", "run", str(CONFIG), "--lockstep", "--duration", "12", "--json", "--quiet",
         "--record", str(tmp_path / "rec"), "--set", 'inputs.gen_40.on.driver="profile"',
         "--set", "inputs.gen_40.on.profile=[[0.0, 1.0], [5.0, 0.0]]"],
        cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = read_recording(json.loads(proc.stdout.strip().splitlines()[-1])["record_path"])
    assert len(df) == 12
    for prefix, suffix, n in (("y.bus_", ".vm", 118), ("y.line_", ".loading", 186), ("y.line_", ".closed", 186),
                              ("meas.line_", ".p_mw", 186), ("app.gen_", ".p_set", 54), ("z.bus_", ".vm_state", 118),
                              ("d.line_", ".overflow_steps", 186), ("x.line_", ".temp_state", 186)):
        cols = [c for c in df.columns if c.startswith(prefix) and c.endswith(suffix)]
        assert len(cols) == n, (prefix, suffix, len(cols))
    assert (df["app.gen_40.on"].to_numpy() == [1.0] * 5 + [0.0] * 7).all()
    before = df[df["t_s"] <= 5.0]
    assert (before["y.grid.tripped"] == 0).all() and (before[[f"y.line_{k}.closed" for k in range(1, 187)]] == 1).all().all()
    # a line that protection opened: above 100 % first, overflow counted, opened without a command
    opened = [k for k in range(1, 187) if df[f"y.line_{k}.closed"].iloc[-1] == 0]
    assert opened
    timed = [k for k in opened if (df[f"d.line_{k}.overflow_steps"] > 0).any()]
    assert timed, "no trip after counted overflow steps"
    k = timed[0]
    first_open = int(np.argmax(df[f"y.line_{k}.closed"].to_numpy() == 0))
    assert df[f"y.line_{k}.loading"].iloc[first_open - 1] > 100.0
    assert (df[f"app.line_{k}.open_cmd"] == 0).all()
    assert df["y.grid.tripped"].sum() >= len(opened) - 1
    assert np.isfinite(df.filter(regex=r"^y\.").to_numpy()).all()      # collapse or not: never NaN


def _scenario(tmp_path: Path, mb: int, uap: int) -> Path:
    text = CONFIG.read_text()
    text = text.replace('case = "grids/case118.m"', f'case = "{ROOT / "configs/grids/case118.m"}"')
    text = text.replace("below = 49.7", "below = 50.5")          # UFLS stage 1 picks up at once
    text = re.sub(r'record = ".*softplc.csv"', f'record = "{tmp_path / "plc.csv"}"', text)
    text = text.replace("[[0.0, 1.0], [60.0, 1.2]]", "[[0.0, 1.0], [20.0, 1.2]]")
    text = text.replace("[[0.0, 1.0], [60.0, 1.3]]", "[[0.0, 1.0], [20.0, 1.3]]")
    path = tmp_path / "grid118.toml"
    path.write_text(text)
    return path


async def _opcua(port: int) -> dict:
    async with Client(f"opc.tcp://127.0.0.1:{port}/hil", timeout=30) as c:
        idx = await c.get_namespace_index("urn:hil:grid118")
        folder = await c.nodes.objects.get_child([f"{idx}:grid118", f"{idx}:Sensors", f"{idx}:line_closed"])
        children = await folder.get_children()
        first = children[0]
        vtype = await first.read_data_type_as_variant_type()
        closed = [await n.read_value() for n in children[:5]]
        vm = c.get_node(ua.NodeId("grid118.Sensors.bus_12.vm", idx))
        vm12 = await vm.read_value()
        eu = await (await vm.get_child("0:EURange")).read_value()
        sp = c.get_node(ua.NodeId("grid118.Actuators.gen_5.p_set", idx))
        await sp.write_value(ua.DataValue(ua.Variant(430.0, ua.VariantType.Double)))
        return {"n": len(children), "vtype": vtype, "closed": closed, "vm12": vm12, "eu": (eu.Low, eu.High)}


def test_servers_and_softplc_over_real_sockets(tmp_path):
    mb, uap = _free_port(), _free_port()
    path = _scenario(tmp_path, mb, uap)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hil.cli", "run", str(path), "--json", "--quiet", "--wall", "120",
         "--record", str(tmp_path / "rec"), "--set", f"modbus.port={mb}", "--set", f"opcua.port={uap}",
         "--set", "iec104.enabled=false",   # tests/integration/test_iec104_grid.py serves it
         "--set", "loop.time_scale=10.0", "--set", "loop.priority=0", "--set", "loop.cpu=-1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stop = threading.Event()
    plc_stats: dict = {}
    try:
        wait_for(lambda: _listening(mb) and _listening(uap), proc, "servers never listened", poll_s=0.3)
        sc = load_scenario(path)
        plc = SoftPlc(sc, port=mb)
        th = threading.Thread(target=lambda: plc_stats.update(plc.run(None, stop)), daemon=True)
        th.start()
        c = ModbusTcpClient("127.0.0.1", port=mb, timeout=5)
        assert c.connect()
        try:
            vm = c.read_input_registers(100, count=118, device_id=1)
            assert not vm.isError(), vm
            closed = c.read_discrete_inputs(0, count=186, device_id=1)
            assert not closed.isError() and all(closed.bits[:186])
        finally:
            c.close()
        # OPC UA before the breaker command below: opening line 10 cascades, and on a loaded
        # machine the OPC UA session may come up only after the cascade reached lines 1-5
        seen = asyncio.run(_opcua(uap))
        c = ModbusTcpClient("127.0.0.1", port=mb, timeout=5)
        assert c.connect()
        try:
            assert not c.write_coil(9, True, device_id=1).isError()        # line_10.open_cmd
        finally:
            c.close()
        time.sleep(4.0)           # 40 loop steps at 10x, 40 PLC scans: past the load step at t = 20 s
        c = ModbusTcpClient("127.0.0.1", port=mb, timeout=5)
        assert c.connect()
        try:
            after = c.read_discrete_inputs(0, count=10, device_id=1)
        finally:
            c.close()
        stop.set()
        th.join(timeout=10)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    df = read_recording(json.loads(out.strip().splitlines()[-1])["record_path"])
    # Modbus block: bus_k.vm at 100 + k in 0.0001 pu, as served (measured) by the loop
    bus_ids = [int(c.split("_")[1].split(".")[0]) for c in df.columns if c.startswith("y.bus_") and c.endswith(".vm")]
    for k in range(10):
        meas = df[f"meas.bus_{bus_ids[k]}.vm"]
        assert meas.min() - 1e-4 <= vm.registers[k] / 10000.0 <= meas.max() + 1e-4
    # the coil opened line 10: applied command and breaker status, also on the wire (DI 9)
    assert df["app.line_10.open_cmd"].iloc[-1] == 1.0 and df["y.line_10.closed"].iloc[-1] == 0.0
    assert after.bits[9] is False and after.bits[8] is True
    # OPC UA folder: Boolean breaker nodes, one per line; the unit setpoint written as a Double
    assert seen["n"] == 186 and seen["vtype"] == ua.VariantType.Boolean and seen["closed"] == [True] * 5
    assert (df["app.gen_5.p_set"] == 430.0).any()
    # SoftPLC: rule ufls_1 shed its loads (written over Modbus, applied by the loop), AGC moved unit 30
    assert plc_stats["rules"]["ufls_1"]["active"] and plc_stats["good_scans"] > 20
    assert df["app.load_59.shed"].iloc[-1] == pytest.approx(0.1, abs=1e-4)
    assert df["app.load_116.shed"].iloc[-1] == pytest.approx(0.1, abs=1e-4)
    # stage 2 (49.5 Hz) acted exactly if the frequency went there (opening line 10 islands unit 5)
    assert (df["y.grid.frequency"].min() < 49.5) == (df["app.load_54.shed"].iloc[-1] == pytest.approx(0.15, abs=1e-4))
    agc = df["app.gen_30.p_set"].to_numpy()
    assert np.ptp(agc) > 0.1, "the AGC loop never moved unit 30"
