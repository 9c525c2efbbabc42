"""Rollout modes: KPI gates over a window of simulated time, promotion and demotion."""

import math

import pytest

from hil.safety.config import RolloutSection
from hil.safety.rollout import KpiSample, Rollout, kpis_of


def _ro(mode="shadow", **kw):
    gates = {
        "shadow": {"window_s": 100.0, "max_action_nrmse": 0.1, "max_silent_rate": 0.05},
        "advisory": {"window_s": 50.0, "max_fallback_rate": 0.1},
        "limited": {"window_s": 100.0, "max_tracking_nrmse": 0.05, "max_clip_rate": 0.2},
    }
    return Rollout(RolloutSection(**{"gates": gates, **kw}), mode)


def _feed(ro, t0, t1, **sample):
    s = {"tracking_sq": 0.0, "fallback": False, "silent": False, "clipped": False, "action_sq": 0.0, "alarms": 0}
    s.update(sample)
    t = t0
    while t <= t1:
        ro.record(KpiSample(t, **s))
        t += 1.0


def test_kpis_of_a_window():
    samples = [KpiSample(float(t), 0.04, t < 2, t == 3, t < 5 and t != 3, math.nan if t == 3 else 0.01, int(t == 9))
               for t in range(10)]
    k = kpis_of(samples)
    assert k["samples"] == 10 and k["alarms"] == 1
    assert k["tracking_nrmse"] == pytest.approx(0.2)
    assert k["fallback_rate"] == pytest.approx(2 / 9)  # refused proposals / proposals
    assert k["silent_rate"] == pytest.approx(0.1)
    assert k["clip_rate"] == pytest.approx(4 / 9)  # clipped proposals / proposals
    assert k["action_nrmse"] == pytest.approx(0.1)


def test_no_promotion_before_the_window_has_passed():
    ro = _ro()
    _feed(ro, 0.0, 50.0, action_sq=0.0001)
    res = ro.promote(50.0, "operator")
    assert not res.passed and ro.mode == "shadow"
    assert any("window 100 s" in r for r in res.reasons)
    _feed(ro, 51.0, 100.0, action_sq=0.0001)
    res = ro.promote(100.0, "operator")
    assert res.passed and ro.mode == "advisory" and res.target == "advisory"
    assert ro.history[-1]["reason"].startswith("promoted by operator")


def test_gate_refuses_with_the_failing_kpis_named():
    ro = _ro()
    _feed(ro, 0.0, 100.0, action_sq=0.04, silent=True)  # action nrmse 0.2, everything silent
    res = ro.evaluate(100.0)
    assert not res.passed
    assert "action_nrmse unknown (no proposals in the window)" in res.reasons or any(
        r.startswith("action_nrmse") for r in res.reasons)
    assert any(r.startswith("silent_rate 1 > 0.05") for r in res.reasons)


def test_window_only_counts_recent_samples_in_the_current_mode():
    ro = _ro()
    _feed(ro, 0.0, 100.0, action_sq=1.0)  # bad early
    _feed(ro, 101.0, 250.0, action_sq=0.0001)  # good for the last window
    assert ro.promote(250.0, "operator").passed
    # the new mode starts a fresh window: advisory needs its own 50 s
    assert not ro.promote(251.0, "operator").passed
    _feed(ro, 251.0, 301.0, fallback=False)
    assert ro.promote(301.0, "operator").passed and ro.mode == "limited"


def test_auto_promotion_walks_through_every_gate_and_stops_at_max_mode():
    ro = _ro(auto_promote=True, max_mode="limited")
    t = 0.0
    modes = []
    while t < 1000.0:
        _feed(ro, t, t, action_sq=0.0001, tracking_sq=0.0001)
        if ro.maybe_auto_promote(t) is not None:
            modes.append((t, ro.mode))
        t += 1.0
    assert modes == [(100.0, "advisory"), (150.0, "limited")]
    res = ro.evaluate(999.0)
    assert not res.passed and "highest mode allowed" in res.reasons[0]


def test_no_gate_no_promotion_and_demotion_only_lowers():
    ro = Rollout(RolloutSection(), "shadow")
    _feed(ro, 0.0, 1000.0)
    res = ro.promote(1000.0, "operator")
    assert not res.passed and "no gate defined for leaving shadow" in res.reasons[0]
    ro = _ro(mode="full")
    assert ro.demote(5.0, "advisory", "monitor trip") and ro.mode == "advisory"
    assert not ro.demote(6.0, "limited", "x") and ro.mode == "advisory"


def test_kpis_that_cannot_be_computed_fail_the_gate():
    ro = Rollout(RolloutSection(gates={"shadow": {"window_s": 10.0, "max_fallback_rate": 0.1, "max_clip_rate": 0.5,
                                                  "max_tracking_nrmse": 0.1, "max_alarms": None}}), "shadow")
    _feed(ro, 0.0, 20.0, silent=True, action_sq=math.nan)  # nothing was gated
    res = ro.evaluate(20.0)
    assert not res.passed and math.isnan(res.kpis["fallback_rate"]) and math.isnan(res.kpis["clip_rate"])
    assert "fallback_rate unknown (no proposals in the window: nothing was gated)" in res.reasons
    ro = Rollout(ro.sec, "shadow")
    _feed(ro, 0.0, 20.0)
    _feed(ro, 21.0, 21.0, tracking_sq=math.nan)  # a Bad measurement in the window
    res = ro.evaluate(21.0)
    assert res.reasons == ["tracking_nrmse unknown (a fallback loop's measurement was Bad in the window)"]
    _feed(ro, 22.0, 32.0)
    assert ro.evaluate(32.0).passed  # out of the window
