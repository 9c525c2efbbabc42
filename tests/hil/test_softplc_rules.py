"""SoftPLC threshold rules (hil/softplc/rules.py): the relay state machine, [[softplc.rules]]
validation and the scan program writing a rule's outputs (I/O replaced by a fake link)."""

import math

import pytest

from hil.scenario.config import parse_scenario
from hil.errors import ConfigError
from hil.softplc.rules import Rule, RuleConfig
from hil.softplc.scan import SoftPlc
from tests.hil.test_softplc import FakeLink
from tests.integration import modbus_helpers as H

LEVEL = {"name": "level", "measurement": "level", "output": "inflow", "setpoint": 50.0, "kp": 0.2, "ki": 0.5}
LOW = {"name": "low_level", "measurement": "level", "below": 20.0, "pickup_s": 0.1, "reset": 30.0,
       "outputs": ["trim"], "value": 0.5, "idle": 0.0}


def _sc(rules, **changes):
    plc = {"scan_ms": 50, "loops": [LEVEL], "rules": rules, **changes}
    return parse_scenario(H.scenario_dict(5020, softplc=plc))


def test_rule_picks_up_after_its_delay_releases_with_hysteresis_and_holds_on_bad():
    r = Rule(RuleConfig(**LOW))
    assert not r.update(10.0, 0.05)           # below, 50 ms of the 100 ms pickup
    assert not r.update(25.0, 0.05)           # back above: the timer restarts
    assert not r.update(10.0, 0.05)
    assert r.update(10.0, 0.05) and r.output() == 0.5 and r.trips == 1
    assert r.update(25.0, 0.05)               # above the threshold but below reset: still active
    assert r.update(math.nan, 0.05)           # Bad measurement: state held
    assert not r.update(30.0, 0.05) and r.output() == 0.0
    latched = Rule(RuleConfig(**{**LOW, "latch": True, "pickup_s": 0.0}))
    assert latched.update(5.0, 0.05) and latched.update(99.0, 0.05)   # latched: never releases
    above = Rule(RuleConfig(**{**LOW, "below": None, "above": 80.0, "reset": 70.0}))
    assert not above.update(85.0, 0.05) and above.update(85.0, 0.05)
    assert above.update(75.0, 0.05) and not above.update(70.0, 0.05)


@pytest.mark.parametrize("rule, path, reason", [
    ({**LOW, "measurement": "pressure"}, "softplc.rules[0].measurement", "not mapped in [modbus]"),
    ({**LOW, "outputs": ["inflow"]}, "softplc.rules[0].outputs[0]", "already driven by softplc.loops[0]"),
    ({**LOW, "outputs": ["valve"]}, "softplc.rules[0].outputs[0]", "mapped read-only"),
    ({**LOW, "value": 1e6}, "softplc.rules[0].value", "outside"),
    ({**LOW, "above": 3.0}, "softplc.rules[0]", "exactly one of below / above"),
    ({**LOW, "reset": 10.0}, "softplc.rules[0]", "must be >= below"),
    ({**LOW, "name": "level"}, "softplc.rules[0].name", "duplicate loop name"),
])
def test_bad_rules_name_the_key(rule, path, reason):
    with pytest.raises(ConfigError) as info:
        _sc([rule])
    problems = dict(info.value.problems)
    assert path in problems, problems
    assert reason in problems[path]


def test_scan_jitter_must_stay_below_the_scan_period():
    with pytest.raises(ConfigError) as info:
        _sc([], scan_jitter_ms=50.0)
    assert "scan_jitter_ms" in str(info.value)


def test_scan_program_writes_the_rule_output_after_pickup_and_logs_it(monkeypatch):
    import hil.softplc.scan as scan_mod

    clock = {"t": 0.0}
    monkeypatch.setattr(scan_mod.time, "monotonic", lambda: clock["t"])
    plc = SoftPlc(_sc([LOW]))
    link = FakeLink(plc)
    link.commands["trim"] = 0.0
    plc.master = link
    link.values = {"level": 50.0, "temperature": 310.0}

    def scan(i):  # the scan's own clock: one period per scan
        clock["t"] = i * plc.period_s
        plc.scan(clock["t"])

    for i in range(3):
        scan(i)
    assert all(w["trim"] == 0.0 for w in link.writes)          # idle value written every scan
    link.values["level"] = 10.0
    scan(3)                                                     # 50 ms below: not yet
    assert link.writes[-1]["trim"] == 0.0
    scan(4)                                                     # 100 ms: picked up
    scan(5)
    assert link.writes[-1]["trim"] == 0.5
    log = plc.scan_log()
    assert list(log["active.low_level"])[-3:] == [0, 1, 1]
    assert log["pv.low_level"].iloc[-1] == 10.0
