"""configs/panda.toml in real time at 1 kHz over real sockets: a Modbus master reads the
joint.q block and writes a position target (the PLC-style cell controller), an OPC UA client
browses the joint.q folder and writes a target in Actuators/joint.q_target; the recording shows
what the wire carried and what the loop applied."""

from __future__ import annotations

import asyncio
import json
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

from asyncua import Client, ua
from pymodbus.client import ModbusTcpClient

from hil.recorder import read_recording
from tests.integration.net import free_port as _free_port, listening as _listening, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _f32(regs) -> list[float]:
    return [struct.unpack(">f", struct.pack(">HH", regs[i], regs[i + 1]))[0] for i in range(0, len(regs), 2)]


def _modbus(port: int) -> list[float]:
    c = ModbusTcpClient("127.0.0.1", port=port, timeout=5)
    assert c.connect()
    try:
        q = c.read_input_registers(0, count=14, device_id=1)
        assert not q.isError(), q
        hi, lo = struct.unpack(">HH", struct.pack(">f", 0.3))
        wrote = c.write_registers(100, [hi, lo], device_id=1)  # joint_1.q_target = 0.3 rad
        assert not wrote.isError(), wrote
        return _f32(q.registers)
    finally:
        c.close()


async def _opcua(port: int) -> dict:
    async with Client(f"opc.tcp://127.0.0.1:{port}/hil") as c:
        idx = await c.get_namespace_index("urn:hil:panda")
        step = c.get_node(ua.NodeId("panda.Status.Step", idx))
        deadline = time.monotonic() + 60
        while await step.read_value() < 50:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        folder = await c.nodes.objects.get_child([f"{idx}:panda", f"{idx}:Sensors", f"{idx}:joint_q"])
        children = await folder.get_children()
        names = [(await n.read_browse_name()).Name for n in children]
        unit = await (await children[3].get_child("0:EngineeringUnits")).read_value()
        act = c.get_node(ua.NodeId("panda.Actuators.joint_4.q_target", idx))
        await act.write_value(ua.DataValue(ua.Variant(-2.0, ua.VariantType.Double)))
        return {"names": names, "unit": unit.DisplayName.Text, "values": [await n.read_value() for n in children]}


def test_panda_joint_groups_over_modbus_and_opcua(tmp_path):
    mb, uap = _free_port(), _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hil.cli", "run", str(ROOT / "configs" / "panda.toml"),
                             "--json", "--quiet", "--record", str(tmp_path / "rec"), "--set", f"modbus.port={mb}",
                             "--set", f"opcua.port={uap}", "--set", "loop.duration_s=600", "--set", "loop.priority=0",
                             "--set", "loop.cpu=-1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: _listening(mb) and _listening(uap), proc, "servers never listened")
        seen = asyncio.run(_opcua(uap))
        q_wire = _modbus(mb)
        time.sleep(1.0)  # ~1000 loop steps: both writes applied (the command path adds 1-3 ms)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    df = read_recording(summary["record_path"])
    assert seen["names"] == [f"joint_{k}_q" for k in range(1, 8)] and seen["unit"] == "rad"
    for k in range(7):  # served values are measured ones (float32 on Modbus)
        meas = df[f"meas.joint_{k + 1}.q"]
        assert meas.min() - 1e-6 <= q_wire[k] <= meas.max() + 1e-6, (k, q_wire[k])
        assert meas.min() - 1e-9 <= seen["values"][k] <= meas.max() + 1e-9
    assert abs(df["app.joint_1.q_target"].iloc[-1] - 0.3) < 1e-7  # float32 0.3
    assert df["app.joint_4.q_target"].iloc[-1] == -2.0
    assert df["x.joint_1.q"].iloc[-1] > 0.2  # the arm moved to the PLC's target
