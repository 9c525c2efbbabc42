"""The safety decision under faults: Bad sensors, gates that cannot be computed, the applied
actuator value after a hang, a policy that is gone for good (hil/safety/core.py)."""

import math

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
I_VOL = SPEC.index("outputs", "volume")
U_BASE = SPEC.index("inputs", "base_flow")
U_AGIT = SPEC.index("inputs", "agitation_power")
RATE_AGIT = 2.0  # W per sim s, configs/bioreactor_policy.toml
ENTRY = "tests.hil.safety.policies:constant"  # an entry policy: no training statistics


def _core(changes=None, version="v1", store="default"):
    sc = scenario(changes)
    log = []
    names = action_input_names(sc, SPEC)
    if store == "default":
        store = PolicyStore(POLICIES)
    core = SafetyCore(sc, SPEC, names, store, version, log=log.append)
    return core, log


def _obs(do=40.0, ph=5.0, base=0.0003, agit=13.0):
    y, u = SPEC.nominal("outputs"), SPEC.nominal("inputs")
    y[I_DO], y[I_PH], y[I_VOL] = do, ph, 100.0
    u[U_BASE], u[U_AGIT] = base, agit
    return y, u


def _prop(step, a, version="v1", members="tile"):
    a = np.asarray(a, dtype=float)
    if isinstance(members, str):
        m = np.tile(a, (5, 1))
    else:
        m = np.asarray(members, dtype=float).reshape(-1, 2)
    return Message("proposal", 1, step + 1, step, float(step), 0,
                   {"a": a, "members": m, "version": version, "compute_us": 1.0})


def _events(log, name):
    return [r for r in log if r["event"] == name]


def _chain(core, k0, k1, applied, do=40.0, prop=None, q=None, version="v1"):
    """Decide steps k0..k1-1 as the loop would: each step's applied inputs are the previous
    decision (one-step latency). Returns (decisions, applied after the last one)."""
    out = []
    for k in range(k0, k1):
        y, u = _obs(do=do(k) if callable(do) else do, base=applied[0], agit=applied[1])
        p = None if prop is None else _prop(k, prop(k) if callable(prop) else prop, version=version)
        d = core.decide(k, float(k), y, u, p) if q is None else core.decide(k, float(k), y, u, p, q=q)
        out.append(d)
        applied = d.action.copy()
    return out, applied


# ---- 1. sensor faults ----

def test_a_nan_do_observation_is_decided_baseline_holds_and_the_monitor_trips_at_once():
    core, log = _core({"safety": {"mode": "full"}})
    decs, applied = _chain(core, 0, 20, [0.0003, 13.0], do=lambda k: 36.0, prop=lambda k: [0.0003, 13.0 + 0.1 * k])
    assert decs[-1].source == "policy"
    y, u = _obs(do=math.nan, agit=applied[1], base=applied[0])
    d = core.decide(20, 20.0, y, u, _prop(20, [0.0003, 40.0]))
    # decided, finite, and neither the policy (its features are Bad) nor a jump
    assert np.isfinite(d.action).all() and d.source.startswith("baseline")
    assert d.action[1] == pytest.approx(applied[1])  # the baseline holds the actuator where it is
    alarm = _events(log, "alarm")[0]
    assert alarm["rule"] == "do_low" and alarm["t_s"] == 20.0 and "dissolved_oxygen is Bad" in alarm["reason"]
    assert _events(log, "quality")[0]["bad"] == ["dissolved_oxygen"]
    # the rule's action (rollback) ran: v1 has no predecessor, the baseline holds from now on
    assert core.version is None and core.c["bad_observations"] == 1
    # it keeps deciding every step while the sensor is Bad, holding, never integrating
    held = d.action[1]
    for k in range(21, 80):
        y, u = _obs(do=math.nan, agit=held)
        d = core.decide(k, float(k), y, u, None)
        assert d.action[1] == pytest.approx(held)
    assert core.c["decisions"] == 80


def test_bad_quality_counts_even_when_the_value_is_finite_and_uncertain_is_used():
    core, log = _core({"safety": {"mode": "full", "monitor": {"rules": [
        {"name": "do_low", "signal": "dissolved_oxygen", "op": "<", "limit": 20.0, "for_s": 30.0,
         "action": "fallback", "on_bad": "fallback"}]}}})
    q = np.zeros(SPEC.n_outputs, dtype=np.uint8)
    q[I_DO] = 1  # Uncertain: used as it is
    _, applied = _chain(core, 0, 5, [0.0003, 13.0], prop=[0.0003, 13.0], q=q)
    assert not _events(log, "alarm") and core.c["policy_actions"] == 5
    q[I_DO] = 2  # Bad, although the value (a frozen 40 %) looks fine
    y, u = _obs(agit=applied[1])
    d = core.decide(5, 5.0, y, u, _prop(5, [0.0003, 13.0]), q=q)
    assert d.source.startswith("baseline") and _events(log, "alarm")[0]["rule"] == "do_low"
    assert core.version == "v1"  # on_bad = "fallback": a dead probe does not roll the policy back
    assert core.gate.active and core.status()["bad_signals"] == ["dissolved_oxygen"]


def test_safe_output_on_bad_is_reached_at_the_rate_limit():
    core, log = _core({"safety": {"mode": "shadow", "fallback": {"on_bad": "safe",
                                                                  "safe_output": {"agitation_power": 30.0,
                                                                                  "base_flow": 0.0003}}}})
    _, applied = _chain(core, 0, 5, [0.0003, 13.0], prop=[0.0003, 13.0])
    decs, applied = _chain(core, 5, 25, applied, do=math.nan, prop=[0.0003, 13.0])
    agit = [applied_k for applied_k in [13.0] + [d.action[1] for d in decs]]
    steps = np.diff(agit)
    assert (np.abs(steps) <= RATE_AGIT + 1e-9).all()
    assert agit[-1] == pytest.approx(30.0)  # 17 W away: reached after 9 steps at 2 W/s


def test_linear_limit_that_cannot_be_computed_fails_closed():
    core, log = _core({"safety": {"mode": "full"}})
    _, applied = _chain(core, 0, 5, [0.0003, 13.0], prop=[0.0003, 13.0])
    y, u = _obs(agit=applied[1])
    y[I_VOL] = math.nan  # the shear limit reads the volume: b(state) unknown
    d = core.decide(5, 5.0, y, u, _prop(5, [0.0003, 14.0]))
    assert d.source == "baseline:limits_unknown" and core.c["limits_unknown"] == 1
    assert abs(d.action[1] - applied[1]) <= RATE_AGIT + 1e-9 and 0.0 <= d.action[1] <= 80.0  # box and rate
    rec = [r for r in log if r["event"] == "decision"][-1]
    assert rec["source"] == "baseline:limits_unknown" and "shear" in rec["reason"] and "volume" in rec["reason"]
    # a Bad signal the limit does not read changes nothing (0 * NaN must not leak into b)
    y, u = _obs(agit=d.action[1])
    y[SPEC.index("outputs", "co2")] = math.nan
    assert core.decide(6, 6.0, y, u, _prop(6, [0.0003, 14.0])).source == "policy"


# ---- 2. every gate fails closed ----

def test_an_entry_policy_without_statistics_is_held_on_the_baseline_unless_the_check_is_disabled():
    core, log = _core({"safety": {"mode": "full"}}, version=ENTRY, store=None)
    assert "Mahalanobis check cannot be computed" in _events(log, "warning")[0]["reason"]
    decs, _ = _chain(core, 0, 10, [0.0003, 13.0], prop=[0.0003, 13.0], version=ENTRY)
    assert all(d.source == "baseline:confidence" for d in decs)
    assert "mahalanobis cannot be computed (no training statistics" in _events(log, "fallback_enter")[0]["reason"]
    st = core.status()["fallback"]["checks"]
    assert st["mahalanobis"]["enabled"] and not st["mahalanobis"]["statistics"]
    core, log = _core({"safety": {"mode": "full", "confidence": {"mahalanobis": False}}}, version=ENTRY, store=None)
    decs, _ = _chain(core, 0, 10, [0.0003, 13.0], prop=[0.0003, 13.0], version=ENTRY)
    assert all(d.source == "policy" for d in decs)  # 5 agreeing members, consistent proposal
    assert not core.status()["fallback"]["checks"]["mahalanobis"]["enabled"]


@pytest.mark.parametrize("members, check", [([], "disagreement cannot be computed (0 member(s)"),
                                            ([[0.0003, 13.0]], "disagreement cannot be computed (1 member(s)")])
def test_fewer_than_two_members_is_not_confident(members, check):
    core, log = _core({"safety": {"mode": "full"}})
    y, u = _obs()
    d = core.decide(0, 0.0, y, u, _prop(0, [0.0003, 13.0], members=members))
    assert d.source == "baseline:confidence"
    assert check in _events(log, "fallback_enter")[0]["reason"]
    # the operator may disable both member checks explicitly
    core, _ = _core({"safety": {"mode": "full", "confidence": {"disagreement": False, "consistency": False}}})
    assert core.decide(0, 0.0, y, u, _prop(0, [0.0003, 13.0], members=members)).source == "policy"


def test_a_proposal_its_members_do_not_support_is_not_confident():
    core, log = _core({"safety": {"mode": "full"}})
    members = [[0.0003, 12.9], [0.0003, 13.0], [0.0003, 13.1], [0.0003, 13.0], [0.0003, 13.05]]
    y, u = _obs()
    assert core.decide(0, 0.0, y, u, _prop(0, [0.0003, 13.05], members=members)).source == "policy"
    d = core.decide(1, 1.0, *_obs(agit=13.05), _prop(1, [0.0003, 14.5], members=members))
    assert d.source == "baseline:confidence"
    reason = _events(log, "fallback_enter")[0]["reason"]
    assert "inconsistency 0.014 > 0.01" in reason  # (14.5 - 13.1) W / 100 W span


def test_promotion_does_not_pass_on_a_fallback_rate_nothing_gated():
    gates = {"shadow": {"window_s": 20.0, "max_fallback_rate": 0.05, "max_action_nrmse": None,
                        "max_silent_rate": None, "max_alarms": None}}
    core, log = _core({"safety": {"mode": "shadow", "rollout": {"auto_promote": False, "gates": gates}}},
                      version=ENTRY, store=None)
    _chain(core, 0, 30, [0.0003, 13.0], prop=[0.0003, 13.0], version=ENTRY)
    res = core.promote()
    assert not res["passed"] and core.rollout.mode == "shadow"
    assert any(r.startswith("fallback_rate 1 > 0.05") for r in res["reasons"])
    # a silent policy: nothing was gated, the rate is unknown, not 0
    core, log = _core({"safety": {"mode": "shadow", "rollout": {"auto_promote": False, "gates": gates}}})
    _chain(core, 0, 30, [0.0003, 13.0], prop=None)
    res = core.promote()
    assert not res["passed"] and "fallback_rate unknown (no proposals in the window: nothing was gated)" in res["reasons"]


# ---- 3. rate limits and tracking follow the applied value ----

def test_first_decision_after_a_hang_is_rate_limited_from_the_applied_value():
    core, log = _core({"safety": {"mode": "full"}})
    _, applied = _chain(core, 0, 10, [0.0003, 13.0], prop=[0.0003, 13.0])
    # the safety hangs for 20 s; the loop's watchdog applies [bus].fallback_action (30 W)
    y, u = _obs(agit=30.0, base=0.0003)
    d = core.decide(30, 30.0, y, u, _prop(30, [0.0003, 13.0]))
    assert d.source == "policy"
    assert abs(d.action[1] - 30.0) <= RATE_AGIT * 1.0 + 1e-9  # not 30 -> 13 in one step
    assert d.action[1] == pytest.approx(28.0)
    assert _events(log, "applied_override")[0]["inputs"] == ["agitation_power"]


def test_the_very_first_decision_is_rate_limited_and_the_baseline_starts_bumpless():
    core, log = _core({"safety": {"mode": "full"}})
    y, u = _obs(do=40.0, agit=30.0)
    d = core.decide(0, 1.0, y, u, None)  # silent: the baseline acts
    assert d.action[1] == pytest.approx(30.0)  # from the applied value, at zero error
    core, log = _core({"safety": {"mode": "full"}})
    d = core.decide(0, 1.0, y, u, _prop(0, [0.0003, 13.0]))
    assert d.action[1] == pytest.approx(28.0)


def test_the_baseline_continues_from_the_applied_value_after_a_hang():
    core, log = _core({"safety": {"mode": "shadow"}})
    _, applied = _chain(core, 0, 10, [0.0003, 13.0], do=41.0)
    base_before = [r for r in log if r["event"] == "decision"][-1]["baseline"][1]
    y, u = _obs(do=41.0, agit=30.0)  # the watchdog held 30 W meanwhile
    d = core.decide(30, 30.0, y, u, None)
    base = [r for r in log if r["event"] == "decision"][-1]["baseline"][1]
    assert base_before < 14.0
    # from 30 W: the PID's P part did not change (same error), plus one step's integral
    # (ki * e * dt: 0.02 * -1 * 21 s since the last observation, at t = 9 s)
    assert base == pytest.approx(30.0 + 0.02 * -1.0 * 21.0)
    assert d.action[1] == pytest.approx(base)


def test_decisions_in_flight_are_not_overrides():
    """Two steps of actuation latency: the applied value is the decision of two steps ago; the
    baseline integrates exactly as with one step (it is not reset to the older value)."""
    runs = []
    for latency in (1, 2):
        core, log = _core({"safety": {"mode": "shadow"}})
        sent = [np.array([0.0003, 13.0])] * latency
        out = []
        for k in range(40):
            y, u = _obs(do=39.0 + 0.05 * k, base=sent[-latency][0], agit=sent[-latency][1])
            d = core.decide(k, float(k), y, u, None)
            sent.append(d.action)
            out.append(d.action[1])
        runs.append(out)
        assert core.c["applied_overrides"] == 1  # the first observation only
    np.testing.assert_allclose(runs[1], runs[0], rtol=0, atol=1e-12)


# ---- 5. policy death vs one slow answer ----

def test_one_missed_deadline_is_silent_a_sustained_silence_is_policy_lost_then_shadow():
    core, log = _core({"safety": {"mode": "full"}})
    assert core.lost_after_s == 5.0  # default: 5 loop steps of 1 s
    _, applied = _chain(core, 0, 10, [0.0003, 13.0], prop=[0.0003, 13.0])
    _, applied = _chain(core, 10, 11, applied, prop=None)  # one slow answer
    assert core.status()["policy"]["state"] == "silent"
    _, applied = _chain(core, 11, 20, applied, prop=[0.0003, 13.0])
    assert not _events(log, "alarm") and core.status()["policy"]["state"] == "ok"
    # the policy dies: silent from step 20 on
    decs, applied = _chain(core, 20, 40, applied, prop=None)
    alarms = _events(log, "alarm")
    assert len(alarms) == 1 and alarms[0]["rule"] == "policy_lost" and alarms[0]["t_s"] == 24.0
    assert "no valid proposal for 5 s (since t = 19 s" in alarms[0]["reason"]
    st = core.status()
    assert st["policy"]["state"] == "lost" and st["policy"]["lost_since_t_s"] == 24.0 and st["alarm_count"] == 1
    assert all(d.source == "baseline:silent" for d in decs) and core.rollout.mode == "full"
    # it answers again (restarted): back to shadow, through the gates from there
    decs, _ = _chain(core, 40, 45, applied, prop=[0.0003, 13.0])
    assert core.rollout.mode == "shadow" and all(d.source == "baseline:shadow" for d in decs)
    rec = _events(log, "policy_recovered")[0]
    assert rec["t_s"] == 40.0 and "lost for 16 s" in rec["reason"] and "rollout gates" in rec["reason"]
    mode = [r for r in log if r["event"] == "mode"][-1]
    assert mode["mode"] == "shadow" and "re-enters through the rollout gates" in mode["reason"]
    assert core.status()["policy"]["state"] == "ok" and core.c["policy_lost"] == 1


def test_policy_lost_after_is_configurable_in_sim_seconds():
    core, log = _core({"safety": {"mode": "limited", "policy_lost_after_s": 2.0}})
    _, applied = _chain(core, 0, 3, [0.0003, 13.0], prop=None)
    assert [a["t_s"] for a in _events(log, "alarm")] == [1.0]  # silent since t = -1 s (before the first)
    _chain(core, 3, 4, applied, prop=[0.0003, 13.0])
    assert core.rollout.mode == "shadow"
