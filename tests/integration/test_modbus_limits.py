"""The Modbus server's edges, over real sockets to the server in its own process: function
codes it does not serve, connection limits, idle connections, narrowed engineering ranges.

The server's log is its stderr (the spawned child inherits the test's fd 2, captured by
capfd), so the assertions on logging see exactly what an operator's terminal would.
"""

import json
import re
import socket
import struct
import time

import numpy as np
import pytest
from pymodbus.client import ModbusTcpClient
from pyModbusTCP.client import ModbusClient

from tests.integration import modbus_helpers as H

pytestmark = pytest.mark.timeout(120)
IDX = {n: H.SPEC.index("inputs", n) for n in H.SPEC.names("inputs")}
BURST = 5  # adapters/ratelog.py DEFAULT_BURST: lines per kind of event per 10 s


def _mbap(tid, pdu, unit=1):
    return struct.pack(">HHHB", tid, 0, len(pdu) + 1, unit) + pdu


def _recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def _ask(s, tid, pdu, unit=1):
    """Send one request, return the response PDU (function code onward)."""
    s.sendall(_mbap(tid, pdu, unit))
    head = _recv_exact(s, 7)
    assert struct.unpack(">H", head[:2])[0] == tid
    return _recv_exact(s, struct.unpack(">H", head[4:6])[0] - 1)


def _closed_by_server(s, timeout_s=10.0) -> bool:
    """True once the server closed the socket (EOF or reset) within timeout_s."""
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


@pytest.fixture
def rig_stats(tmp_path):
    """A rig whose server writes its per-client counters (totals included) when stopped."""
    def make(**modbus):
        r = H.rig(publisher=False, server=False, modbus=modbus)
        rig = r.__enter__()
        rig.stats_path = tmp_path / "clients.json"
        rig.start_server(stats_path=str(rig.stats_path))
        made.append(r)
        return rig

    made: list = []
    yield make
    for r in made:
        r.__exit__(None, None, None)


def _totals(rig) -> dict:
    assert rig.stop_server() == 0
    return json.loads(rig.stats_path.read_text())["totals"]


# ---------------------------------------------------------------------------- function codes

UNSERVED = [
    bytes([7]),  # read exception status
    bytes([8, 0x00, 0x00, 0x12, 0x34]),  # diagnostics: return query data (pymodbus would echo)
    bytes([8, 0x12, 0x34, 0x00, 0x00]),  # diagnostics: unknown sub-function (raised in pymodbus)
    bytes([8, 0x00, 0x0A, 0x00, 0x00]),  # diagnostics: clear counters
    bytes([11]),  # get comm event counter
    bytes([12]),  # get comm event log
    bytes([17]),  # report server id
    bytes([43, 14, 1, 0]),  # read device identification (MEI)
    bytes([43, 13, 0, 0]),  # another MEI type
    bytes([20, 7, 6, 0, 1, 0, 0, 0, 1]),  # read file record
    bytes([24, 0, 0]),  # read FIFO queue
    bytes([65, 1, 2]),  # user-defined range
    bytes([99]),  # no such function
]


def test_every_unserved_function_code_answers_illegal_function_without_tracebacks(rig_stats, capfd):
    rig = rig_stats()
    s = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
    try:
        for tid, pdu in enumerate(UNSERVED, 1):
            assert _ask(s, tid, pdu) == bytes([pdu[0] | 0x80, 0x01]), pdu
        # a client hammering the server: answered every time, logged a few times
        for k in range(200):
            pdu = UNSERVED[k % len(UNSERVED)]
            assert _ask(s, 1000 + k, pdu) == bytes([pdu[0] | 0x80, 0x01])
        # the served codes still work on the same connection
        assert _ask(s, 5000, bytes([4, 0, 0, 0, 2]))[:2] == bytes([4, 4])
    finally:
        s.close()
    # another client library, through its own API for these codes
    c = ModbusTcpClient("127.0.0.1", port=rig.port, timeout=5)
    assert c.connect()
    try:
        for call in (c.read_exception_status, c.diag_read_diagnostic_register, c.diag_clear_counters,
                     c.diag_get_comm_event_counter, c.report_device_id, c.read_device_information):
            rr = call(device_id=1)
            assert rr.isError() and rr.exception_code == 1, (call.__name__, rr)
    finally:
        c.close()
    p = ModbusClient(host="127.0.0.1", port=rig.port, unit_id=1, timeout=5.0)
    try:
        assert p.custom_request(bytes([8, 0xAB, 0xCD, 0, 0])) is None and p.last_except == 1
    finally:
        p.close()
    totals = _totals(rig)
    n_unserved = len(UNSERVED) + 200 + 6 + 1
    assert totals["exceptions"] == {"0x01": n_unserved}
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Datastore unable" not in err
    lines = [ln for ln in err.splitlines() if "ILLEGAL FUNCTION" in ln]
    # one budget for "unserved" and one for "undecodable" (codes pymodbus cannot decode)
    assert 1 <= len(lines) <= 2 * BURST, lines
    assert "further 'unserved' events are counted" in err
    assert re.search(r"modbus: \d+ requests .* exceptions \{'0x01': %d\}" % n_unserved, err), err[-2000:]


# ---------------------------------------------------------------------------- connections


def test_connections_beyond_the_limit_are_refused_and_counted(rig_stats, capfd):
    rig = rig_stats(max_connections=3)
    held = [socket.create_connection(("127.0.0.1", rig.port), timeout=5) for _ in range(3)]
    extra = []
    try:
        for tid, s in enumerate(held, 1):
            assert _ask(s, tid, bytes([4, 0, 0, 0, 2]))[:2] == bytes([4, 4])  # served
        for _ in range(2):
            e = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
            extra.append(e)
            assert _closed_by_server(e), "a connection beyond max_connections was kept open"
        for tid, s in enumerate(held, 10):  # the admitted clients are unaffected
            assert _ask(s, tid, bytes([4, 0, 0, 0, 2]))[:2] == bytes([4, 4])
        held.pop().close()  # a slot frees up: the next client is served

        def served():
            s = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
            try:
                return _ask(s, 99, bytes([4, 0, 0, 0, 2]))[:2] == bytes([4, 4])
            except ConnectionError:
                return False
            finally:
                s.close()

        H.wait_until(served, timeout_s=10)
    finally:
        for s in held + extra:
            s.close()
    totals = _totals(rig)
    assert totals["refused_connections"] == 2
    assert totals["connects"] == 4  # 3 held + the one after the slot freed (refused ones are not clients)
    err = capfd.readouterr().err
    assert "refused a connection from 127.0.0.1:" in err and "max_connections = 3" in err


def test_a_silent_connection_is_closed_after_the_idle_timeout(rig_stats, capfd):
    rig = rig_stats(idle_timeout_s=2.0)
    silent = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
    busy = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
    try:
        deadline = time.monotonic() + 20
        closed = False
        tid = 0
        while time.monotonic() < deadline and not closed:
            tid += 1
            assert _ask(busy, tid, bytes([4, 0, 0, 0, 2]))[:2] == bytes([4, 4])  # keeps busy alive
            silent.settimeout(0.1)
            try:
                closed = silent.recv(1) == b""
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed = True
        assert closed, "the silent connection was not closed"
        assert _ask(busy, tid + 1, bytes([4, 0, 0, 0, 2]))[:2] == bytes([4, 4])  # still served
    finally:
        silent.close()
        busy.close()
    totals = _totals(rig)
    assert totals["idle_closed"] == 1
    assert "idle_timeout_s = 2" in capfd.readouterr().err


# ---------------------------------------------------------------------------- engineering range

NARROW_VIEW = {"signal": "inflow", "table": "holding_register", "address": 30, "encoding": "uint16",
               "scale": 5000.0, "eng_low": 0.0, "eng_high": 10.0}  # 0..10 of 0..20 L/min


def test_a_narrowed_view_writes_inside_its_range_and_refuses_outside(tmp_path, capfd):
    with H.rig(publisher=False, server=False) as r:
        r.sc = H.scenario(r.port, modbus={"map": H.MAP + [NARROW_VIEW]})
        r.start_server()
        s = socket.create_connection(("127.0.0.1", r.port), timeout=5)
        try:
            assert _ask(s, 1, struct.pack(">BHH", 6, 30, 25000)) == struct.pack(">BHH", 6, 30, 25000)
            assert r.image.read_inputs()[IDX["inflow"]] == 5.0
            writes = r.image.counters()["input_writes"]
            # 11 L/min: inside the physical bounds (0..20) but outside this view's 0..10
            assert _ask(s, 2, struct.pack(">BHH", 6, 30, 55000)) == bytes([0x86, 3])
            assert _ask(s, 3, struct.pack(">BHHBH", 16, 30, 1, 2, 50001)) == bytes([0x90, 3])
            assert r.image.counters()["input_writes"] == writes
            assert r.image.read_inputs()[IDX["inflow"]] == 5.0
            # the float32 view of the same actuator still takes the whole physical range
            f = struct.unpack(">HH", struct.pack(">f", 15.0))
            assert _ask(s, 4, struct.pack(">BHHBHH", 16, 0, 2, 4, *f))[:1] == bytes([16])
            assert r.image.read_inputs()[IDX["inflow"]] == 15.0
            # reading 15 through the narrowed view: 75000 raw saturates at 65535
            assert _ask(s, 5, struct.pack(">BHH", 3, 30, 1)) == struct.pack(">BBH", 3, 2, 65535)
            np.testing.assert_equal(r.image.read_inputs()[IDX["inflow"]], 15.0)
        finally:
            s.close()
        assert r.stop_server() == 0
    err = capfd.readouterr().err
    assert "inflow is written through 3 views, the last write wins" in err
    assert "holding_register 30 uint16 x5000 [0, 10] (modbus.map[17])" in err


# ---------------------------------------------------------------------------- a hung image writer


def test_a_hung_image_writer_gets_device_failure_not_a_frozen_server(capfd):
    """Another writer of the process image hangs holding its lock (stopped mid-write): a Modbus
    write waits at most the image's bounded lock wait and answers SERVER DEVICE FAILURE (04)
    with a one-line log, the server keeps answering other requests, and writes work again
    once the hung writer is gone."""
    from tests.hil.test_image import start_hung_writer

    with H.rig(publisher=False) as rig:
        s = socket.create_connection(("127.0.0.1", rig.port), timeout=10)
        try:
            write = struct.pack(">BHHB", 16, 4, 1, 2) + struct.pack(">H", 150)  # inflow 1.5 (x100)
            assert _ask(s, 1, write)[0] == 16  # served
            hung = start_hung_writer(rig.image.name)
            try:
                assert _ask(s, 2, write) == bytes([16 | 0x80, 0x04])
                assert _ask(s, 3, struct.pack(">BHH", 4, 0, 2))[0] == 4  # reads of outputs still served
            finally:
                hung.kill()
                hung.join(10)
            write2 = struct.pack(">BHHB", 16, 4, 1, 2) + struct.pack(">H", 250)
            assert _ask(s, 4, write2)[0] == 16  # the dead writer's lock is gone: served again
            np.testing.assert_allclose(rig.image.read_inputs(timeout_s=5.0)[IDX["inflow"]], 2.5)
        finally:
            s.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "InputsStale" in err
