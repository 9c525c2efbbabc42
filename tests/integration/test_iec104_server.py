"""The IEC 60870-5-104 server process (adapters/iec104.py, started as `hil run` starts it:
adapters.process.start_servers) over a process image this test publishes into, with two
clients we did not write, over real sockets on 127.0.0.1:

- c104's Client (lib60870-C's client side: the same library as the server, another code path);
- scapy's IEC 104 layer (scapy.contrib.scada.iec104: frames encoded and decoded by an
  implementation independent of lib60870), driven by tests/integration/iec104_scapy.py.

The plant is case14 (the grid plant); the map serves frequency, bus voltages, line flows,
breakers as double points, unit set-points, breaker double commands and unit single commands.
"""

import datetime as dt
import math
import time
from pathlib import Path

import numpy as np
import pytest

c104 = pytest.importorskip("c104")
pytest.importorskip("scapy.contrib.scada.iec104")

from adapters.process import start_servers, stop_servers  # noqa: E402
from hil.scenario.config import parse_scenario  # noqa: E402
from hil.image import ProcessImage  # noqa: E402
from tests.integration.iec104_c104 import Wire, command, open_connection, refused  # noqa: E402
from tests.integration.iec104_scapy import NEGATIVE, POSITIVE, ScapyIec104  # noqa: E402
from tests.integration.net import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CA = 7
pytestmark = pytest.mark.timeout(180)
WAIT_S = 60.0   # bound of a handshake-style wait (a sample of a publish); generous on a loaded machine


def _scenario(port: int):
    return parse_scenario({
        "scenario": {"name": "grid14_104"},
        "plant": {"model": "grid", "case": str(ROOT / "configs/grids/case14.m")},
        "loop": {"step_s": 0.1, "duration_s": 10.0, "priority": 0, "cpu": -1},
        "inputs": {"gen_1.p_set": {"driver": "fixed", "value": 100.0}},
        "iec104": {"port": port, "common_address": CA, "tick_ms": 50, "points": [
            {"signal": "grid.frequency", "ioa": 1, "deadband": 0.01},
            {"signal": "grid.islands", "ioa": 2, "report_ms": 100},        # cyclic, every 100 ms
            {"signal": "bus.vm", "ioa": 1001, "deadband": 0.001},
            {"signal": "line.p_mw", "ioa": 2001, "deadband": 1.0},
            {"signal": "line.closed", "ioa": 4001, "type": "double_point"},
            {"signal": "gen.p_set", "ioa": 15001},
            {"signal": "line.close_cmd", "off_signal": "line.open_cmd", "type": "double_command", "ioa": 14001},
            {"signal": "gen.on", "type": "single_command", "ioa": 16001},
        ]},
    })


@pytest.fixture()
def served():
    port = free_port()
    sc = _scenario(port)
    spec = sc.plant.load().spec
    image = ProcessImage.create(len(spec.names("inputs")), len(spec.names("outputs")))
    image.write_inputs(np.arange(image.n_inputs), spec.nominal("inputs"))
    servers = start_servers(sc, image.name)
    try:
        yield sc, spec, image, port
    finally:
        stop_servers(servers)
        image.close()


def _outputs(spec, **changes) -> np.ndarray:
    y = spec.nominal("outputs").copy()
    for name, v in changes.items():
        y[spec.index("outputs", name)] = v
    return y


def _publish(image, spec, step: int, y: np.ndarray) -> float:
    """Publish outputs; returns the wall time (s since the epoch) just before."""
    t = time.time()
    image.publish(y, image.read_inputs(), step, 0.1 * step)
    return t


def _gi_until(client: ScapyIec104, ioa: int, want: float) -> dict:
    """Interrogate until object `ioa` carries `want` (the server sampled the publish)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        objs = client.interrogation(CA)
        if ioa in objs and objs[ioa][1].scaled_value == np.float32(want):
            return objs
        assert time.monotonic() < deadline, f"IOA {ioa} never served {want}"
        time.sleep(0.05)


def _cp56(io) -> dt.datetime:
    return dt.datetime(2000 + io.year, io.month, io.day_of_month, io.hours, io.minutes, io.sec_milli // 1000,
                       (io.sec_milli % 1000) * 1000, tzinfo=dt.timezone.utc)


def test_before_the_first_publish_objects_are_invalid_and_commands_refused(served):
    sc, spec, image, port = served
    before = image.read_inputs()
    with ScapyIec104("127.0.0.1", port) as c:
        c.startdt()
        objs = c.interrogation(CA)
        assert len(objs) == 2 + 14 + 20 + 20          # every monitor object of the map
        assert all(io.iv == 1 for _, io in objs.values())
        assert c.setpoint(CA, 15002, 30.0, select=True).ack == POSITIVE      # c104 confirms the select
        assert c.setpoint(CA, 15002, 30.0, select=False).ack == NEGATIVE     # no loop to take it yet
    np.testing.assert_array_equal(image.read_inputs(), before)


def test_general_interrogation_returns_every_object_with_the_image_values(served):
    sc, spec, image, port = served
    rng = np.random.default_rng(3)
    changes = {f"bus_{b}.vm": float(rng.uniform(0.95, 1.05)) for b in range(1, 15)}
    changes |= {f"line_{k}.p_mw": float(rng.uniform(-80, 80)) for k in range(1, 21)}
    changes |= {"grid.frequency": 49.93, "line_3.closed": 0.0, "line_7.closed": 0.0}
    y = _outputs(spec, **changes)
    t_before = _publish(image, spec, 1, y)
    with ScapyIec104("127.0.0.1", port) as c:
        c.startdt()
        objs = _gi_until(c, 1, 49.93)
    t_after = time.time()
    want = {1: ("M_ME_TF_1", y[spec.index("outputs", "grid.frequency")]),
            2: ("M_ME_TF_1", y[spec.index("outputs", "grid.islands")])}
    want |= {1000 + b: ("M_ME_TF_1", y[spec.index("outputs", f"bus_{b}.vm")]) for b in range(1, 15)}
    want |= {2000 + k: ("M_ME_TF_1", y[spec.index("outputs", f"line_{k}.p_mw")]) for k in range(1, 21)}
    want |= {4000 + k: ("M_DP_TB_1", y[spec.index("outputs", f"line_{k}.closed")]) for k in range(1, 21)}
    assert sorted(objs) == sorted(want)
    for ioa, (tname, value) in want.items():
        got_type, io = objs[ioa]
        assert got_type == tname and io.iv == 0, ioa
        if tname == "M_ME_TF_1":
            assert io.scaled_value == np.float32(value), ioa        # short float: float32 of the image's value
        else:
            assert io.dpi_value == (2 if value == 1.0 else 1), ioa  # DPI 2 ON (closed), 1 OFF (open)
        # the time tag: the publish's wall time, UTC, to the millisecond
        assert t_before - 0.001 <= _cp56(io).timestamp() <= t_after, ioa
    # c104's client sees the same objects and values
    cl = c104.Client(tick_rate_ms=50, command_timeout_ms=10_000)
    con = cl.add_connection(ip="127.0.0.1", port=port, init=c104.Init.NONE)
    st = con.add_station(common_address=CA)

    def on_new_point(client: c104.Client, station: c104.Station, io_address: int, point_type: c104.Type) -> None:
        station.add_point(io_address=io_address, type=point_type)

    cl.on_new_point(callable=on_new_point)
    cl.start()
    try:
        open_connection(con, WAIT_S)
        assert con.interrogation(common_address=CA)
        points = {p.io_address: p for p in st.points}
        assert sorted(points) == sorted(want)
        for ioa, (tname, value) in want.items():
            p = points[ioa]
            if tname == "M_ME_TF_1":
                assert p.value == float(np.float32(value)), ioa
            else:
                assert p.value == (c104.Double.ON if value == 1.0 else c104.Double.OFF), ioa
    finally:
        cl.stop()


def test_setpoints_select_before_operate_range_checked_and_refusals_counted(served):
    sc, spec, image, port = served
    _publish(image, spec, 1, _outputs(spec))
    i2 = spec.index("inputs", "gen_2.p_set")
    hi = spec.quantity("inputs", "gen_2.p_set").high
    cl = c104.Client(tick_rate_ms=50, command_timeout_ms=10_000)
    con = cl.add_connection(ip="127.0.0.1", port=port, init=c104.Init.NONE)
    st = con.add_station(common_address=CA)
    sbo = st.add_point(io_address=15002, type=c104.Type.C_SE_NC_1, command_mode=c104.CommandMode.SELECT_AND_EXECUTE)
    direct = st.add_point(io_address=15003, type=c104.Type.C_SE_NC_1)          # execute without a select
    unknown = st.add_point(io_address=15999, type=c104.Type.C_SE_NC_1)
    sensor = st.add_point(io_address=1001, type=c104.Type.C_SE_NC_1)          # bus_1.vm: a measured value
    fixed = st.add_point(io_address=15001, type=c104.Type.C_SE_NC_1,            # gen_1.p_set is driver "fixed"
                         command_mode=c104.CommandMode.SELECT_AND_EXECUTE)
    wire = Wire(con)
    cl.start()
    try:
        open_connection(con, WAIT_S)
        assert command(sbo, 30.5, wire)                          # select, then execute: both confirmed
        assert image.read_inputs()[i2] == np.float32(30.5)
        before = image.read_inputs()
        for point, value in ((sbo, hi + 1.0), (sbo, float("nan")), (direct, 10.0), (unknown, 1.0), (sensor, 1.0),
                             (fixed, 50.0)):
            # the negative answer on the wire is what a SCADA sees; c104's client is not the judge of it:
            # its transmit() may return True on a refused command (for an unknown IOA the server sends
            # ACT_CON with P/N = 1, then the object again with COT 47 and P/N = 0, and the client can
            # take the latter, also as the answer to the next command)
            assert refused(point, value, wire, WAIT_S), (point.io_address, value, wire.received)
        np.testing.assert_array_equal(image.read_inputs(), before)     # no refused command touched the image
        assert command(sbo, 12.0, wire)                                  # and the server still takes commands
        assert image.read_inputs()[i2] == 12.0
    finally:
        cl.stop()


def test_refusal_counters_reach_the_run_summary():
    port = free_port()
    sc = _scenario(port)
    spec = sc.plant.load().spec
    image = ProcessImage.create(len(spec.names("inputs")), len(spec.names("outputs")))
    servers = start_servers(sc, image.name)
    try:
        _publish(image, spec, 1, _outputs(spec))
        hi = spec.quantity("inputs", "gen_2.p_set").high
        with ScapyIec104("127.0.0.1", port) as c:
            c.startdt()
            assert c.setpoint(CA, 15002, hi + 5.0, select=True).ack == POSITIVE
            assert c.setpoint(CA, 15002, hi + 5.0, select=False).ack == NEGATIVE     # out of range
            assert c.setpoint(CA, 15999, 1.0, select=True).ack == NEGATIVE           # unknown IOA (COT 47)
            assert c.setpoint(CA, 15002, 40.0, select=True).ack == POSITIVE
            assert c.setpoint(CA, 15002, 40.0, select=False).ack == POSITIVE
        image_value = image.read_inputs()[spec.index("inputs", "gen_2.p_set")]
    finally:
        counters = stop_servers(servers)["iec104"]
        image.close()
    assert counters["commands_accepted"] == 1
    assert counters["commands_refused"] == {"out_of_range": 1, "unknown_ioa": 1}
    assert image_value == 40.0
    # monitor: frequency, islands, 14 buses, 20 lines, 20 breakers; commands: units 2-5 (unit 1 is
    # driven "fixed", so its set-point is no command object), 20 breakers, 5 unit commands
    assert counters["connections"] == 1 and counters["points"] == 2 + 14 + 20 + 20 + 4 + 20 + 5


def test_breaker_double_commands_held_and_pulsed(served):
    sc, spec, image, port = served
    _publish(image, spec, 1, _outputs(spec))
    o3, c3 = spec.index("inputs", "line_3.open_cmd"), spec.index("inputs", "line_3.close_cmd")
    with ScapyIec104("127.0.0.1", port) as c:
        c.startdt()
        assert c.double_command(CA, 14003, on=False, select=True).ack == POSITIVE
        assert c.double_command(CA, 14003, on=False, select=False).ack == POSITIVE
        u = image.read_inputs()
        assert (u[o3], u[c3]) == (1.0, 0.0)                       # OFF: open held, close cleared
        assert c.double_command(CA, 14003, on=True, select=True).ack == POSITIVE
        assert c.double_command(CA, 14003, on=True, select=False).ack == POSITIVE
        u = image.read_inputs()
        assert (u[o3], u[c3]) == (0.0, 1.0)                       # ON: close held, open cleared
        # a short pulse (QU 1): OFF writes open 1, close 0; once the loop has read it, open goes back to 0
        assert c.double_command(CA, 14004, on=False, select=True, qu=1).ack == POSITIVE
        assert c.double_command(CA, 14004, on=False, select=False, qu=1).ack == POSITIVE
    o4, c4 = spec.index("inputs", "line_4.open_cmd"), spec.index("inputs", "line_4.close_cmd")
    u = image.read_inputs()
    assert (u[o4], u[c4]) == (1.0, 0.0)
    assert image.read_inputs_into(np.empty(image.n_inputs), mark_applied=True)    # the loop's read
    deadline = time.monotonic() + WAIT_S
    while image.read_inputs()[o4] != 0.0:
        assert time.monotonic() < deadline, "the pulse was never released"
        time.sleep(0.02)
    assert image.read_inputs()[c4] == 0.0 and image.read_inputs()[c3] == 1.0   # the held command stays


def _reference_reports(values: list[float], deadband: float) -> list[float]:
    """Spontaneous reports of one object, written out: report when |v - last reported| > deadband."""
    out, last = [], None
    for v in values:
        if last is None or abs(v - last) > deadband:
            out.append(v)
            last = v
    return out


def test_spontaneous_reports_respect_the_deadband(served):
    sc, spec, image, port = served
    vm = [1.0, 1.0004, 1.0008, 1.0012, 1.0015, 1.0001, 0.9990, 0.99895]
    closed = [1, 1, 1, 0, 0, 0, 1, 1]
    with ScapyIec104("127.0.0.1", port) as c:
        c.startdt()
        for step, (v, cl) in enumerate(zip(vm, closed), start=1):
            marker = 50.0 + 0.1 * step           # frequency: 0.1 Hz per step against a 0.01 Hz deadband
            _publish(image, spec, step, _outputs(spec, **{"bus_1.vm": v, "line_2.closed": float(cl),
                                                          "grid.frequency": marker}))
            deadline = time.monotonic() + WAIT_S  # handshake: the marker's report says this publish was sampled
            while not any(o[0] == 1 and o[2].scaled_value == np.float32(marker) for o in c.spontaneous):
                c.wait_spontaneous(0.2)
                assert time.monotonic() < deadline, f"step {step} never reported"
        c.wait_spontaneous(0.3)
    vm_reports = [io.scaled_value for ioa, _, io in c.spontaneous if ioa == 1001]
    dp_reports = [io.dpi_value for ioa, _, io in c.spontaneous if ioa == 4002]
    # the first publish reports every object (its quality went from IV to valid); then the deadband
    assert vm_reports == [np.float32(v) for v in _reference_reports(vm, 0.001)]
    assert vm_reports == [np.float32(v) for v in (1.0, 1.0012, 1.0001, 0.9990)]
    assert dp_reports == [2, 1, 2]
    # objects that never moved: reported once, at the first publish
    assert sum(1 for ioa, _, _ in c.spontaneous if ioa == 1005) == 1
    assert all(math.isfinite(io.scaled_value) for ioa, t, io in c.spontaneous if t == "M_ME_TF_1")


def test_cyclic_reports_carry_the_current_value(served):
    sc, spec, image, port = served
    _publish(image, spec, 1, _outputs(spec, **{"grid.islands": 2.0}))
    with ScapyIec104("127.0.0.1", port) as c:
        c.startdt()
        deadline = time.monotonic() + WAIT_S      # three periodic reports (COT 1) of IOA 2, none of the others
        while sum(1 for o in c.cyclic if o[0] == 2 and o[2].scaled_value == 2.0) < 3:
            c.wait_spontaneous(0.2)
            assert time.monotonic() < deadline, c.cyclic
    assert {o[0] for o in c.cyclic} == {2}
