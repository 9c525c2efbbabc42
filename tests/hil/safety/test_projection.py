"""Projection: each constraint, its reason, and optimality (the nearest point of the envelope)."""

import numpy as np
import pytest
from scipy.optimize import minimize

from hil.safety.config import ProjectionSection
from hil.safety.projection import Projector
from plants.base import load_plant_module

SPEC = load_plant_module("bioreactor").SPEC
NAMES = ["base_flow", "agitation_power"]  # spec bounds: [0, 0.01] L/h, [0, 100] W
Y = SPEC.nominal("outputs")
U = SPEC.nominal("inputs")


def proj(**section):
    return Projector(ProjectionSection(**section), SPEC, NAMES)


def reasons(clips):
    return {c.input: c.reason for c in clips}


def test_inside_the_envelope_nothing_changes():
    p = proj(box={"agitation_power": (10.0, 50.0)}, rate={"agitation_power": 1.0})
    a = np.array([0.005, 20.0])
    out, clips = p.project(a, np.array([0.005, 19.5]), 1.0, Y, U)
    np.testing.assert_array_equal(out, a)
    assert clips == []


def test_box_defaults_to_spec_bounds_and_may_be_tighter():
    out, clips = proj().project(np.array([0.02, -5.0]), None, -1.0, Y, U)
    np.testing.assert_array_equal(out, [0.01, 0.0])
    assert reasons(clips) == {"base_flow": "box_high", "agitation_power": "box_low"}
    p = proj(box={"agitation_power": (10.0, 50.0)})
    out, clips = p.project(np.array([0.001, 70.0]), None, -1.0, Y, U)
    np.testing.assert_array_equal(out, [0.001, 50.0])
    assert clips[0].as_dict() == {"input": "agitation_power", "reason": "box_high", "proposed": 70.0, "applied": 50.0}


def test_rate_limit_scales_with_elapsed_sim_time():
    p = proj(rate={"agitation_power": 0.5})  # W per simulated second
    prev = np.array([0.001, 20.0])
    out, clips = p.project(np.array([0.001, 30.0]), prev, 2.0, Y, U)
    assert out[1] == pytest.approx(21.0)
    assert reasons(clips) == {"agitation_power": "rate_high"}
    out, clips = p.project(np.array([0.001, 10.0]), prev, 4.0, Y, U)
    assert out[1] == pytest.approx(18.0)
    assert reasons(clips) == {"agitation_power": "rate_low"}
    out, _ = p.project(np.array([0.001, 30.0]), None, -1.0, Y, U)  # no previous action: no rate limit
    assert out[1] == 30.0


def test_box_wins_over_rate_when_they_do_not_meet():
    p = proj(box={"agitation_power": (0.0, 50.0)}, rate={"agitation_power": 1.0})
    out, clips = p.project(np.array([0.001, 90.0]), np.array([0.001, 80.0]), 1.0, Y, U)
    assert out[1] == 50.0  # previous action outside the (new) box: the box holds
    assert reasons(clips) == {"agitation_power": "box_high"}


def test_limited_band_is_applied_after_box_and_rate():
    p = proj(rate={"agitation_power": 2.0})
    band_lo, band_hi = np.array([-np.inf, 15.0]), np.array([np.inf, 25.0])
    out, clips = p.project(np.array([0.001, 40.0]), np.array([0.001, 24.0]), 1.0, Y, U, band_lo, band_hi)
    assert out[1] == 25.0
    assert reasons(clips) == {"agitation_power": "band_high"}
    # band out of reach this step: the rate limit holds, moving towards the band
    out, clips = p.project(np.array([0.001, 40.0]), np.array([0.001, 10.0]), 1.0, Y, U, band_lo, band_hi)
    assert out[1] == 12.0
    assert reasons(clips) == {"agitation_power": "rate_high"}


def test_state_dependent_linear_limit():
    # shear: agitation <= 0.6 W/L * volume
    p = proj(linear=[{"name": "shear", "w": {"agitation_power": 1.0}, "b": {"volume": 0.6}}])
    y = Y.copy()
    y[SPEC.index("outputs", "volume")] = 100.0
    out, clips = p.project(np.array([0.001, 90.0]), None, -1.0, y, U)
    assert out[1] == pytest.approx(60.0)
    assert reasons(clips) == {"agitation_power": "linear:shear"}
    y[SPEC.index("outputs", "volume")] = 120.0
    out, _ = p.project(np.array([0.001, 90.0]), None, -1.0, y, U)
    assert out[1] == pytest.approx(72.0)  # b follows the state


def test_coupled_linear_limit_projects_orthogonally_in_span_units():
    # a . w <= b with two inputs: the nearest point (distances in units of each input's span)
    # moves both: x = a - lambda * S^2 w, S = diag(span)
    p = proj(linear=[{"name": "sum", "w": {"base_flow": 5000.0, "agitation_power": 1.0}, "b0": 60.0,
                      "b": {"u.feed_rate": 10.0}}])
    u = U.copy()
    u[SPEC.index("inputs", "feed_rate")] = 0.4  # b = 60 + 10 * 0.4 = 64
    a = np.array([0.005, 50.0])  # w . a = 75
    out, clips = p.project(a, None, -1.0, Y, u)
    w, s2 = np.array([5000.0, 1.0]), np.array([0.01, 100.0]) ** 2
    assert w @ out == pytest.approx(64.0)
    np.testing.assert_allclose(out, a - (w @ a - 64.0) / (w @ (s2 * w)) * s2 * w, rtol=1e-9)
    assert 0 < out[0] < a[0] and 0 < out[1] < a[1]
    assert set(reasons(clips).values()) == {"linear:sum"}


def _reference(a, lo, hi, W, b, s):
    """The QP solved independently (SLSQP) in span-scaled coordinates z = x / s."""
    Wz = W * s
    cons = [{"type": "ineq", "fun": (lambda z, k=k: b[k] - Wz[k] @ z), "jac": (lambda z, k=k: -Wz[k])}
            for k in range(len(b))]
    az = a / s
    res = minimize(lambda z: 0.5 * np.sum((z - az) ** 2), np.clip(az, lo / s, hi / s), jac=lambda z: z - az,
                   bounds=list(zip(lo / s, hi / s)), constraints=cons, method="SLSQP",
                   options={"ftol": 1e-15, "maxiter": 1000})
    return res.x * s


def test_result_is_the_nearest_point_of_box_and_several_limits():
    """Cost: the scaled distance to the proposal equals the QP optimum (SLSQP) on random
    feasible problems with inputs of very different units."""
    rng = np.random.default_rng(7)
    names = ["base_flow", "acid_flow", "agitation_power", "aeration_rate"]
    for trial in range(60):
        m = int(rng.integers(1, 4))
        W = rng.normal(size=(m, 4)) * np.array([100.0, 100.0, 0.1, 0.3])
        x0 = np.array([rng.uniform(0, 0.01), rng.uniform(0, 0.01), rng.uniform(0, 100), rng.uniform(0, 30)])
        b = W @ x0 + rng.uniform(0.01, 2.0, m)
        linear = [{"name": f"l{k}", "w": dict(zip(names, W[k])), "b0": float(b[k])} for k in range(m)]
        p = Projector(ProjectionSection(linear=linear, max_iter=5000), SPEC, names)
        a = x0 + rng.normal(size=4) * np.array([0.01, 0.01, 60.0, 20.0])
        out, _ = p.project(a, None, -1.0, Y, U)
        ref = _reference(a, p.lo, p.hi, W, b, p.scale)
        assert not p.infeasible, trial
        slack = 1e-7 * (np.abs(b) + np.abs(W * p.scale).sum(1))
        assert (W @ out <= b + slack).all() and (out >= p.lo).all() and (out <= p.hi).all(), trial
        cost, ref_cost = np.linalg.norm((out - a) / p.scale), np.linalg.norm((ref - a) / p.scale)
        # tolerance: Dykstra's stopping rule and SLSQP's own accuracy
        assert cost <= ref_cost + 1e-6 * (1 + ref_cost), (trial, cost, ref_cost)


def test_infeasible_limits_are_flagged_and_the_box_still_holds():
    p = proj(linear=[{"name": "impossible", "w": {"agitation_power": 1.0}, "b0": -10.0}])
    out, clips = p.project(np.array([0.001, 30.0]), None, -1.0, Y, U)
    assert p.infeasible
    assert out[1] == 0.0  # the box point nearest to the limit
    assert "infeasible" in reasons(clips)["agitation_power"]


def test_a_limit_whose_b_cannot_be_computed_is_reported_and_can_be_left_out():
    p = proj(linear=[{"name": "shear", "w": {"agitation_power": 1.0}, "b": {"volume": 0.6}},
                     {"name": "fixed", "w": {"agitation_power": 1.0}, "b0": 90.0}],
             rate={"agitation_power": 2.0})
    y = Y.copy()
    assert p.unknown_limits(y, U) == []
    y[SPEC.index("outputs", "co2")] = np.nan  # read by no limit: 0 * NaN must not poison b
    assert p.unknown_limits(y, U) == []
    out, clips = p.project(np.array([0.001, 70.0]), None, -1.0, y, U)
    assert out[1] == pytest.approx(60.0) and reasons(clips) == {"agitation_power": "linear:shear"}
    y[SPEC.index("outputs", "volume")] = np.nan
    assert p.unknown_limits(y, U) == ["shear"]
    out, clips = p.project(np.array([0.001, 70.0]), np.array([0.001, 65.0]), 1.0, y, U, linear=False)
    assert out[1] == pytest.approx(67.0) and reasons(clips) == {"agitation_power": "rate_high"}  # box, rate only
