"""The Modbus server in its own process, driven by clients we did not write.

mbpoll (C, libmodbus), pyModbusTCP (pure Python) and the pymodbus client talk to
adapters/modbus.py over real sockets; the test process owns the process image and
publishes known outputs into it, as the loop would.
"""

import json
import re
import shutil
import socket
import struct
import subprocess
import threading
import time

import numpy as np
import pytest
from pyModbusTCP.client import ModbusClient
from pyModbusTCP import constants as C

from adapters.modbus_log import read_request_log
from hil.softplc.io import MAX_READ, plan_blocks
from hil.tagmap.modbus import compile_map
from tests.integration import modbus_helpers as H

pytestmark = pytest.mark.timeout(120)
IDX = {n: H.SPEC.index("inputs", n) for n in H.SPEC.names("inputs")}
Y = np.array([42.5, 301.25, 1.0, 1.0, -1234.56])  # level, temperature, high_level, pump_running, flow_total
APPLIED = np.array([3.0, 0.0, 0.0, 0.0, 0.0])


@pytest.fixture(scope="module")
def rig():
    with H.rig(publisher=False) as r:
        r.image.publish(Y, APPLIED, 7, 0.14)
        r.cmap = compile_map(r.sc.modbus, H.SPEC, r.sc)
        yield r


@pytest.fixture(autouse=True)
def _fresh_inputs(request):
    if "rig" in request.fixturenames:
        r = request.getfixturevalue("rig")
        r.image.write_inputs(np.arange(H.SPEC.n_inputs), np.zeros(H.SPEC.n_inputs))
        r.image.publish(Y, APPLIED, 7, 0.14)
    yield


def _f32(v):
    return list(struct.unpack(">HH", struct.pack(">f", v)))


def _expected(tag) -> float:
    if tag.source == "measured":
        return Y[tag.index]
    if tag.source == "applied":
        return APPLIED[tag.index]
    return 0.0  # commands were zeroed


# ---------------------------------------------------------------------------- mbpoll

MBPOLL = shutil.which("mbpoll")
needs_mbpoll = pytest.mark.skipif(MBPOLL is None, reason="mbpoll not installed (apt-get install mbpoll)")
MB_TYPE = {"coil": "0", "discrete_input": "1", "input_register": "3:hex", "holding_register": "4:hex"}


def mbpoll(port, *args, values=()):
    """Run mbpoll once, 0-based addressing; returns (exit code, stdout + stderr)."""
    cmd = [MBPOLL, "-m", "tcp", "-a", "1", "-0", "-1", "-o", "2", "-p", str(port), *args, "127.0.0.1"]
    if values:
        cmd += ["--", *map(str, values)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    return p.returncode, p.stdout + p.stderr


def parse_mbpoll(text) -> dict[int, str]:
    return {int(a): v for a, v in re.findall(r"^\[(\d+)\]:\s+(\S+)", text, re.M)}


@needs_mbpoll
def test_mbpoll_reads_every_mapped_register_and_bit(rig):
    for block in plan_blocks(rig.cmap.tags, MAX_READ):
        rc, out = mbpoll(rig.port, "-t", MB_TYPE[block.table], "-r", str(block.address), "-c", str(block.count))
        assert rc == 0, out
        got = parse_mbpoll(out)
        for tag in block.tags:
            if tag.n_words == 1 and tag.encoding == "bool":
                assert got[tag.address] == str(int(tag.to_bit(_expected(tag)))), (tag.key, out)
            else:
                words = [int(got[tag.address + w], 16) for w in range(tag.n_words)]
                assert tuple(words) == tag.to_registers(_expected(tag)), (tag.key, out)
                # decoded within the encoding's resolution (scaled integers round to 1/scale)
                assert abs(tag.from_registers(words) - _expected(tag)) <= 0.5 / tag.scale + 1e-9, tag.key


@needs_mbpoll
def test_mbpoll_decodes_our_float32_and_int32(rig):
    rc, out = mbpoll(rig.port, "-t", "3:float", "-B", "-r", "0")  # big-endian words
    assert rc == 0 and float(parse_mbpoll(out)[0]) == 42.5
    rc, out = mbpoll(rig.port, "-t", "3:float", "-r", "2")  # mbpoll's default: little-endian words
    assert rc == 0 and float(parse_mbpoll(out)[2]) == 301.25
    rc, out = mbpoll(rig.port, "-t", "3:int", "-B", "-r", "12")
    assert rc == 0 and int(parse_mbpoll(out)[12]) == -123456


@needs_mbpoll
def test_mbpoll_writes_an_actuator_into_the_image(rig):
    rc, out = mbpoll(rig.port, "-t", "4:float", "-B", "-r", "0", values=[7.25])
    assert rc == 0, out
    assert rig.image.read_inputs()[IDX["inflow"]] == 7.25
    rc, out = mbpoll(rig.port, "-t", "0", "-r", "0", values=[1])
    assert rc == 0 and rig.image.read_inputs()[IDX["pump"]] == 1.0


@needs_mbpoll
@pytest.mark.parametrize("args, values, text", [
    (("-t", "3", "-r", "9", "-c", "2"), (), "Illegal data address"),  # unmapped register
    (("-t", "1", "-r", "5"), (), "Illegal data address"),  # unmapped discrete input
    (("-t", "4", "-r", "0"), (1,), "Illegal data address"),  # half a float32
    (("-t", "4", "-r", "100"), (1, 2), "Illegal data address"),  # a sensor in a holding register
    (("-t", "4:float", "-B", "-r", "0"), (99.0,), "Illegal data value"),  # beyond inflow's 20 L/min
])
def test_mbpoll_sees_the_exceptions(rig, args, values, text):
    before = rig.image.counters()["input_writes"]
    rc, out = mbpoll(rig.port, *args, values=values)
    assert rc != 0 and text in out, out
    assert rig.image.counters()["input_writes"] == before


# ---------------------------------------------------------------------------- pyModbusTCP


def _pmt(rig, **kw):
    return ModbusClient(host="127.0.0.1", port=rig.port, unit_id=kw.pop("unit_id", 1), timeout=5.0, **kw)


def test_pymodbustcp_function_codes(rig):
    c = _pmt(rig)
    try:
        assert c.read_input_registers(0, 2) == _f32(42.5)  # FC4
        assert c.read_holding_registers(100, 2) == _f32(42.5)  # FC3 (a sensor in a holding register)
        assert c.read_discrete_inputs(0, 2) == [True, True]  # FC2
        assert c.write_single_coil(0, True) and rig.image.read_inputs()[IDX["pump"]] == 1.0  # FC5
        assert c.read_coils(0, 1) == [True]  # FC1
        assert c.write_multiple_coils(0, [False]) and rig.image.read_inputs()[IDX["pump"]] == 0.0  # FC15
        assert c.write_single_register(4, 1234)  # FC6, uint16 x100
        assert rig.image.read_inputs()[IDX["inflow"]] == pytest.approx(12.34)
        assert c.write_multiple_registers(0, _f32(5.5) + _f32(11.0))  # FC16, two tags, one request
        got = rig.image.read_inputs()
        assert (got[IDX["inflow"]], got[IDX["coolant"]]) == (5.5, 11.0)
        # FC23: write trim (int16 x 1e4), then read inflow+coolant back
        assert c.write_read_multiple_registers(5, [0x10000 - 2500], 0, 4) == _f32(5.5) + _f32(11.0)
        assert rig.image.read_inputs()[IDX["trim"]] == -0.25
    finally:
        c.close()


def test_pymodbustcp_exception_codes(rig):
    c = _pmt(rig)
    writes0 = rig.image.counters()["input_writes"]
    try:
        assert c.read_input_registers(30, 1) is None and c.last_except == C.EXP_DATA_ADDRESS
        assert c.read_coils(3, 1) is None and c.last_except == C.EXP_DATA_ADDRESS
        assert not c.write_single_register(0, 0x40A0) and c.last_except == C.EXP_DATA_ADDRESS  # half float
        assert not c.write_multiple_registers(20, _f32(1.0)) and c.last_except == C.EXP_DATA_ADDRESS  # bus-driven
        assert not c.write_multiple_registers(2, _f32(float("nan"))) and c.last_except == C.EXP_DATA_VALUE
        assert not c.write_multiple_registers(0, _f32(1.0) + _f32(-3.0)) and c.last_except == C.EXP_DATA_VALUE
        assert rig.image.counters()["input_writes"] == writes0  # nothing was written
        assert c.read_input_registers(0, 2) == _f32(42.5)  # the connection is still fine
    finally:
        c.close()
    other = _pmt(rig, unit_id=9)
    try:
        assert other.read_input_registers(0, 2) is None
        assert other.last_except == C.EXP_GATEWAY_TARGET_DEVICE_FAILED_TO_RESPOND
    finally:
        other.close()
    for unit in (0, 255):  # "unit not used" conventions of Modbus TCP are served
        c = _pmt(rig, unit_id=unit)
        try:
            assert c.read_input_registers(0, 2) == _f32(42.5)
        finally:
            c.close()


# ---------------------------------------------------------------------------- pymodbus client


def test_pymodbus_client_decodes_float32_in_both_word_orders(rig):
    from pymodbus.client import ModbusTcpClient

    c = ModbusTcpClient("127.0.0.1", port=rig.port, timeout=5)
    assert c.connect()
    try:
        rr = c.read_input_registers(0, count=4, device_id=1)
        assert not rr.isError()
        assert c.convert_from_registers(rr.registers[:2], c.DATATYPE.FLOAT32) == 42.5
        assert c.convert_from_registers(rr.registers[2:], c.DATATYPE.FLOAT32, word_order="little") == 301.25
        rr = c.read_input_registers(14, count=4, device_id=1)
        assert c.convert_from_registers(rr.registers, c.DATATYPE.FLOAT64) == 301.25
        rr = c.write_registers(2, c.convert_to_registers(17.5, c.DATATYPE.FLOAT32), device_id=1)
        assert not rr.isError() and rig.image.read_inputs()[IDX["coolant"]] == 17.5
    finally:
        c.close()


# ---------------------------------------------------------------------------- robustness


def test_twenty_concurrent_clients_get_consistent_values(rig):
    """Each request is served from one publish: temperature - level stays 258.75 in every answer."""
    stop = threading.Event()

    def publish():
        k = 0
        while not stop.is_set():
            k += 1
            lvl = float(k % 100)
            rig.image.publish(np.array([lvl, lvl + 258.75, 0.0, 0.0, 0.0]), APPLIED, k, k * 0.001)
            time.sleep(0.0005)

    errors: list = []

    def client(i):
        c = _pmt(rig)
        try:
            for _ in range(25):
                regs = c.read_input_registers(0, 4)
                if regs is None:
                    errors.append((i, c.last_error, c.last_except))
                    return
                lvl = struct.unpack(">f", struct.pack(">HH", *regs[:2]))[0]
                tmp = struct.unpack(">f", struct.pack(">HH", regs[3], regs[2]))[0]
                if tmp - lvl != 258.75:
                    errors.append((i, lvl, tmp))
        finally:
            c.close()

    pub = threading.Thread(target=publish, daemon=True)
    pub.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(20)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        stop.set()
        pub.join(5)
    assert not errors, errors[:5]


def _mbap(tid, pdu, unit=1):
    return struct.pack(">HHHB", tid, 0, len(pdu) + 1, unit) + pdu


def test_half_requests_garbage_and_disconnects_harm_no_one(rig):
    good = _pmt(rig)
    try:
        assert good.read_input_registers(0, 2) == _f32(42.5)
        # a client that sends half a request and vanishes
        s = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
        s.sendall(_mbap(1, struct.pack(">BHH", 4, 0, 2))[:9])
        s.close()
        # one that sends half a request and stays silent while others are served
        stuck = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
        stuck.sendall(_mbap(1, struct.pack(">BHH", 3, 0, 2))[:8])
        assert good.read_input_registers(0, 2) == _f32(42.5)
        # a client that resets the connection mid-request
        r = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
        r.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        r.sendall(_mbap(1, struct.pack(">BHH", 4, 0, 2))[:10])
        r.close()
        # garbage
        g = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
        g.sendall(b"\xff" * 300)
        g.close()
        assert good.read_input_registers(0, 2) == _f32(42.5)
        assert good.write_multiple_registers(0, _f32(2.0)) and rig.image.read_inputs()[IDX["inflow"]] == 2.0
        stuck.close()
    finally:
        good.close()


def test_pipelined_requests_in_one_segment_are_all_answered(rig):
    s = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
    try:
        s.sendall(_mbap(1, struct.pack(">BHH", 4, 0, 2)) + _mbap(2, struct.pack(">BHH", 4, 10, 1)))
        want = {1: bytes([4, 4]) + struct.pack(">HH", *_f32(42.5)), 2: bytes([4, 2]) + struct.pack(">H", 4250)}
        buf = b""
        got = {}
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            buf += s.recv(256)
            while len(buf) >= 7 and len(buf) >= 6 + struct.unpack(">H", buf[4:6])[0]:
                n = 6 + struct.unpack(">H", buf[4:6])[0]
                tid = struct.unpack(">H", buf[:2])[0]
                got[tid] = buf[7:n]
                buf = buf[n:]
        assert got == want
    finally:
        s.close()


# ---------------------------------------------------------------------------- counters, log, shutdown


def test_exceptions_are_counted_per_client_and_the_request_log_is_written(tmp_path):
    log_path, stats_path = tmp_path / "requests.parquet", tmp_path / "stats.json"
    with H.rig(publisher=False, server=False) as r:
        r.image.publish(Y, APPLIED, 3, 0.06)
        r.start_server(log_path=str(log_path), stats_path=str(stats_path))
        a, b = _pmt(r), _pmt(r)
        try:
            for _ in range(3):
                assert a.read_input_registers(30, 1) is None  # 0x02 x3
            for _ in range(2):
                assert not a.write_multiple_registers(0, _f32(-1.0))  # 0x03 x2
            assert a.write_multiple_registers(0, _f32(4.0))
            assert b.read_input_registers(0, 2) == _f32(42.5)
            a_peer = "127.0.0.1:%d" % a._sock.getsockname()[1]
            b_peer = "127.0.0.1:%d" % b._sock.getsockname()[1]
        finally:
            a.close()
            b.close()
        r.server.terminate()  # SIGTERM: a clean stop that still writes the files
        r.server.join(20)
        assert r.server.exitcode == 0
    stats = json.loads(stats_path.read_text())
    assert stats["clients"][a_peer]["exceptions"] == {"0x02": 3, "0x03": 2}
    assert stats["clients"][a_peer]["requests"] == 6 and stats["clients"][a_peer]["writes"] == 3
    assert stats["clients"][b_peer]["exceptions"] == {}
    assert stats["totals"]["exceptions"] == {"0x02": 3, "0x03": 2}
    df = read_request_log(log_path)
    assert len(df) == 7 and set(df["peer"]) == {a_peer, b_peer}
    mine = df[df["peer"] == a_peer]
    assert list(mine["exc"]) == [2, 2, 2, 3, 3, 0, ][:6] and list(mine["wrote"]) == [False] * 5 + [True]
    assert mine["write_seq"].iloc[-1] >= 1 and (mine["write_seq"].iloc[:5] == -1).all()
    read_b = df[df["peer"] == b_peer].iloc[0]
    assert read_b["step"] == 3 and read_b["fc"] == 4 and read_b["t_ns"] >= read_b["publish_ns"]
    assert read_b["t_ns"] <= read_b["served_ns"] <= read_b["t_ns"] + read_b["dur_ns"]
    assert (mine["served_ns"] == -1).all()  # refused reads and the write served no snapshot
    assert (df["dur_ns"] > 0).all()


def _ask(s, tid, pdu):
    s.sendall(_mbap(tid, pdu))
    head = s.recv(7)
    body = s.recv(struct.unpack(">H", head[4:6])[0] - 1)
    assert struct.unpack(">H", head[:2])[0] == tid
    return body


def test_unserved_function_codes_answer_illegal_function_and_mask_write_works(rig):
    s = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
    try:
        assert _ask(s, 1, bytes([24, 0, 0])) == bytes([0x98, 1])  # read FIFO: no dummy data
        assert _ask(s, 2, bytes([20, 7, 6, 0, 1, 0, 0, 0, 1])) == bytes([0x94, 1])  # file record
        assert _ask(s, 3, bytes([99, 1, 2])) == bytes([0xE3, 1])  # no such function
        # FC22 on inflow (uint16 x100 at 4): (0 & 0xFF00) | (0x0012 & 0x00FF) = 18 -> 0.18 L/min
        assert _ask(s, 4, struct.pack(">BHHH", 22, 4, 0xFF00, 0x0012)) == struct.pack(">BHHH", 22, 4, 0xFF00, 0x0012)
        assert rig.image.read_inputs()[IDX["inflow"]] == pytest.approx(0.18)
        assert _ask(s, 5, struct.pack(">BHHH", 22, 0, 0xFF00, 0x0012)) == bytes([0x96, 2])  # half a float32
    finally:
        s.close()


def test_read_write_multiple_with_a_bad_read_writes_nothing(rig):
    c = _pmt(rig)
    writes0 = rig.image.counters()["input_writes"]
    try:
        assert c.write_read_multiple_registers(4, [500], 30, 1) is None  # read of an unmapped register
        assert c.last_except == C.EXP_DATA_ADDRESS
        assert rig.image.counters()["input_writes"] == writes0
        assert c.write_read_multiple_registers(4, [500], 4, 1) == [500]
        assert rig.image.read_inputs()[IDX["inflow"]] == 5.0
    finally:
        c.close()
