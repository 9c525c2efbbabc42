"""`hil run` with both servers: each server's final counters reach the run summary.

A real run of the reference PLC scenario (loop, Modbus and OPC UA server processes),
clients that write once (and get one thing refused), then SIGINT: the `--json` summary
carries `modbus` and `opcua` blocks with exactly what the clients did, and the printed
summary shows both.
"""

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from asyncua import Client, ua
from pyModbusTCP.client import ModbusClient
from tests.integration.net import free_port as _free_port, listening as _listening, wait_for

ROOT = Path(__file__).resolve().parents[2]
HIL = [sys.executable, "-m", "hil.cli"]
pytestmark = pytest.mark.timeout(180)


def _modbus_client(port: int) -> None:
    c = ModbusClient(host="127.0.0.1", port=port, unit_id=1, timeout=5.0)
    try:
        regs = list(struct.unpack(">HH", struct.pack(">f", 40.0)))
        assert c.write_multiple_registers(8, regs)  # agitation_power (float32 at 8)
        assert c.read_input_registers(50, 2) is None and c.last_except == 2  # unmapped
    finally:
        c.close()


async def _opcua_client(port: int) -> float:
    async with Client(f"opc.tcp://127.0.0.1:{port}/hil") as c:
        idx = await c.get_namespace_index("urn:hil:bioreactor")
        node = c.get_node(ua.NodeId("bioreactor.Actuators.feed_rate", idx))
        await node.write_value(ua.DataValue(ua.Variant(0.05, ua.VariantType.Double)))
        with pytest.raises(ua.UaStatusCodeError) as bad:
            await node.write_value(ua.DataValue(ua.Variant(5.0, ua.VariantType.Double)))  # > 0.5 L/h
        assert bad.value.code == ua.StatusCodes.BadOutOfRange
        sub = await c.create_subscription(50, None)
        await sub.subscribe_data_change(c.get_node(ua.NodeId("bioreactor.Sensors.dissolved_oxygen", idx)))
        value = await node.read_value()
        await sub.delete()
        return value


def test_run_summary_carries_both_servers_final_counters(tmp_path):
    mb, uap = _free_port(), _free_port()
    proc = subprocess.Popen(
        HIL + ["run", "configs/bioreactor_plc.toml", "--duration", "100000", "--json", "--quiet", "--no-record",
               "--set", f"modbus.port={mb}", "--set", f"opcua.port={uap}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: _listening(mb) and _listening(uap), proc, "servers never listened")
        # the probes above were connections without a request (hence connections >= 2 below)
        _modbus_client(mb)
        assert asyncio.run(asyncio.wait_for(_opcua_client(uap), 60)) == 0.05
        os.kill(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    m, o = summary["modbus"], summary["opcua"]
    assert "error" not in m and "error" not in o, (m, o, stderr[-3000:])
    # Modbus: the listening probes connected and left without a request; the client connected
    # once, wrote once and got one ILLEGAL DATA ADDRESS
    assert (m["requests"], m["writes"], m["reads"], m["exceptions"]) == (2, 1, 1, {"0x02": 1}), m
    assert m["connections"] >= 2 and m["refused_connections"] == 0 and m["idle_closed"] == 0
    # OPC UA: one session, one accepted and one refused write, one subscription with one item
    assert (o["sessions"], o["writes_accepted"], o["writes_refused"]) == (1, 1, {"BadOutOfRange": 1}), o
    assert (o["subscriptions"], o["monitored_items"]) == (1, 1), o
    assert o["reads"] >= 1 and o["connections"] >= 2 and o["refused_connections"] == 0
    assert "modbus: " in stderr and "2 requests (1 reads, 1 writes), exceptions: 0x02 1" in stderr
    assert "opcua: 1 sessions" in stderr and "writes 1 accepted, refused: BadOutOfRange 1" in stderr
    # the start log says which actuators have more than one writer (item: two views of one actuator)
    # (one line: how many, the first five by name; with a recording the full list is in the run directory)
    shared = [ln for ln in stderr.splitlines() if "also writable over OPC UA" in ln]
    assert len(shared) == 1 and "7 actuators" in shared[0] and "agitation_power" in shared[0], stderr[-3000:]
