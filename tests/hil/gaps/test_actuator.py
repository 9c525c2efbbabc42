"""Actuator gap (hil/gaps/actuator.py): closed-form responses and hand-computed sequences.

Inputs of the test spec: inflow [0, 1] m3/s, valve [0, 100] %, heater [-5, 5] kW.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.hil.gaps.gaps_util import build, run_actuate

STEP = 0.1


def seq(values, idx=1, n_in=3, rest=(0.0, 0.0, 0.0)):
    """u(t) that plays `values` on input idx, one per step."""
    def u(t):
        out = list(rest)
        out[idx] = values[int(round(t / STEP))]
        return out
    return u


def test_first_order_lag_matches_the_exact_step_response():
    tau = 0.7
    g = build({"actuators": {"valve": {"lag_tau_s": tau}}})
    n = 80
    cmd = [0.0] * 5 + [100.0] * (n - 5)
    a = run_actuate(g, seq(cmd), n, STEP)[:, 1]
    k = np.arange(n - 5)
    # command steps at t0 = 5 dt; y(t0 + k dt) = 100 (1 - exp(-k dt / tau)), exact ZOH solution:
    # tolerance 1e-12 relative covers the rounding of the recursion only
    np.testing.assert_allclose(a[5:], 100.0 * -np.expm1(-k * STEP / tau), rtol=1e-12, atol=1e-12)
    assert np.all(a[:5] == 0.0)


def test_rate_limit_matches_the_ramp():
    rate = 30.0  # %/s -> 3 % per step
    g = build({"actuators": {"valve": {"rate_limit_per_s": rate}}})
    n = 60
    cmd = [10.0] * 3 + [80.0] * 40 + [70.0] * 17
    a = run_actuate(g, seq(cmd), n, STEP)[:, 1]
    t0 = 3
    ramp = np.minimum(10.0 + rate * STEP * np.arange(40), 80.0)
    np.testing.assert_allclose(a[t0:t0 + 40], ramp, atol=1e-9)
    assert np.all(np.abs(np.diff(a)) <= rate * STEP + 1e-9)
    assert a[t0 + 40] == pytest.approx(80.0) and a[-1] == pytest.approx(70.0)
    # a change within the limit takes one step (the element responds to the held command)
    assert a[t0 + 41] == pytest.approx(77.0) and a[t0 + 44] == pytest.approx(70.0)


def test_backlash_hand_sequence():
    g = build({"actuators": {"valve": {"backlash": 2.0}}})  # play +-1
    cmd = [50, 50.5, 51, 52, 51.5, 50, 49, 49.5, 51]
    want = [50, 50, 50, 51, 51, 51, 50, 50, 50]
    np.testing.assert_allclose(run_actuate(g, seq(cmd), len(cmd), STEP)[:, 1], want)


def test_deadband_hand_sequence():
    g = build({"actuators": {"valve": {"deadband": 1.0}}})
    cmd = [50, 50.9, 51.0, 51.1, 50.5, 52.0, 52.2, 51.3, 50.0]
    want = [50, 50, 50, 51.1, 51.1, 51.1, 52.2, 52.2, 50.0]
    np.testing.assert_allclose(run_actuate(g, seq(cmd), len(cmd), STEP)[:, 1], want)


def test_breakaway_hand_sequence():
    g = build({"actuators": {"heater": {"breakaway": 0.5}}})  # rest defaults to 0 (in bounds)
    cmd = [0.2, -0.4, 0.5, 0.49, -0.6, 3.0]
    want = [0.0, 0.0, 0.5, 0.0, -0.6, 3.0]
    np.testing.assert_allclose(run_actuate(g, seq(cmd, idx=2), len(cmd), STEP)[:, 2], want)
    g = build({"actuators": {"valve": {"breakaway": 5.0, "breakaway_rest": 100.0}}})
    np.testing.assert_allclose(run_actuate(g, seq([97, 95, 94]), 3, STEP)[:, 1], [100, 95, 94])


def test_saturation_gain_offset_quantization_and_bounds():
    g = build({"actuators": {"valve": {"gain": 1.1, "offset": 2.0, "saturation": [10.0, 90.0],
                                       "dac_bits": 4, "dac_range": [0.0, 100.0]},
                             "inflow": {"gain": 2.0}}})
    cmd = [0.0, 10.0, 50.0, 85.0, 100.0]
    u = lambda t: (0.3 + t, cmd[int(round(t / STEP))], 0.0)  # noqa: E731
    a = run_actuate(g, u, len(cmd), STEP)
    q = 100.0 / 16
    expect = [min(max(q * math.floor((1.1 * c + 2.0) / q + 0.5), 10.0), 90.0) for c in cmd]
    np.testing.assert_allclose(a[:, 1], expect, rtol=1e-15)
    # inflow: gain 2 then clipped to the physical bounds [0, 1]
    np.testing.assert_allclose(a[:, 0], np.minimum(2.0 * (0.3 + np.arange(5) * STEP), 1.0))
    np.testing.assert_array_equal(a[:, 2], 0.0)  # input without a gap passes through


def test_chain_is_deterministic_and_reset_restarts():
    cfg = {"actuators": {"valve": {"lag_tau_s": 0.5, "rate_limit_per_s": 50, "backlash": 1.0,
                                   "deadband": 0.5, "quant_step": 0.1}}}
    cmd = list(50 + 30 * np.sin(np.arange(300) * 0.05))
    g = build(cfg)
    a = run_actuate(g, seq(cmd), 300, STEP)
    g.reset(0)
    assert run_actuate(g, seq(cmd), 300, STEP).tobytes() == a.tobytes()
