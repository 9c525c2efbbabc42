"""Scenario validation: every bad value gets one error naming its key path and why."""

import copy
import tomllib
from pathlib import Path

import pytest

from hil.scenario.config import load_scenario, parse_scenario
from hil.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
BASE = tomllib.loads((ROOT / "configs/bioreactor.toml").read_text())


def _with(**changes):
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        if value is _DELETE:
            node.pop(last)
        else:
            node[last] = value
    return data


_DELETE = object()


def test_shipped_scenario_is_valid():
    sc = load_scenario(ROOT / "configs/bioreactor.toml")
    assert sc.plant.model == "bioreactor" and sc.loop.period_s == pytest.approx(1 / 60)


@pytest.mark.parametrize(
    "changes, path, reason",
    [
        ({"plant__model": "fermenter"}, "plant.model", "unknown plant 'fermenter'"),
        ({"plant__parameters": {"mu_max": 0.1}}, "plant.parameters.mu_max", "has no param 'mu_max'"),
        ({"plant__parameters": {"mu_x": 5.0}}, "plant.parameters.mu_x", "outside the physical bounds"),
        ({"plant__initial_state": {"volume": 1000.0}}, "plant.initial_state.volume", "outside the physical bounds"),
        ({"loop__step_s": -1.0}, "loop.step_s", "greater than 0"),
        ({"loop__step_s": "fast"}, "loop.step_s", "valid number"),
        ({"loop__priority": 120}, "loop.priority", "an integer 0..99"),
        ({"loop__duration_s": _DELETE}, "loop.duration_s", "required key is missing"),
        ({"loop__period": 0.01}, "loop.period", "unknown key"),
        ({"inputs__feed_rate__driver": "scada"}, "inputs.feed_rate.driver", "'plc', 'fixed', 'profile' or 'bus'"),
        ({"inputs__feed_rate__profile": [[0.0, 0.1], [10.0, 9.0]]}, "inputs.feed_rate.profile[1]", "outside [0.0, 0.5]"),
        ({"inputs__feed_rate__profile": [[10.0, 0.1], [5.0, 0.2]]}, "inputs.feed_rate.profile", "strictly increasing"),
        ({"inputs__stirrer": {"driver": "fixed", "value": 1.0}}, "inputs.stirrer", "has no input 'stirrer'"),
        ({"inputs__aeration_rate__value": _DELETE}, "inputs.aeration_rate.value", "fixed input needs a value"),
        ({"scenario__name": "my scenario"}, "scenario.name", "is not a name"),
        ({"recording__decimate": 0}, "recording.decimate", "greater than or equal to 1"),
    ],
)
def test_bad_values_name_the_key_and_the_reason(changes, path, reason):
    with pytest.raises(ConfigError) as info:
        parse_scenario(_with(**changes))
    paths = [p for p, _ in info.value.problems]
    assert path in paths, info.value
    assert reason in str(info.value), str(info.value)


def test_several_problems_are_reported_together():
    with pytest.raises(ConfigError) as info:
        parse_scenario(_with(loop__step_s=0, loop__seed=-3))
    assert {p for p, _ in info.value.problems} == {"loop.step_s", "loop.seed"}


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read scenario"):
        load_scenario(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[loop\nstep_s = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_scenario(bad)


def test_overrides_are_merged_deeply():
    sc = load_scenario(ROOT / "configs/bioreactor.toml", {"loop": {"time_scale": 1000.0}, "plant": {"parameters": {"K_x": 0.2}}})
    assert sc.loop.time_scale == 1000.0
    assert sc.plant.parameters == {"mu_x": 0.092, "K_x": 0.2}


def test_scenario_pickles_for_worker_processes():
    import pickle

    sc = load_scenario(ROOT / "configs/bioreactor.toml")
    assert pickle.loads(pickle.dumps(sc)) == sc


def test_renamed_bus_spin_us_is_refused_naming_the_new_key():
    root = Path(__file__).resolve().parents[2]
    with pytest.raises(ConfigError) as exc:
        load_scenario(root / "configs" / "bioreactor_policy.toml", {"bus": {"spin_us": 5.0}})
    assert "bus.spin_us" in str(exc.value) and "renamed answer_spin_us" in str(exc.value)
    sc = load_scenario(root / "configs" / "bioreactor_policy.toml", {"bus": {"answer_spin_us": 5.0}})
    assert sc.bus.answer_spin_us == 5.0


def test_in_loop_shield_placement_refuses_what_it_cannot_enforce():
    root = Path(__file__).resolve().parents[2]
    # the bioreactor's fallback is a PID loop: the in-loop shield runs it (hil/loop/shield.py FB_PID)
    sc = load_scenario(root / "configs" / "bioreactor_policy.toml", {"safety": {"placement": "loop"}})
    assert sc.safety.placement == "loop" and len(sc.safety.fallback.loops) == 2
    # a policy slower than the loop needs the in-loop shield
    with pytest.raises(ConfigError) as exc:
        load_scenario(root / "configs" / "panda_policy.toml", {"safety": {"placement": "process"}})
    assert "policy.rate_hz" in str(exc.value) and "safety.placement" in str(exc.value)
    sc = load_scenario(root / "configs" / "panda_policy.toml",
                       {"safety": {"placement": "process"}, "policy": {"rate_hz": 1000.0}})
    assert sc.policy.every_steps(sc.loop.step_s) == 1
