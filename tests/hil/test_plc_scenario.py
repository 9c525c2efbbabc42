"""The claims configs/bioreactor_plc.toml makes about which loops the process needs, checked.

Lockstep, 10 h of the batch from the scenario's mid-batch start, no PLC connected: every input
stays at the value it is given here, which is where a loop that is not wired would leave it, or
where a saturated loop sits (the DO loop at its agitation floor, softplc.loops "do" out_min).
Tolerances are wide on purpose: the statements are about which side of the setpoint the
process ends on, not the third digit.
"""

import pytest

from hil.scenario.config import load_scenario
from hil.runtime import Runtime
from tests.hil.test_config import ROOT

AGITATION_FLOOR_W = 0.5  # softplc.loops "do" out_min


def _after_10h(**inputs) -> dict:
    overrides = {"inputs": {name: {"value": value} for name, value in inputs.items()}}
    sc = load_scenario(ROOT / "configs/bioreactor_plc.toml", overrides)
    with Runtime(sc, lockstep=True, duration_s=36000.0, record=False) as runtime:
        summary = runtime.run()
        assert summary.state == "stopped" and summary.steps == 36000
        return {n: float(runtime.plant.y[runtime.spec.index("outputs", n)]) for n in runtime.spec.names("outputs")}


@pytest.fixture(scope="module")
def do_loop_alone():
    """The DO loop alone: nominal feed (0.042 L/h), agitation driven down to its floor."""
    return _after_10h(agitation_power=AGITATION_FLOOR_W)


def test_agitation_alone_cannot_bring_do_down_to_70(do_loop_alone):
    assert do_loop_alone["glucose"] < 0.15  # starved: 1.0 g/L at start, ~0.1 after 10 h
    assert do_loop_alone["dissolved_oxygen"] > 75.0  # ~81 % with agitation at its floor


def test_a_fed_culture_gives_the_do_loop_authority():
    fed = _after_10h(agitation_power=AGITATION_FLOOR_W, feed_rate=0.1)  # what the glucose loop settles to
    assert fed["glucose"] > 0.5
    assert fed["dissolved_oxygen"] < 70.0  # ~66 %: agitation must rise above its floor to hold 70 %


def test_without_base_ph_falls_and_temperature_barely_moves(do_loop_alone):
    fed = _after_10h(agitation_power=AGITATION_FLOOR_W, feed_rate=0.1)
    assert do_loop_alone["ph"] < 4.8 and fed["ph"] < 4.6  # from 5.0: ~4.72 starved, ~4.49 fed
    assert abs(fed["temperature"] - 298.0) < 0.2  # +0.07 K in 10 h without cooling
