"""The safety decision: who acts in each mode, silence, versions, monitor trips, logging."""

import shutil

import numpy as np
import pytest

from hil.bus import Message
from hil.bus.config import action_input_names
from hil.policy.store import PolicyStore
from hil.safety.core import SafetyCore
from plants.base import load_plant_module

from .helpers import POLICIES, scenario

SPEC = load_plant_module("bioreactor").SPEC
I_DO = SPEC.index("outputs", "dissolved_oxygen")
I_PH = SPEC.index("outputs", "ph")


def _core(tmp_path=None, changes=None, version="v1", store=None):
    sc = scenario(changes)
    log = []
    names = action_input_names(sc, SPEC)
    core = SafetyCore(sc, SPEC, names, store or PolicyStore(POLICIES), version, log=log.append)
    return core, log, names


def _obs(do=40.0, ph=5.0, base=0.0003, agit=13.0):
    y, u = SPEC.nominal("outputs"), SPEC.nominal("inputs")
    y[I_DO], y[I_PH] = do, ph
    u[SPEC.index("inputs", "base_flow")] = base
    u[SPEC.index("inputs", "agitation_power")] = agit
    return y, u


def _prop(step, a, version="v1", members=None):
    a = np.asarray(a, dtype=float)
    m = np.tile(a, (5, 1)) if members is None else np.asarray(members, dtype=float)
    return Message("proposal", 1, step + 1, step, float(step), 0, {"a": a, "members": m, "version": version,
                                                                   "compute_us": 1.0})


def test_shadow_mode_logs_proposals_and_never_applies_them():
    core, log, names = _core(changes={"safety": {"mode": "shadow", "rollout": {"auto_promote": False}}})
    for k in range(50):
        y, u = _obs()
        d = core.decide(k, float(k), y, u, _prop(k, [0.004, 70.0]))
        assert d.source == "baseline:shadow" and d.mode == "shadow"
        assert d.action[1] < 20.0  # the baseline's action, far from the proposal's 70 W
    decisions = [r for r in log if r["event"] == "decision"]
    assert len(decisions) == 50
    assert all(r["proposal"] == [0.004, 70.0] and r["action"][1] < 20.0 for r in decisions)
    assert core.c["policy_actions"] == 0


def test_advisory_publishes_advice_and_full_lets_the_policy_act():
    core, log, _ = _core(changes={"safety": {"mode": "advisory", "rollout": {"auto_promote": False}}})
    y, u = _obs()
    d = core.decide(0, 0.0, y, u, _prop(0, [0.0004, 14.0]))
    assert d.source == "baseline:advisory"
    np.testing.assert_allclose(d.advice, [0.0004, 14.0])
    core, log, _ = _core(changes={"safety": {"mode": "full"}})
    d = core.decide(0, 0.0, y, u, _prop(0, [0.0004, 14.0]))
    assert d.source == "policy" and d.advice is None
    np.testing.assert_allclose(d.action, [0.0004, 14.0])


def test_full_mode_projects_the_policy_and_logs_every_clip():
    core, log, _ = _core(changes={"safety": {"mode": "full"}})
    y, u = _obs()
    core.decide(0, 0.0, y, u, _prop(0, [0.0003, 13.0]))
    d = core.decide(1, 1.0, y, u, _prop(1, [0.0003, 40.0]))  # +27 W in 1 s; rate limit 2 W/s
    assert d.source == "policy" and d.action[1] == pytest.approx(15.0)
    rec = [r for r in log if r["event"] == "decision"][-1]
    assert rec["clips"] == [{"input": "agitation_power", "reason": "rate_high", "proposed": 40.0, "applied": 15.0}]


def test_limited_mode_keeps_the_policy_near_the_baseline():
    core, log, _ = _core(changes={"safety": {"mode": "limited", "projection": {
        "rate": {"agitation_power": 1000.0, "base_flow": 1.0}}}})  # (rates too wide to bind)
    y, u = _obs()
    d = core.decide(0, 0.0, y, u, _prop(0, [0.0003, 40.0]))
    assert d.source == "policy"
    base = [r for r in log if r["event"] == "decision"][-1]["baseline"]
    assert d.action[1] == pytest.approx(base[1] + 5.0)  # limited_max_deviation = 5 W
    assert "band_high" in log[-1]["clips"][0]["reason"]


def test_silent_or_wrong_version_policy_gets_the_baseline():
    core, log, _ = _core(changes={"safety": {"mode": "full"}})
    y, u = _obs()
    d = core.decide(0, 0.0, y, u, None, "no valid proposal within 8.3 ms")
    assert d.source == "baseline:silent"
    assert [r for r in log if r["event"] == "silent_enter"][0]["reason"] == "no valid proposal within 8.3 ms"
    d = core.decide(1, 1.0, y, u, _prop(1, [0.0003, 13.0], version="v2"))
    assert d.source == "baseline:silent" and core.c["wrong_version"] == 1
    assert d.command == "v1"  # tells the policy which version to load
    d = core.decide(2, 2.0, y, u, _prop(2, [0.0003, 13.0]))
    assert d.source == "policy"
    assert [r["event"] for r in log if r["event"].startswith("silent")] == ["silent_enter", "silent_exit"]


def test_out_of_distribution_observation_hands_over_to_the_baseline():
    core, log, _ = _core(changes={"safety": {"mode": "full"}})
    for k in range(5):
        y, u = _obs()
        assert core.decide(k, float(k), y, u, _prop(k, [0.0003, 13.0])).source == "policy"
    y, u = _obs(do=90.0, agit=95.0)  # far from anything the policy was trained on
    d = core.decide(5, 5.0, y, u, _prop(5, [0.0003, 13.0]))
    assert d.source == "baseline:confidence"
    enter = [r for r in log if r["event"] == "fallback_enter"][0]
    assert "mahalanobis" in enter["reason"]
    # members that disagree trip it too
    core, log, _ = _core(changes={"safety": {"mode": "full"}})
    y, u = _obs()
    members = [[0.0003, 13.0], [0.0003, 15.0], [0.0003, 11.0], [0.0003, 13.0], [0.0003, 13.0]]
    d = core.decide(0, 0.0, y, u, _prop(0, [0.0003, 13.0], members=members))
    assert d.source == "baseline:confidence" and "disagreement" in log[-2]["reason"]


def test_monitor_trip_rolls_back_demotes_and_says_why(tmp_path):
    shutil.copytree(POLICIES, tmp_path / "pol")
    store = PolicyStore(tmp_path / "pol")
    core, log, _ = _core(changes={"safety": {"mode": "full"}}, version="v2", store=store)
    for k in range(40):
        y, u = _obs(do=15.0)
        # the policy process obeys the load command it gets at t = 30 s
        d = core.decide(k, float(k), y, u, _prop(k, [0.0003, 5.0], version="v2" if k <= 30 else "v1"))
        if k == 30:
            assert d.command == "v1"
    assert core.version == "v1" and core.keeper.rolled_back == ["v2"]
    assert core.rollout.mode == "advisory"  # demote_to
    rb = [r for r in log if r["event"] == "rollback"][0]
    assert rb["from"] == "v2" and rb["to"] == "v1" and rb["t_s"] == 30.0
    assert "rule do_low: dissolved_oxygen < 20 for 30 s" in rb["reason"]
    alarm = [r for r in log if r["event"] == "alarm"][0]
    assert alarm["rule"] == "do_low"
    st = core.status()
    assert st["alarm_count"] == 1 and st["alarms"][0]["rule"] == "do_low" and st["version"] == "v1"
    # proposals of the rolled-back version are refused from now on
    d = core.decide(40, 40.0, *_obs(), _prop(40, [0.0003, 13.0], version="v2"))
    assert d.source.startswith("baseline")


def test_operator_promotion_is_refused_without_the_gate():
    core, log, _ = _core(changes={"safety": {"mode": "shadow", "rollout": {"auto_promote": False}}})
    for k in range(10):
        core.decide(k, float(k), *_obs(), _prop(k, [0.0003, 13.0]))
    res = core.promote()
    assert not res["passed"] and core.rollout.mode == "shadow"
    assert log[-1]["event"] == "promote_refused" and "window 300 s" in log[-1]["reason"]


def test_prepare_on_arrival_then_decide_equals_deciding_at_once(tmp_path):
    """The wrapper runs prepare() when the observation arrives and decide() when the proposal
    does: same actions, sources, counters and log (alarms, rollback) as one decide() call."""
    results = []
    for split in (False, True):
        shutil.copytree(POLICIES, tmp_path / f"pol{split}")
        core, log, _ = _core(changes={"safety": {"mode": "full"}}, version="v2",
                             store=PolicyStore(tmp_path / f"pol{split}"))
        acts = []
        for k in range(60):
            y, u = _obs(do=15.0 if k < 40 else 45.0, agit=13.0 + 0.1 * k)
            if split:
                core.prepare(k, float(k), y, u)
            version = "v2" if k < 31 else "v1"
            prop = None if k % 7 == 3 else _prop(k, [0.0003, 14.0 + 0.2 * k], version=version)
            d = core.decide(k, float(k), y, u, prop, defer=split)
            core.finish()
            acts.append((d.action.tolist(), d.source, d.mode, d.command))
        results.append((acts, dict(core.c), [{k: v for k, v in r.items() if k != "wall_ns"} for r in log]))
    assert results[0] == results[1]
    assert results[1][1]["rollbacks"] == 1 and results[1][1]["decisions"] == 60


def test_decide_after_prepare_of_another_observation_prepares_its_own():
    core, _, _ = _core(changes={"safety": {"mode": "full"}})
    core.prepare(0, 0.0, *_obs())
    d = core.decide(1, 1.0, *_obs(), _prop(1, [0.0003, 13.0]))
    assert core.last_step == 1 and d.source == "policy" and core.c["decisions"] == 1
    assert core.last_t == 1.0 and core._prepared is None
