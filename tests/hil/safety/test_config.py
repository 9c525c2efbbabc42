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


def test_the_loops_own_fallback_action_must_lie_inside_the_safety_envelope():
    with pytest.raises(ConfigError) as exc:
        scenario({"bus": {"fallback_action": {"agitation_power": 90.0}}})
    assert exc.value.problems == [
        ("bus.fallback_action.agitation_power", "90 W is outside the safety box [0, 80] W (safety.projection.box)"),
        ("bus.fallback_action.agitation_power", "the loop's fallback action violates linear limit 'shear' at the "
                                                "initial state: 1 * agitation_power = 90 > b = 60")]
    # inside the box, but over the shear limit at the initial state (0.6 W/L * 100 L)
    p = _problems({"bus": {"fallback_action": {"agitation_power": 70.0}},
                   "safety": {"projection": {"box": {"agitation_power": [0.0, 100.0]}}}})
    assert p["bus.fallback_action.agitation_power"] == (
        "the loop's fallback action violates linear limit 'shear' at the initial state: "
        "1 * agitation_power = 70 > b = 60")
    # a derived fallback (the input's configured value) is checked too, and says where it comes from
    with pytest.raises(ConfigError) as exc:
        scenario({"inputs": {"agitation_power": {"value": 85.0}}}, drop=("bus.fallback_action",))
    assert ("bus.fallback_action.agitation_power", "85 W (from inputs.agitation_power.value) is outside the safety "
            "box [0, 80] W (safety.projection.box)") in exc.value.problems
    # limited autonomy reachable: its tighter box holds the loop's fallback too
    p = _problems({"safety": {"rollout": {"limited_box": {"agitation_power": [5.0, 25.0]}}}})
    assert "outside the limited-autonomy box [5, 25] W" in p["bus.fallback_action.agitation_power"]
    sc = scenario({"safety": {"rollout": {"limited_box": {"agitation_power": [5.0, 25.0]}, "max_mode": "advisory"}}})
    assert sc.bus.fallback_action["agitation_power"] == 30.0  # limited never reached: fine


def test_fault_handling_keys():
    p = _problems({"safety": {"fallback": {"on_bad": "safe", "safe_output": {"agitation_power": 95.0,
                                                                                "feed_rate": 0.1}}}})
    assert "outside the loop's output range [0.0, 80.0] W" in p["safety.fallback.safe_output.agitation_power"]
    assert "not the input of a fallback loop" in p["safety.fallback.safe_output.feed_rate"]
    assert "'safe' needs safety.fallback.safe_output.base_flow" in p["safety.fallback.loops[1].on_bad"]
    p = _problems({"safety": {"confidence": {"mahalanobis": False, "disagreement": False, "consistency": False}}})
    assert "nothing is gated" in p["safety.rollout.gates.shadow.max_fallback_rate"]
    p = _problems({"safety": {"policy_lost_after_s": 0.0, "monitor": {"rules": [
        {"name": "x", "signal": "ph", "op": ">", "limit": 6.0, "on_bad": "ignore"}]}}})
    assert "safety.policy_lost_after_s" in p and "safety.monitor.rules[0].on_bad" in p
