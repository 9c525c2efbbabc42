"""Sensor gap (hil/gaps/sensor.py), each feature against its definition.

Statistics used (N samples, a test fails by chance with probability ~1e-4 or less, and every
run is seeded so the outcome is fixed):
- std of white noise: (N-1) s^2 / sigma^2 ~ chi2(N-1); accept s inside the two-sided 99.99 %
  interval.
- AR(1) with coefficient a = exp(-dt/tau): the lag-1 sample autocorrelation r1 is
  asymptotically normal with variance (1 - a^2) / N (Bartlett); accept |r1 - a| < 4 sd. Its
  stationary variance estimate has variance ~ 2 sigma^4 (1 + a^2) / (N (1 - a^2)); accept
  within 4 sd.
- Poisson counts (spikes, dropouts): accept within 4.5 sd of the expected count.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tests.hil.gaps.gaps_util import build, run_sense

STEP = 0.1


def const(level=2.0, temp=300.0, flow=0.5):
    return lambda t: (level, temp, flow)


def test_white_noise_std_and_independence():
    sigma, n = 0.05, 40_000
    g = build({"sensors": {"level": {"noise_std": sigma}}})
    e = run_sense(g, const(), n, STEP)[:, 0] - 2.0
    lo, hi = stats.chi2.ppf([5e-5, 1 - 5e-5], n - 1)
    s2 = e.var(ddof=1)
    assert lo <= (n - 1) * s2 / sigma**2 <= hi
    assert abs(e.mean()) < 4 * sigma / math.sqrt(n)
    r1 = np.corrcoef(e[:-1], e[1:])[0, 1]
    assert abs(r1) < 4 / math.sqrt(n)  # white: no lag-1 correlation
    assert stats.kstest(e / sigma, "norm").pvalue > 1e-4


def test_colored_noise_std_and_lag1_autocorrelation():
    sigma, tau, n = 0.2, 2.0, 60_000
    g = build({"sensors": {"temp": {"colored_std": sigma, "colored_tau_s": tau}}})
    e = run_sense(g, const(), n, STEP)[:, 1] - 300.0
    a = math.exp(-STEP / tau)
    r1 = np.corrcoef(e[:-1], e[1:])[0, 1]
    assert abs(r1 - a) < 4 * math.sqrt((1 - a * a) / n)
    var_sd = math.sqrt(2 * sigma**4 * (1 + a * a) / (n * (1 - a * a)))
    assert abs(e.var() - sigma**2) < 4 * var_sd


def test_bias_and_linear_drift_are_exact():
    g = build({"sensors": {"level": {"bias": 0.3, "drift_per_s": 0.01},
                           "flow": {"drift_per_day": 0.02}}})
    n = 500
    t = np.arange(n) * STEP
    m = run_sense(g, const(), n, STEP)
    np.testing.assert_allclose(m[:, 0] - 2.0, 0.3 + 0.01 * t, rtol=0, atol=1e-13)
    slope = np.polyfit(t, m[:, 2] - 0.5, 1)[0]
    assert slope == pytest.approx(0.02 / 86400.0, rel=1e-9)
    np.testing.assert_array_equal(m[:, 1], 300.0)  # an output without a gap is untouched


def test_gain_error():
    g = build({"sensors": {"level": {"gain": 1.1}}})
    m = run_sense(g, lambda t: (1.0 + t, 300, 0.5), 50, STEP)
    np.testing.assert_allclose(m[:, 0], 1.1 * (1.0 + np.arange(50) * STEP), rtol=1e-15)


def test_random_walk_increments():
    q, n = 0.01, 40_000  # units / sqrt(s)
    g = build({"sensors": {"level": {"random_walk_std": q}}})
    e = run_sense(g, const(), n, STEP)[:, 0] - 2.0
    assert e[0] == 0.0  # the walk starts at 0
    inc = np.diff(e)
    sigma = q * math.sqrt(STEP)
    lo, hi = stats.chi2.ppf([5e-5, 1 - 5e-5], inc.size - 1)
    assert lo <= (inc.size - 1) * inc.var(ddof=1) / sigma**2 <= hi
    assert abs(np.corrcoef(inc[:-1], inc[1:])[0, 1]) < 4 / math.sqrt(inc.size)


def test_adc_quantization_step_is_exact():
    g = build({"sensors": {"level": {"adc_bits": 8, "adc_range": [0.0, 10.0]}}})
    true = np.linspace(-1.0, 11.0, 2000)
    m = run_sense(g, lambda t: (true[int(round(t / STEP))], 300, 0.5), true.size, STEP)[:, 0]
    q = 10.0 / 256
    codes = m / q
    np.testing.assert_array_equal(codes, np.round(codes))  # every value is lo + code * q exactly
    assert m.min() == 0.0 and m.max() == 255 * q  # clipped to the ADC's codes
    inside = (true >= 0) & (true <= 10 - q)
    assert np.all(np.abs(m[inside] - true[inside]) <= q / 2 + 1e-12)
    assert len(np.unique(np.diff(np.unique(m)).round(12))) == 1  # uniform step


def test_plain_quant_step_and_round_half_up():
    g = build({"sensors": {"level": {"quant_step": 0.25}}})
    vals = [0.1, 0.125, 0.375, -0.125, 1.0]
    m = run_sense(g, lambda t: (vals[int(round(t / STEP))], 300, 0.5), len(vals), STEP)[:, 0]
    np.testing.assert_array_equal(m, [0.0, 0.25, 0.5, 0.0, 1.0])


def test_sample_and_hold():
    g = build({"sensors": {"level": {"sample_period_s": 0.5}}})
    n = 100
    m = run_sense(g, lambda t: (t, 300, 0.5), n, STEP)[:, 0]
    t = np.arange(n) * STEP
    expected = np.floor(t / 0.5 + 1e-9) * 0.5  # the value at the last sample instant
    np.testing.assert_allclose(m, expected, atol=1e-12)


@pytest.mark.parametrize("mode,value", [("hold", None), ("stuck", -1.0), ("bad", math.nan)])
def test_dropouts(mode, value):
    rate, dur, n = 0.05, 2.0, 100_000
    cfg = {"dropout_rate_per_s": rate, "dropout_duration_s": dur, "dropout_mode": mode}
    if mode == "stuck":
        cfg["dropout_value"] = value
    g = build({"sensors": {"level": cfg}})
    m = run_sense(g, lambda t: (1.0 + t, 300, 0.5), n, STEP)[:, 0]
    true = 1.0 + np.arange(n) * STEP
    bad = m != true
    if mode == "hold":  # frozen at the last good value
        idx = np.flatnonzero(bad)
        assert np.all(m[idx] == m[idx - 1])
    elif mode == "stuck":
        assert np.all(m[bad] == -1.0)
    else:
        assert np.all(np.isnan(m[bad]))
    starts = np.flatnonzero(bad[1:] & ~bad[:-1]) + 1
    runs = np.diff(np.flatnonzero(np.diff(np.r_[0, bad.astype(int), 0])))[::2]
    np.testing.assert_array_equal(runs[:-1], round(dur / STEP))  # each lasts dur exactly
    # starts: per good sample p = 1 - exp(-rate dt); expected count over the good samples
    p = -math.expm1(-rate * STEP)
    n_good = n - bad.sum()
    assert abs(starts.size - n_good * p) < 4.5 * math.sqrt(n_good * p)


def test_spikes_rate_and_size():
    rate, size, n = 0.1, 0.5, 100_000
    g = build({"sensors": {"level": {"spike_rate_per_s": rate, "spike_size": size}}})
    e = run_sense(g, const(), n, STEP)[:, 0] - 2.0
    hit = e != 0
    np.testing.assert_allclose(np.abs(e[hit]), size, rtol=1e-12)
    p = -math.expm1(-rate * STEP)
    assert abs(hit.sum() - n * p) < 4.5 * math.sqrt(n * p)
    k = hit.sum()
    assert abs((e[hit] > 0).sum() - k / 2) < 4.5 * math.sqrt(k / 4)  # sign 50/50


def test_features_have_independent_streams():
    """Switching spikes on leaves the white-noise sequence unchanged outside the spikes."""
    a = run_sense(build({"sensors": {"level": {"noise_std": 0.1}}}), const(), 3000, STEP)[:, 0]
    b = run_sense(build({"sensors": {"level": {"noise_std": 0.1, "spike_rate_per_s": 0.2,
                                                "spike_size": 5.0}}}), const(), 3000, STEP)[:, 0]
    same = np.abs(b - a) < 1.0
    assert 0 < (~same).sum() < 300
    np.testing.assert_array_equal(a[same], b[same])


def test_same_seed_same_run_bit_for_bit_and_seed_matters():
    cfg = {"sensors": {"level": {"noise_std": 0.1, "colored_std": 0.1, "random_walk_std": 0.01,
                                 "spike_rate_per_s": 0.1, "spike_size": 1.0,
                                 "dropout_rate_per_s": 0.05, "dropout_duration_s": 1.0}}}
    a = run_sense(build(cfg, seed=3), const(), 5000, STEP)
    b = run_sense(build(cfg, seed=3), const(), 5000, STEP)
    c = run_sense(build(cfg, seed=4), const(), 5000, STEP)
    assert a.tobytes() == b.tobytes()
    assert not np.array_equal(a, c)
    g = build(cfg, seed=3)
    first = run_sense(g, const(), 5000, STEP)
    g.reset(0)  # reset restarts the same episode exactly
    assert run_sense(g, const(), 5000, STEP).tobytes() == first.tobytes() == a.tobytes()
    g.reset(1)
    assert not np.array_equal(run_sense(g, const(), 5000, STEP), a)
