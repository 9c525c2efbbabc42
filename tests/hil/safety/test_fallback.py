"""Fallback: the baseline controller on its own, bumpless tracking, and the confidence gate."""

import math

import numpy as np
import pytest
from scipy.spatial.distance import mahalanobis as scipy_mahalanobis

from hil.bus.config import action_input_names
from hil.policy.fit import _Sim
from hil.safety.config import ConfidenceSection
from hil.safety.fallback import ConfidenceGate, FallbackController
from plants.base import load_plant_module

from .helpers import scenario

SPEC = load_plant_module("bioreactor").SPEC


def _gate(**kw):
    sec = ConfidenceSection(**{"mahalanobis_enter": 6.0, "mahalanobis_exit": 4.0, "disagreement_enter": 0.1,
                               "disagreement_exit": 0.05, "min_dwell_s": 10.0, **kw})
    return ConfidenceGate(sec, SPEC, ["base_flow", "agitation_power"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_baseline_alone_keeps_the_bioreactor_in_bounds(seed):
    """The fallback controller, alone, for 4 h of a randomized batch (+/-10 % on every plant
    parameter and initial state), through an aeration disturbance and a biomass-driven load."""
    sc = scenario()
    rng = np.random.default_rng(seed)
    sim = _Sim(sc, rng, spread=0.1)
    names = action_input_names(sc, SPEC)
    idx = np.array([SPEC.index("inputs", n) for n in names])
    base = FallbackController(sc.safety.fallback, SPEC, names)
    i_do, i_ph = SPEC.index("outputs", "dissolved_oxygen"), SPEC.index("outputs", "ph")
    lo, hi = SPEC.lows("outputs"), SPEC.highs("outputs")
    do, ph = [], []
    for k in range(4 * 3600):
        if k == 3600:
            sim.plant.u[SPEC.index("inputs", "aeration_rate")] = 1.2  # air supply drops 40 %
        a = base.update(sim.y, sim.plant.u, 1.0 if k else 0.0)
        sim.step(float(k), idx, a)
        assert np.isfinite(sim.y).all() and (sim.y >= lo).all() and (sim.y <= hi).all(), k
        do.append(sim.y[i_do])
        ph.append(sim.y[i_ph])
    do, ph = np.array(do), np.array(ph)
    # after the start-up transient (randomized initial DO), inside the monitor's limits
    assert do[600:].min() > 25.0 and do[600:].max() < 60.0
    assert abs(do[-600:].mean() - 40.0) < 1.0  # back on its setpoint after the disturbance
    assert 4.9 < ph[600:].min() and ph[600:].max() < 5.1


def test_tracking_makes_the_switch_bumpless():
    sc = scenario()
    names = ["base_flow", "agitation_power"]
    base = FallbackController(sc.safety.fallback, SPEC, names)
    y, u = SPEC.nominal("outputs"), SPEC.nominal("inputs")
    y[SPEC.index("outputs", "dissolved_oxygen")] = 35.0
    y[SPEC.index("outputs", "ph")] = 5.0
    base.update(y, u, 1.0)
    applied = np.array([0.002, 47.0])  # what the policy did
    base.track(applied, y, u)
    out = base.update(y, u, 1.0)  # same measurement one second later
    # continues from the applied action: + integral of this second only (ki * e * dt)
    assert out[1] == pytest.approx(47.0 + 0.02 * 5.0 * 1.0)
    assert out[0] == pytest.approx(0.002)


def test_mahalanobis_matches_scipy_and_disagreement_is_span_relative():
    g = _gate()
    rng = np.random.default_rng(3)
    A = rng.normal(size=(4, 4))
    cov, mean = A @ A.T + 0.1 * np.eye(4), rng.normal(size=4)
    g.set_stats((mean, cov))
    x = rng.normal(size=4) * 3
    assert g.mahalanobis(x) == pytest.approx(scipy_mahalanobis(x, mean, np.linalg.inv(cov)), rel=1e-6)
    members = np.array([[0.001, 10.0], [0.003, 10.0], [0.002, 12.0], [0.002, 8.0]])
    # std of base_flow 0.000707 / span 0.01; of agitation 1.414 / span 100
    assert g.disagreement(members) == pytest.approx(0.0707, rel=1e-3)
    assert math.isnan(g.disagreement(members[:1])) and math.isnan(g.mahalanobis(None))


def test_hysteresis_enter_exit_and_dwell_in_sim_time():
    g = _gate()
    t = 0.0
    events = []

    def feed(maha, dis=0.0, steps=1):
        nonlocal t
        for _ in range(steps):
            active, tr = g.update(t, maha, dis)
            if tr:
                events.append((t, tr.split(":")[0]))
            t += 1.0
        return active

    assert not feed(5.0, steps=5)  # between exit and enter: no entry
    assert feed(6.5)  # enters at once
    assert feed(5.0, steps=30)  # above the exit threshold: stays
    assert feed(3.0, steps=10)  # calm from t = 36 s, but for less than min_dwell_s
    assert not feed(3.0, steps=1)  # calm for 10 s at t = 46 s: leaves
    assert events == [(5.0, "enter fallback"), (46.0, "leave fallback")]
    # a score oscillating around the enter threshold does not chatter
    events.clear()
    for k in range(100):
        feed(6.1 if k % 2 else 5.9)
    assert [e[1] for e in events] == ["enter fallback"]
    # disagreement alone trips it too, and its reason says so
    g2 = _gate()
    active, tr = g2.update(0.0, 1.0, 0.2)
    assert active and "disagreement 0.2 > 0.1" in tr


def test_minimum_dwell_holds_even_when_calm_at_once():
    g = _gate(min_dwell_s=20.0)
    g.update(0.0, 7.0, 0.0)  # enters at t = 0; calm from t = 1 s on
    for k in range(1, 21):
        assert g.update(float(k), 1.0, 0.0)[0]
    assert not g.update(21.0, 1.0, 0.0)[0]  # 21 s in fallback and 20 s calm


def test_every_check_fails_closed_unless_disabled():
    g = _gate()
    active, tr = g.update(0.0, math.nan, 0.0, 0.0, {"mahalanobis": "no training statistics for x"})
    assert active and tr == "enter fallback: mahalanobis cannot be computed (no training statistics for x): not confident"
    g = _gate()
    assert g.update(0.0, 1.0, math.nan, 0.0)[0]  # fewer than 2 members
    g = _gate()
    assert g.update(0.0, 1.0, 0.0, math.nan)[0]  # no members
    # None: not applicable this step (no proposal): neither trips nor disturbs the calm
    g = _gate()
    assert not g.update(0.0, 1.0, None, None)[0]
    # disabled by the operator: not a reason, whatever the score
    g = _gate(mahalanobis=False, disagreement=False, consistency=False)
    assert not g.update(0.0, math.nan, math.nan, math.nan)[0]
    assert {k: v["enabled"] for k, v in g.checks().items()} == {
        "mahalanobis": False, "disagreement": False, "consistency": False}


def test_a_gate_that_cannot_compute_its_score_never_counts_as_calm():
    g = _gate(min_dwell_s=5.0)
    g.update(0.0, 7.0, 0.0, 0.0)  # enters
    for k in range(1, 30):
        assert g.update(float(k), math.nan, 0.0, 0.0)[0]  # never leaves on an unknown score
    for k in range(30, 36):
        g.update(float(k), 1.0, 0.0, 0.0)
    assert not g.active


def test_inconsistency_is_the_distance_outside_the_members_hull():
    g = _gate()
    members = np.array([[0.001, 10.0], [0.003, 12.0]])
    assert g.inconsistency(np.array([0.002, 11.0]), members) == 0.0  # inside
    assert g.inconsistency(np.array([0.002, 15.0]), members) == pytest.approx(0.03)  # 3 W / 100 W
    assert g.inconsistency(np.array([0.0005, 11.0]), members) == pytest.approx(0.05)  # 0.0005 / 0.01
    assert math.isnan(g.inconsistency(np.array([0.002, 11.0]), np.zeros((0, 2))))
    active, tr = g.update(0.0, 1.0, 0.0, 0.03)
    assert active and "inconsistency 0.03 > 0.01" in tr


def _controller(**fallback):
    sc = scenario({"safety": {"fallback": fallback}})
    return FallbackController(sc.safety.fallback, SPEC, ["base_flow", "agitation_power"])


def _y(do, ph=5.0):
    y, u = SPEC.nominal("outputs"), SPEC.nominal("inputs")
    y[SPEC.index("outputs", "dissolved_oxygen")] = do
    y[SPEC.index("outputs", "ph")] = ph
    return y, u


def test_hold_on_a_bad_measurement_freezes_the_integral_no_windup():
    base = _controller()
    for _ in range(10):
        out = base.update(*_y(35.0), 1.0)  # error +5 %: the integral winds up
    held = out[1]
    for _ in range(500):  # 500 s of a dead DO probe
        assert base.update(*_y(math.nan), 1.0)[1] == held
    # back: one step of integral at the new error, the P term of the new error, no D kick
    integral = base.loops[0][1].integral  # the DO loop
    assert integral == pytest.approx(10 * 0.02 * 5.0)  # 10 s at +5 %, nothing during the 500 s
    out = base.update(*_y(38.0), 1.0)
    assert out[1] == pytest.approx(13.0 + 1.0 * 2.0 + integral + 0.02 * 2.0 * 1.0)


def test_safe_output_on_a_bad_measurement_and_bumpless_return():
    base = _controller(loops=[{"input": "agitation_power", "measurement": "dissolved_oxygen", "setpoint": 40.0,
                               "kp": 1.0, "ki": 0.02, "bias": 13.0, "out_min": 0.0, "out_max": 80.0,
                               "on_bad": "safe"},
                              {"input": "base_flow", "measurement": "ph", "setpoint": 5.0, "kp": 0.02}],
                       safe_output={"agitation_power": 30.0})
    base.update(*_y(40.0), 1.0)
    assert base.update(*_y(math.nan), 1.0)[1] == 30.0
    base.track(np.array([0.0, 17.0]), *_y(math.nan))  # ramping there: 17 W applied
    assert base.update(*_y(math.nan), 1.0)[1] == 30.0
    base.track(np.array([0.0, 19.0]), *_y(math.nan))
    out = base.update(*_y(40.0), 1.0)  # good again at zero error: continues from 19 W
    assert out[1] == pytest.approx(19.0)


def test_follow_makes_the_baseline_continue_from_the_applied_value():
    base = _controller()
    base.update(*_y(41.0), 0.0)
    base.update(*_y(41.0), 1.0)
    base.follow(np.array([0.0003, 30.0]), np.array([False, True]), *_y(41.0))
    out = base.update(*_y(41.0), 1.0)
    assert out[1] == pytest.approx(30.0 + 0.02 * -1.0 * 1.0)  # same error: + one step of integral
