"""[bus], [policy] and [safety] validation: key paths and reasons."""

import pytest

from hil.errors import ConfigError

from .helpers import merge as merge_changes
from .helpers import scenario


def _problems(changes=None, drop=()):
    with pytest.raises(ConfigError) as exc:
        scenario(changes, drop)
    return dict(exc.value.problems)


def test_the_shipped_policy_scenario_is_valid():
    sc = scenario()
    assert sc.bus.watchdog_steps(sc.loop.step_s) == 2
    assert sc.safety.mode == "shadow" and sc.policy.version == "v1"


def test_spec_dependent_problems_name_their_key_paths():
    p = _problems({"safety": {
        "projection": {"box": {"agitation_power": [0.0, 500.0], "feed_rate": [0.0, 0.1]},
                       "rate": {"base_flow": -1.0},
                       "linear": [{"name": "x", "w": {"agitation_power": 1.0}, "b": {"nonsense": 1.0}}]},
        "monitor": {"rules": [{"name": "r", "signal": "oxygen", "op": "<", "limit": 1.0}]},
        "fallback": {"fixed": {"base_flow": 0.001}},
    }, "bus": {"fallback_action": {"feed_rate": 0.1}}})
    assert "outside the physical bounds [0.0, 100.0] W" in p["safety.projection.box.agitation_power"]
    assert "is not an action input" in p["safety.projection.box.feed_rate"]
    assert "not a positive rate" in p["safety.projection.rate.base_flow"]
    assert "nonsense" in p["safety.projection.linear[0].b.nonsense"]
    assert "oxygen" in p["safety.monitor.rules[0].signal"]
    assert "already driven by safety.fallback.loops[1]" in p["safety.fallback.fixed.base_flow"]
    assert "not driven by the bus" in p["bus.fallback_action.feed_rate"]


def test_schema_problems():
    p = _problems({"safety": {"mode": "autopilot", "confidence": {"mahalanobis_enter": 3.0,
                                                                   "mahalanobis_exit": 5.0}},
                   "bus": {"transport": "udp"}})
    assert "safety.mode" in p and "bus.transport" in p
    assert "hysteresis" in p["safety.confidence"]
    p = _problems({"policy": {"entry": "pkg.mod:f"}})  # directory and entry both given
    assert "exactly one of directory, entry, onnx" in p["policy"]


def test_every_action_needs_a_fallback_and_ipc_paths_fit():
    p = _problems({"safety": {"fallback": {"loops": [], "fixed": {"base_flow": 0.0}}},
                   "bus": {"ipc_dir": "/tmp/" + "x" * 120}})
    assert "no fallback for agitation_power" in p["safety.fallback"]
    assert "longer than" in p["bus.ipc_dir"]


def test_shadowing_a_plc_driven_input_is_limited_to_shadow_and_advisory():
    watch = {"inputs": {"agitation_power": {"driver": "plc"}},
             "policy": {"inputs": ["base_flow", "agitation_power"]}}
    p = _problems(watch, drop=("bus.fallback_action",))
    assert "cannot act on agitation_power" in p["safety.rollout.max_mode"]
    sc = scenario(merge_changes(watch, {"safety": {"rollout": {"max_mode": "advisory"}}}),
                  drop=("bus.fallback_action",))
    assert sc.safety.rollout.max_mode == "advisory"
