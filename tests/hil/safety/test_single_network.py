"""A single network (a proposal without members) is promotable only through an explicit path:
bootstrapped heads (its members: hil/policy/heads.py) or an operator's acceptance of that
version recorded in the decision log ([safety.confidence] single_network); never by default,
and the remaining checks still fail closed (hil/safety/core.py, hil/safety/fallback.py)."""

import math

import numpy as np
import pytest

from hil.bus import Message
from hil.bus.config import action_input_names
from hil.errors import ConfigError
from hil.policy.store import PolicyStore
from hil.safety.core import SafetyCore
from plants.base import load_plant_module

from .helpers import POLICIES, scenario

SPEC = load_plant_module("bioreactor").SPEC
I_DO = SPEC.index("outputs", "dissolved_oxygen")
I_PH = SPEC.index("outputs", "ph")
I_VOL = SPEC.index("outputs", "volume")
NOMINAL = {"base_flow": 0.0003, "agitation_power": 13.0}  # the baseline's action at the setpoints
GATES = {"shadow": {"window_s": 20.0, "max_fallback_rate": 0.05, "max_action_nrmse": 0.05, "max_silent_rate": 0.01,
                    "max_alarms": 0}}
ACCEPT = {"single_network": "operator-accepted", "accepted_by": "A. Operator",
          "accepted_utc": "2026-12-02T17:00:00Z", "accepted_versions": ["v1"],
          "accepted_reason": "single PPO network, shadow evidence reviewed"}


def _core(confidence=None, version="v1"):
    sc = scenario({"safety": {"mode": "shadow", "confidence": confidence or {},
                              "rollout": {"auto_promote": True, "max_mode": "full", "gates": GATES}}})
    log = []
    names = action_input_names(sc, SPEC)
    return SafetyCore(sc, SPEC, names, PolicyStore(POLICIES), version, log=log.append), log, names


def _run(core, names, steps=40, members="none", do=40.0, version="v1"):
    """Steps as the loop runs them (applied = the previous decision); the proposal is the
    baseline's nominal action, with no members, or 5 heads close around it."""
    a = np.array([NOMINAL[n] for n in names])
    span = np.array([SPEC.quantity("inputs", n).high - SPEC.quantity("inputs", n).low for n in names])
    applied = a.copy()
    decisions = []
    for k in range(steps):
        y, u = SPEC.nominal("outputs"), SPEC.nominal("inputs")
        y[I_DO], y[I_PH], y[I_VOL] = do, 5.0, 100.0
        for n, v in zip(names, applied):
            u[SPEC.index("inputs", n)] = v
        if members == "none":
            m = np.zeros((0, len(names)))
        else:  # heads: a spread of 0.1 % of the span around the network's action
            m = a + np.outer(np.linspace(-1, 1, 5), 1e-3 * span)
        p = Message("proposal", 1, k + 1, k, float(k), 0, {"a": a, "members": m, "version": version,
                                                           "compute_us": 1.0})
        d = core.decide(k, float(k), y, u, p)
        decisions.append(d)
        applied = d.action.copy()
    return decisions


def test_a_single_network_is_never_confident_nor_promoted_by_default():
    core, log, names = _core()
    decisions = _run(core, names)
    assert core.rollout.mode == "shadow" and core.c["promotions"] == 0
    assert core.gate.active and "disagreement cannot be computed (0 member(s)" in core.gate.reason
    assert "--heads K" in core.gate.reason  # the way out is named
    res = core.promote()
    assert not res["passed"] and any(r.startswith("fallback_rate 1 > 0.05") for r in res["reasons"])
    assert all(d.source.startswith("baseline") for d in decisions)
    assert not [r for r in log if r["event"] == "single_network_accepted"]
    assert core.status()["fallback"]["single_network"] is None


def test_heads_as_members_give_the_gate_a_score_and_the_policy_is_promoted():
    core, log, names = _core()
    _run(core, names, members="heads")
    assert core.rollout.mode != "shadow" and core.c["promotions"] >= 1
    assert 0 < core.gate.last_disagreement < 0.01  # computed, not skipped


def test_an_operator_acceptance_promotes_the_named_version_and_is_in_the_decision_log():
    core, log, names = _core(ACCEPT)
    _run(core, names)
    assert core.rollout.mode != "shadow" and core.c["promotions"] >= 1
    acc = [r for r in log if r["event"] == "single_network_accepted"]
    assert len(acc) == 1 and acc[0]["accepted_by"] == "A. Operator" and acc[0]["version"] == "v1"
    assert acc[0]["accepted_utc"] == "2026-12-02T17:00:00Z" and "shadow evidence reviewed" in acc[0]["reason"]
    promo = [r for r in log if r["event"] == "mode"][0]
    assert promo["single_network"]["accepted_by"] == "A. Operator"
    assert log[[r["event"] for r in log].index("start")]["single_network"]["version"] == "v1"
    st = core.status()["fallback"]
    assert st["single_network"]["version"] == "v1" and st["checks"]["disagreement"]["enabled"]
    assert math.isnan(core.gate.last_disagreement)  # not applied, not faked as 0
    from hil.commands.safety import status_lines

    text = "\n".join(status_lines(core.status()))
    assert "single network v1: OPERATOR-ACCEPTED by A. Operator at 2026-12-02T17:00:00Z" in text


def test_an_acceptance_covers_only_its_versions_and_members_sent_are_still_checked():
    core, log, names = _core({**ACCEPT, "accepted_versions": ["v2"]})
    _run(core, names)
    assert core.rollout.mode == "shadow" and core.gate.active
    # accepted v1 proposing with members that disagree: the disagreement check still applies
    core, log, names = _core({**ACCEPT, "disagreement_enter": 0.01, "disagreement_exit": 0.004})
    a = np.array([NOMINAL[n] for n in names])
    y, u = SPEC.nominal("outputs"), SPEC.nominal("inputs")
    y[I_DO], y[I_PH], y[I_VOL] = 40.0, 5.0, 100.0
    wide = np.vstack([a * 0.5, a * 1.5])
    d = core.decide(0, 0.0, y, u, Message("proposal", 1, 1, 0, 0.0, 0, {"a": a, "members": wide, "version": "v1",
                                                                         "compute_us": 1.0}))
    assert d.source.startswith("baseline") and "disagreement" in core.gate.reason


def test_an_accepted_single_network_still_fails_closed_on_the_mahalanobis_check():
    core, log, names = _core(ACCEPT)
    decisions = _run(core, names, steps=5, do=math.nan)  # DO Bad: its feature cannot be scored
    assert core.gate.active and "mahalanobis cannot be computed" in core.gate.reason
    assert all(d.source.startswith("baseline") for d in decisions)
    # a far-off observation: off-distribution, fallback
    core, log, names = _core({**ACCEPT, "mahalanobis_enter": 15.0, "mahalanobis_exit": 10.0})
    _run(core, names, steps=5, do=400.0)
    assert core.gate.active and "mahalanobis" in core.gate.reason


@pytest.mark.parametrize("changes, message", [
    ({"single_network": "operator-accepted", "accepted_utc": "2026-12-02T17:00:00Z", "accepted_versions": ["v1"]},
     "needs accepted_by"),
    ({**ACCEPT, "accepted_utc": "yesterday"}, "not an ISO 8601"),
    ({**ACCEPT, "accepted_utc": "2026-12-02T17:00:00"}, "no time zone"),
    ({**ACCEPT, "accepted_versions": []}, "needs accepted_versions"),
    ({**ACCEPT, "accepted_versions": ["latest"]}, "not a policy version"),
    ({**ACCEPT, "mahalanobis": False}, "needs mahalanobis = true"),
    ({"accepted_by": "A. Operator"}, "single_network = 'refuse'"),
    ({"single_network": "yes"}, "single_network"),
])
def test_an_acceptance_must_say_who_when_and_which_versions(changes, message):
    with pytest.raises(ConfigError) as exc:
        scenario({"safety": {"confidence": changes}})
    assert message in str(exc.value) and "safety.confidence" in str(exc.value)
