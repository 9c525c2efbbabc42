"""Block tag maps over real sockets: `hil run` of the test plant (spec built from a model
file, tests/plants/array_plant.py) serving an array group as a Modbus register block and as
an OPC UA folder; pymodbus and asyncua clients read and write them, and the recording shows
what the loop applied and measured."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from asyncua import Client, ua
from pymodbus.client import ModbusTcpClient

from hil.recorder import read_recording
from tests.plants.heaters_scenario import write_scenario
from tests.integration.net import free_port as _free_port, listening as _listening, wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)
IDS = (3, 7, 12, 20)

SERVERS = """
[modbus]
port = {mb}

[[modbus.blocks]]
group = "node.temp"
table = "input_register"
start = 100
encoding = "uint16"
scale = 50.0                  # 0.02 K per count

[[modbus.blocks]]
group = "node.tripped"
table = "discrete_input"
start = 10

[[modbus.blocks]]
group = "heater.duty"
table = "holding_register"
start = 200
encoding = "uint16"
scale = 10000.0

[opcua]
port = {ua}

[[opcua.folders]]
group = "node.temp"

[[opcua.folders]]
group = "heater.duty"
data_type = "Float"
"""


def _modbus(port: int) -> dict:
    c = ModbusTcpClient("127.0.0.1", port=port, timeout=5)
    assert c.connect()
    try:
        temps = c.read_input_registers(100, count=4, device_id=1)
        assert not temps.isError(), temps
        trips = c.read_discrete_inputs(10, count=4, device_id=1)
        assert not trips.isError(), trips
        wrote = c.write_register(201, 2500, device_id=1)  # heater_7.duty = 0.25 (plc-driven)
        assert not wrote.isError(), wrote
        refused = c.write_register(200, 5000, device_id=1)  # heater_3.duty is driven "fixed": read-only
        assert refused.isError() and refused.exception_code == 2
        back = c.read_holding_registers(200, count=4, device_id=1)
        assert not back.isError(), back
        return {"temps": [r / 50.0 for r in temps.registers], "trips": list(trips.bits[:4]),
                "duty": [r / 10000.0 for r in back.registers]}
    finally:
        c.close()


async def _wait_steps(port: int, n: int, timeout_s: float = 60.0) -> int:
    """Until the loop has published step n (the served values are then recorded ones)."""
    async with Client(f"opc.tcp://127.0.0.1:{port}/hil") as c:
        idx = await c.get_namespace_index("urn:hil:heaters")
        node = c.get_node(ua.NodeId("heaters.Status.Step", idx))
        deadline = time.monotonic() + timeout_s
        while (step := await node.read_value()) < n:
            assert time.monotonic() < deadline, f"the loop stayed at step {step}"
            await asyncio.sleep(0.05)
        return step


async def _opcua(port: int) -> dict:
    async with Client(f"opc.tcp://127.0.0.1:{port}/hil") as c:
        idx = await c.get_namespace_index("urn:hil:heaters")
        folder = await c.nodes.objects.get_child([f"{idx}:heaters", f"{idx}:Sensors", f"{idx}:node_temp"])
        children = await folder.get_children()
        names = [(await n.read_browse_name()).Name for n in children]
        node = c.get_node(ua.NodeId("heaters.Sensors.node_12.temp", idx))
        eu = await (await node.get_child("0:EURange")).read_value()
        unit = await (await node.get_child("0:EngineeringUnits")).read_value()
        values = [await n.read_value() for n in children]
        act = await c.nodes.objects.get_child([f"{idx}:heaters", f"{idx}:Actuators", f"{idx}:heater_duty",
                                               f"{idx}:heater_20_duty"])
        assert (await act.read_data_type_as_variant_type()) == ua.VariantType.Float
        await act.write_value(ua.DataValue(ua.Variant(0.4, ua.VariantType.Float)))
        actuators = await (await c.nodes.objects.get_child([f"{idx}:heaters", f"{idx}:Actuators",
                                                             f"{idx}:heater_duty"])).get_children()
        act_names = [(await n.read_browse_name()).Name for n in actuators]
        return {"names": names, "eu": (eu.Low, eu.High), "unit": unit.DisplayName.Text, "values": values,
                "actuators": act_names}


def test_modbus_block_and_opcua_folder_over_real_sockets(tmp_path):
    mb, uap = _free_port(), _free_port()
    path = write_scenario(tmp_path, time_scale=20.0, duration_s=100000.0, extra=SERVERS.format(mb=mb, ua=uap))
    proc = subprocess.Popen([sys.executable, "-m", "hil.cli", "run", str(path), "--json", "--quiet",
                             "--record", str(tmp_path / "rec")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: _listening(mb) and _listening(uap), proc, "servers never listened")
        asyncio.run(_wait_steps(uap, 3))
        got = _modbus(mb)
        seen = asyncio.run(_opcua(uap))
        time.sleep(1.0)  # 20 loop steps: the writes are applied
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    df = read_recording(summary["record_path"])

    # Modbus block: consecutive registers per element, scaled; served values are measured ones
    for i, value in zip(IDS, got["temps"]):
        meas = df[f"meas.node_{i}.temp"]
        assert meas.min() - 0.011 <= value <= meas.max() + 0.011, (i, value)
    assert got["trips"] == [False, False, True, False]  # node 12 starts tripped (discrete state)
    assert got["duty"][1] == 0.25 and got["duty"][0] == 1.0  # written / fixed (read-only) element
    # what the loop applied: the Modbus write to heater_7, the OPC UA write to heater_20
    assert (df["app.heater_7.duty"] == 0.25).any() and df["app.heater_7.duty"].iloc[-1] == 0.25
    assert df["app.heater_20.duty"].iloc[-1] == pytest.approx(0.4, abs=1e-7)  # Float: 0.4 as float32
    assert (df["app.heater_3.duty"] == 1.0).all()
    # OPC UA folder: one variable per element, browse name = element name ('.' -> '_'), unit and range
    # from the spec
    assert seen["names"] == [f"node_{i}_temp" for i in IDS]
    assert seen["eu"] == (200.0, 1000.0) and seen["unit"] == "K"
    for i, value in zip(IDS, seen["values"]):
        meas = df[f"meas.node_{i}.temp"]
        assert meas.min() - 1e-9 <= value <= meas.max() + 1e-9
    assert seen["actuators"] == [f"heater_{i}_duty" for i in IDS if i != 3]  # heater_3 is driven "fixed"
    assert summary["modbus"]["exceptions"] == {"0x02": 1}
    assert np.isfinite(df["z.supply.voltage"]).all()
