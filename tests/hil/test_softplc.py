"""SoftPLC: [softplc] validation and the scan state machine (I/O replaced by a fake link)."""

import math

import pytest

from hil.scenario.config import parse_scenario
from hil.errors import ConfigError
from hil.softplc.io import CommError, plan_blocks, MAX_READ, MAX_WRITE
from hil.softplc.scan import SoftPlc
from tests.integration import modbus_helpers as H

LEVEL = {"name": "level", "measurement": "level", "output": "inflow", "setpoint": 50.0, "kp": 0.2, "ki": 0.5}
TEMP = {"name": "temp", "measurement": "temperature", "output": "coolant", "setpoint": 310.0, "kp": 0.5,
        "ki": 0.5, "reverse": True}
PLC = {"scan_ms": 50, "comm_loss_scans": 3, "loops": [LEVEL, TEMP], "outputs": {"pump": 1.0},
       "safe_outputs": {"inflow": 0.0, "coolant": 25.0}}


def _sc(time_scale=1.0, **changes):
    plc = {**PLC, **changes}
    return parse_scenario(H.scenario_dict(5020, softplc=plc, time_scale=time_scale))


def _problems(**changes):
    with pytest.raises(ConfigError) as info:
        _sc(**changes)
    return dict(info.value.problems)


@pytest.mark.parametrize(
    "changes, path, reason",
    [
        ({"loops": [{**LEVEL, "measurement": "pressure"}]}, "softplc.loops[0].measurement", "not mapped in [modbus]"),
        ({"loops": [{**LEVEL, "output": "valve"}]}, "softplc.loops[0].output", "mapped read-only"),
        ({"loops": [{**LEVEL, "output": "level"}]}, "softplc.loops[0].output", "mapped read-only"),
        ({"loops": [LEVEL, {**TEMP, "output": "inflow"}]}, "softplc.loops[1].output", "already driven by softplc.loops[0]"),
        ({"loops": [{**LEVEL, "setpoint": 150.0}]}, "softplc.loops[0].setpoint", "outside level's bounds"),
        ({"loops": [{**LEVEL, "out_max": 30.0}]}, "softplc.loops[0].out_max", "outside inflow's bounds [0.0, 20.0]"),
        ({"loops": [{**LEVEL, "out_min": 5.0, "out_max": 1.0}]}, "softplc.loops[0]", "must be below out_max"),
        ({"loops": [{**LEVEL, "ki": -1.0}]}, "softplc.loops[0].ki", "greater than or equal to 0"),
        ({"loops": [LEVEL, {**TEMP, "name": "level"}]}, "softplc.loops[1].name", "duplicate loop name"),
        ({"safe_outputs": {"inflow": 99.0}}, "softplc.safe_outputs.inflow", "outside [0.0, 20.0]"),
        ({"safe_outputs": {"trim": 0.0}}, "softplc.safe_outputs.trim", "neither a loop output nor a fixed output"),
        ({"outputs": {"inflow": 1.0}}, "softplc.outputs.inflow", "already driven by softplc.loops[0]"),
        ({"outputs": {"valve": 1.0}}, "softplc.outputs.valve", "mapped read-only"),
        ({"scan_ms": 1.0}, "softplc.scan_ms", "greater than or equal to 5"),
        ({"reconnect_min_ms": 5000.0}, "softplc", "must not exceed reconnect_max_ms"),
        ({"scan": 100}, "softplc.scan", "unknown key"),
    ],
)
def test_bad_softplc_sections_name_the_key(changes, path, reason):
    problems = _problems(**changes)
    assert path in problems, problems
    assert reason in problems[path]


def test_softplc_needs_a_modbus_section():
    data = H.scenario_dict(5020, softplc=PLC)
    del data["modbus"]
    with pytest.raises(ConfigError) as info:
        parse_scenario(data)
    assert dict(info.value.problems)["softplc"].startswith("needs a [modbus] section")


def test_blocks_merge_contiguous_tags_only():
    sc = H.scenario(5020)
    from hil.tagmap.modbus import compile_map

    cmap = compile_map(sc.modbus, H.SPEC, sc)
    hr = {t.address: t for t in cmap.tags if t.table == "holding_register"}
    blocks = plan_blocks([hr[0], hr[2], hr[5], hr[6]], MAX_WRITE)
    assert [(b.address, b.count) for b in blocks] == [(0, 4), (5, 3)]
    ir = [t for t in cmap.tags if t.table == "input_register"]
    blocks = plan_blocks(ir, MAX_READ)
    assert [(b.address, b.count) for b in blocks] == [(0, 4), (10, 8), (20, 2)]


# ---------------------------------------------------------------------------- state machine


class FakeLink:
    """Stands in for ModbusMaster: a first-order plant behind a link that can fail."""

    def __init__(self, plc: SoftPlc):
        self.up = True
        self.connected = False
        self.requests = 0
        self.values = {"level": 0.0, "temperature": 330.0}
        self.commands = {"inflow": 3.0, "coolant": 4.0, "pump": 0.0}
        self.writes: list[dict] = []
        self.plc = plc

    def connect(self):
        self.connected = self.up
        return self.up

    def close(self):
        self.connected = False

    def read(self, blocks):
        if not self.up:
            self.connected = False
            raise CommError("link down")
        out = {}
        for b in blocks:
            for t in b.tags:
                out[t] = self.values[t.signal] if t.kind == "output" else self.commands[t.signal]
        return out

    def write(self, blocks, values):
        if not self.up:
            raise CommError("link down")
        w = {t.signal: values[t] for b in blocks for t in b.tags}
        self.commands.update(w)
        self.writes.append(w)
        return []


@pytest.fixture
def plc():
    p = SoftPlc(_sc(recovery_hold_scans=2))
    p.master = FakeLink(p)
    return p


def _scans(plc, n, t0=0.0):
    for i in range(n):
        plc.scan(t0 + i * plc.period_s)


def test_first_scan_starts_bumplessly_from_the_commanded_outputs(plc):
    plc.master.values = {"level": 50.0, "temperature": 310.0}  # at setpoint: e = 0
    _scans(plc, 1)
    assert plc.master.writes[0] == {"inflow": 3.0, "coolant": 4.0, "pump": 1.0}
    assert plc.state == "run"


def test_outputs_are_written_every_scan_in_one_block(plc):
    _scans(plc, 5)
    assert len(plc.master.writes) == 5
    hr = [b for b in plc.write_blocks if b.table == "holding_register"]
    assert [(b.address, b.count) for b in hr] == [(0, 4)]  # inflow + coolant: one FC16


def test_comm_loss_goes_to_safe_outputs_then_holds_them_on_recovery_then_resumes(plc):
    _scans(plc, 5)
    plc.master.up = False
    _scans(plc, 2, 1.0)
    assert plc.state == "run" and plc.stats.comm_errors == 2  # not yet lost
    _scans(plc, 1, 2.0)
    assert plc.state == "comm_loss" and plc.stats.comm_losses == 1
    n_writes = len(plc.master.writes)
    _scans(plc, 20, 3.0)  # reconnect attempts back off; nothing can be written
    assert len(plc.master.writes) == n_writes
    assert plc.stats.connect_failures >= 3 and plc.stats.connect_failures < 20
    plc.master.up = True
    plc.master.values = {"level": 50.0, "temperature": 310.0}
    _scans(plc, 40, 100.0)  # past any back-off
    assert plc.stats.recoveries == 1 and plc.state == "run"
    after = plc.master.writes[n_writes:]
    # recovery_hold_scans = 2 scans write the safe image (and the fixed output) unchanged
    assert after[0] == after[1] == {"inflow": 0.0, "coolant": 25.0, "pump": 1.0}
    # then the loops resume bumplessly from it: at zero error the output stays put
    assert after[2]["inflow"] == pytest.approx(0.0, abs=1e-12)
    assert after[2]["coolant"] == pytest.approx(25.0, abs=1e-12)


def test_short_outage_holds_outputs_and_skips_the_program(plc):
    _scans(plc, 3)
    before = dict(plc.image)
    plc.master.up = False
    _scans(plc, 2, 1.0)
    assert plc.image == before
    plc.master.up = True
    _scans(plc, 1, 1.2)  # after the 100 ms reconnect back-off
    assert plc.stats.comm_losses == 0 and plc.state == "run"


def test_scan_log_has_one_row_per_scan(plc):
    _scans(plc, 4)
    plc.master.up = False
    _scans(plc, 1, 1.0)
    df = plc.scan_log()
    assert len(df) == 5 and list(df["ok"]) == [True] * 4 + [False]
    assert {"sp.level", "pv.level", "out.level", "out.temp"} <= set(df.columns)
    assert math.isnan(df["pv.level"].iloc[-1])


def test_run_keeps_its_scan_count_and_stops_on_duration():
    p = SoftPlc(_sc(scan_ms=20))
    p.master = FakeLink(p)
    stats = p.run(duration_s=0.5)
    # 25 deadlines in 0.5 s; a loaded CI machine may overrun a few, never scan extra
    assert stats["scans"] + stats["overruns"] in range(24, 27)
    assert stats["good_scans"] == stats["scans"]


@pytest.mark.parametrize("clock, scale", [("wall", 1.0), ("sim", 10.0)])
def test_pid_clock_sets_the_integration_time_base(clock, scale):
    p = SoftPlc(_sc(time_scale=10.0, pid_clock=clock))
    p.master = FakeLink(p)
    p.master.values = {"level": 40.0, "temperature": 310.0}  # level error +10 %, temperature at setpoint
    _scans(p, 1)
    # bumpless start from inflow 3.0, then one integral step ki * e * dt, dt = 50 ms x scale
    assert p.master.writes[0]["inflow"] == pytest.approx(3.0 + 0.5 * 10.0 * 0.05 * scale, abs=1e-12)
