"""`hil tags configs/grid118.toml`: the exported Modbus addresses, encodings, word order and scales
read a live server correctly (pyModbusTCP, an independent client), and the exported OPC UA node
ids and browse paths resolve on the live server; values compared with the run's recording."""

from __future__ import annotations

import asyncio
import json
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from asyncua import Client
from pyModbusTCP.client import ModbusClient

from hil.recorder import read_recording
from tests.integration.net import free_port, listening, wait_for

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "grid118.toml"
pytestmark = pytest.mark.timeout(300)
SIGNALS = ("grid.frequency", "grid.max_loading", "grid.islands", "bus_12.vm", "line_3.loading", "line_5.p_mw",
           "line_7.closed", "gen_5.p_set")


def _export(fmt: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hil.cli", "tags", str(CONFIG), "--format", fmt, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=200)


def _decode(tag: dict, c: ModbusClient) -> float:
    """Read one exported Modbus tag with pyModbusTCP, decoding it only from the export's columns."""
    table, addr = tag["table"], tag["address"]
    if tag["type"] == "bool":
        bits = (c.read_discrete_inputs if table == "discrete_input" else c.read_coils)(addr, 1)
        assert bits is not None, c.last_error_as_txt
        return 1.0 if bits[0] else 0.0
    read = c.read_input_registers if table == "input_register" else c.read_holding_registers
    regs = read(addr, tag["registers"])
    assert regs is not None, (tag["signal"], c.last_error_as_txt, c.last_except_as_txt)
    layout = tag["layout"]               # ABCD / CDAB / BADC / DCBA, AB / BA
    words = regs if layout[0] in "AB" else regs[::-1]
    raw_bytes = b"".join(struct.pack(">H" if layout[0:2] in ("AB", "CD") else "<H", w) for w in words)
    code = {"uint16": ">H", "int16": ">h", "uint32": ">I", "int32": ">i", "float32": ">f", "float64": ">d"}[tag["type"]]
    raw = struct.unpack(code, raw_bytes)[0]
    return raw / tag["scale"] + tag["offset"]


async def _opcua(port: int, nodes: dict) -> dict:
    async with Client(f"opc.tcp://127.0.0.1:{port}/hil", timeout=30) as c:
        out = {}
        for name, row in nodes.items():
            uri, _, ident = row["node_id"].removeprefix("nsu=").partition(";s=")
            idx = await c.get_namespace_index(uri)
            by_id = await c.get_node(f"ns={idx};s={ident}").read_value()
            by_path = await c.nodes.objects.get_child([f"{idx}:{p}" for p in row["browse_path"].split("/")])
            out[name] = (float(by_id), float(await by_path.read_value()), by_path.nodeid.Identifier)
        return out


def test_export_reads_a_live_server(tmp_path):
    assert _export("json", tmp_path / "tags.json").returncode == 0
    assert _export("csv", tmp_path / "tags.csv").returncode == 0
    doc = json.loads((tmp_path / "tags.json").read_text())
    csv_lines = (tmp_path / "tags.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(doc["tags"])
    mb_rows = {t["signal"]: t for t in doc["tags"] if t["protocol"] == "modbus"}
    ua_rows = {t["signal"]: t for t in doc["tags"] if t["protocol"] == "opcua" and t["kind"] == "sensor"}
    assert len(mb_rows) == 1278 and "ABCD" in doc["modbus"]["float_word_order"]
    assert mb_rows["line_5.p_mw"]["layout"] == "ABCD" and mb_rows["line_5.p_mw"]["address"] == 508
    assert mb_rows["gen_5.p_set"]["writable"] is True and mb_rows["bus_12.vm"]["writable"] is False
    # OPC UA: folder-independent node ids, browse paths without characters needing escapes
    assert ua_rows["bus_12.vm"]["node_id"] == "nsu=urn:hil:grid118;s=grid118.Sensors.bus_12.vm"
    assert ua_rows["bus_12.vm"]["browse_path"] == "grid118/Sensors/bus_vm/bus_12_vm"
    assert all(not set(r["browse_path"]) & set(".<>:#!&") for r in ua_rows.values())

    mb, uap = free_port(), free_port()
    rec = tmp_path / "rec"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hil.cli", "run", str(CONFIG), "--json", "--quiet", "--wall", "150", "--record",
         str(rec), "--set", f"modbus.port={mb}", "--set", f"opcua.port={uap}", "--set", "iec104.enabled=false",
         "--set", "loop.priority=0",
         "--set", "loop.cpu=-1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: listening(mb) and listening(uap), proc, "servers never listened", poll_s=0.3)
        c = ModbusClient(host="127.0.0.1", port=mb, unit_id=1, timeout=5.0)
        deadline = time.monotonic() + 120
        while not 45.0 < (f := _decode(mb_rows["grid.frequency"], c)) < 55.0:   # until the first step
            assert time.monotonic() < deadline and proc.poll() is None, f
            time.sleep(0.3)
        time.sleep(1.5)
        wire = {s: _decode(mb_rows[s], c) for s in SIGNALS}
        c.close()
        ua = asyncio.run(asyncio.wait_for(_opcua(uap, {s: ua_rows[s] for s in ("bus_12.vm", "line_5.p_mw")}), 120))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    df = read_recording(json.loads(out.strip().splitlines()[-1])["record_path"])
    for s in SIGNALS:
        col = df[f"meas.{s}"] if f"meas.{s}" in df else df[f"app.{s}"]
        t = mb_rows[s]
        # resolution of the encoding: half a count for integers, float32 rounding, exact for bits
        tol = 0.5 / t["scale"] if t["type"] in ("uint16", "int16") else 1e-6 * max(1.0, abs(col).max())
        assert col.min() - tol - 1e-12 <= wire[s] <= col.max() + tol + 1e-12, (s, wire[s], col.min(), col.max())
    for s, (by_id, by_path, ident) in ua.items():
        assert by_id == by_path and ident == ua_rows[s]["node_id"].partition(";s=")[2]
        col = df[f"meas.{s}"]
        assert col.min() - 1e-9 <= by_id <= col.max() + 1e-9
    # the dual-writable actuators: one log line, the full list in the run directory
    listed = (Path(json.loads(out.strip().splitlines()[-1])["record_path"]) / "_dual_writable.txt").read_text().split()
    assert "gen_5.p_set" in listed and "line_10.open_cmd" in listed and len(listed) == len(set(listed)) > 500
    lines = [ln for ln in err.splitlines() if "also writable over OPC UA" in ln]
    assert len(lines) == 1 and len(lines[0]) < 400 and "_dual_writable.txt" in lines[0]
    assert np.isfinite(list(wire.values())).all()
