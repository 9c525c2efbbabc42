"""Dashboard panels resolved for each plant: the plant's declared panels, chosen signals,
setpoints from the scenario's controllers and limits from its monitor rules."""

import pytest

from hil.scenario.config import load_scenario
from hil.dashboard.layout import UnknownSignal, build_layout
from tests.hil.safety.helpers import CONFIG as POLICY_CONFIG

ROOT = POLICY_CONFIG.parents[1]


def _layout(config, chosen=()):
    sc = load_scenario(config)
    model = sc.plant.load()
    return model.spec, build_layout(sc, model.spec, model.panels, chosen)


def test_bioreactor_panels_carry_setpoint_and_monitor_limit():
    spec, panels = _layout(POLICY_CONFIG)
    assert [p["title"] for p in panels] == ["Dissolved oxygen", "Glucose and feed", "pH"]
    do = panels[0]
    assert [(s["name"], s["source"]) for s in do["series"]] == [("dissolved_oxygen", "y"), ("agitation_power", "u")]
    assert do["series"][0]["index"] == spec.index("outputs", "dissolved_oxygen")
    assert do["series"][1]["index"] == spec.index("inputs", "agitation_power")
    assert do["setpoints"] == [{"name": "dissolved_oxygen", "value": 40.0}]  # [safety.fallback] loop
    assert [lim["value"] for lim in do["limits"]] == [20.0]  # [[safety.monitor.rules]] do_low
    ph = panels[2]
    assert ph["setpoints"] == [{"name": "ph", "value": 5.0}] and [lim["value"] for lim in ph["limits"]] == [6.0]


def test_grid_heat_map_covers_every_bus_and_bars_every_line():
    spec, panels = _layout(ROOT / "configs" / "grid118.toml")
    heat = next(p for p in panels if p["kind"] == "heatmap")
    bars = next(p for p in panels if p["kind"] == "bars")
    vm = next(g for g in spec.groups if g.kind == "outputs" and g.name == "bus.vm")
    assert [s["index"] for s in heat["series"]] == list(range(vm.start, vm.start + 118))
    assert heat["band"] == [0.95, 1.05]
    assert len(bars["series"]) == 186 and {s["unit"] for s in bars["series"]} == {"%"}
    freq = next(p for p in panels if p["title"] == "Frequency")
    assert freq["setpoints"] == [{"name": "grid.frequency", "value": 50.0}]  # the AGC's [softplc] loop


def test_arm_panels_and_chosen_signals():
    spec, panels = _layout(ROOT / "configs" / "panda.toml", chosen=["gripper.width", "joint_3.q_target"])
    assert [s["name"] for s in panels[0]["series"]] == [f"joint_{k}.q" for k in range(1, 8)]
    assert [s["name"] for s in panels[1]["series"]] == ["ee.position.x", "ee.position.y", "ee.position.z"]
    chosen = panels[-1]
    assert chosen["title"] == "Chosen signals"
    assert [(s["name"], s["source"]) for s in chosen["series"]] == [("gripper.width", "y"), ("joint_3.q_target", "u")]


def test_unknown_signal_is_named():
    sc = load_scenario(POLICY_CONFIG)
    model = sc.plant.load()
    with pytest.raises(UnknownSignal, match="'glucoze'"):
        build_layout(sc, model.spec, model.panels, ["glucoze"])


@pytest.mark.parametrize("config", ["bioreactor_policy.toml", "grid118_policy.toml", "panda_policy.toml"])
def test_every_shipped_plants_layout_is_strict_json(config):
    """The page's hello goes out as JSON: an unbounded signal (the arm's end-effector position)
    is a null bound, never Infinity (which JSON has not: the layout request failed with a 500)."""
    import json

    _, panels = _layout(ROOT / "configs" / config)
    json.dumps(panels, allow_nan=False)
    if config.startswith("panda"):
        ee = [s for p in panels for s in p["series"] if s["name"].startswith("ee.position")]
        assert ee and all(s["low"] is None and s["high"] is None for s in ee)
