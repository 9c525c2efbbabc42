"""Latency gap (hil/gaps/latency.py): exact delays in lockstep, causal delivery, distributions.

Distribution checks draw 20000 delays through the kernel's own draw function and accept at
the 0.1 % level: scipy.stats.kstest / ks_2samp p-value > 1e-3.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from hil.gaps import latency as lat
from hil.gaps.profile import from_latencies, make_profile, series_entry
from tests.hil.gaps.gaps_util import build, run_actuate, run_sense

STEP = 0.1


def ramp(t):
    return (t, 300.0 + t, 0.5)


@pytest.mark.parametrize("delay_s,steps", [(0.3, 3), (0.25, 3), (0.0, 0), (1.0, 10)])
def test_constant_observation_delay_is_exact_to_the_step(delay_s, steps):
    g = build({"latency": {"observation": {"level": {"value_s": delay_s}}}})
    n = 200
    m = run_sense(g, ramp, n, STEP)
    k = np.arange(n)
    src = np.maximum(k - steps, 0) * STEP  # before the first delivery: the first value
    np.testing.assert_array_equal(m[:, 0], src)
    np.testing.assert_array_equal(m[:, 1], 300.0 + k * STEP)  # not delayed


def test_constant_actuation_delay_and_group_share_the_draw():
    g = build({"latency": {"actuation": {"both": {"signals": ["inflow", "valve"],
                                                   "dist": "uniform", "low_s": 0.0,
                                                   "high_s": 0.5}}}})
    n = 400
    a = run_actuate(g, lambda t: (t / 100, t, 0.0), n, STEP)
    np.testing.assert_allclose(a[:, 0] * 100, a[:, 1], rtol=1e-12)  # same sample delivered
    age = np.arange(n) * STEP - a[:, 1]
    assert age.min() >= -1e-9 and age.max() <= 0.5 + STEP + 1e-9
    assert len(np.unique(np.round(age[10:] / STEP))) > 2  # the delay varies


def _reference(times, delays, fifo, eps):
    """Delivered sample index per call, from the rule in latency.py's docstring."""
    arrival = np.asarray(times) + np.asarray(delays)
    if fifo:
        arrival = np.maximum.accumulate(arrival)
    out = []
    for k, t in enumerate(times):
        ok = np.flatnonzero(arrival[: k + 1] <= t + eps)
        out.append(ok.max() if ok.size else 0)
    return np.array(out)


@pytest.mark.parametrize("order", ["fifo", "latest"])
def test_random_delays_follow_the_delivery_rule(order):
    cfg = {"dist": "lognormal", "median_s": 0.3, "sigma": 0.8, "jitter_s": 0.05,
           "max_s": 3.0, "order": order}
    g = build({"max_delay_s": 3.0, "latency": {"observation": {"level": cfg}}})
    line = g.observation
    # the delays the kernel will draw: same function, copies of the same state
    L, I, R = line.L.copy(), line.I.copy(), line.R.copy()
    n = 3000
    delays = [lat.draw_delay(L, 0, I, R, line.prof) for _ in range(n)]
    times = np.arange(n) * STEP
    m = run_sense(g, lambda t: (t, 300.0, 0.5), n, STEP)
    idx = np.round(m[:, 0] / STEP).astype(int)
    np.testing.assert_array_equal(idx, _reference(times, delays, order == "fifo", 1e-6 * STEP))
    assert np.all(np.diff(idx) >= 0)  # causal: never an older sample after a newer one
    assert np.all(np.array(delays) <= 3.0) and np.all(np.array(delays) >= 0.0)
    if order == "latest":
        assert len(set(range(n)) - set(idx)) > 0  # overtaken samples were dropped


def _draws(g, n=20_000, line="observation"):
    d = getattr(g, line)
    L, I, R = d.L.copy(), d.I.copy(), d.R.copy()
    return np.array([lat.draw_delay(L, 0, I, R, d.prof) for _ in range(n)])


def test_lognormal_uniform_normal_distributions():
    g = build({"latency": {"observation": {"level": {"dist": "lognormal", "median_s": 0.2,
                                                     "sigma": 0.5}}}})
    assert stats.kstest(_draws(g), stats.lognorm(s=0.5, scale=0.2).cdf).pvalue > 1e-3
    g = build({"latency": {"observation": {"level": {"dist": "uniform", "low_s": 0.1,
                                                     "high_s": 0.4}}}})
    assert stats.kstest(_draws(g), stats.uniform(0.1, 0.3).cdf).pvalue > 1e-3
    g = build({"latency": {"observation": {"level": {"dist": "normal", "mean_s": 1.0,
                                                     "std_s": 0.1}}}})
    assert stats.kstest(_draws(g), stats.norm(1.0, 0.1).cdf).pvalue > 1e-3


def test_jitter_and_clipping():
    g = build({"latency": {"observation": {"level": {"value_s": 0.5, "jitter_s": 0.2,
                                                     "min_s": 0.4, "max_s": 0.65}}}})
    d = _draws(g)
    assert d.min() == 0.4 and d.max() == 0.65
    inner = d[(d > 0.4) & (d < 0.65)]  # U(0.3, 0.7) restricted to the unclipped part
    assert stats.kstest(inner, stats.uniform(0.4, 0.25).cdf).pvalue > 1e-3
    assert abs((d == 0.4).mean() - 0.25) < 0.02 and abs((d == 0.65).mean() - 0.125) < 0.02


def test_replayed_profile_matches_its_source(tmp_path):
    rng = np.random.default_rng(5)
    source = 0.01 + rng.gamma(2.0, 0.02, 5000)  # a skewed measured latency
    p = tmp_path / "plc.json"
    p.write_text(json.dumps(from_latencies(source.tolist(), "s", name="plc")))
    g = build({"latency": {"observation": {"level": {"dist": "profile", "file": str(p),
                                                     "replay": "random"}}}})
    assert stats.ks_2samp(_draws(g), source).pvalue > 1e-3
    # sequence replay: the recorded order, cyclic, from a start drawn per episode
    g = build({"latency": {"observation": {"level": {"dist": "profile", "file": str(p)}}}})
    d = _draws(g, 6000)
    start = int(np.flatnonzero(np.isclose(source, d[0]))[0])
    np.testing.assert_array_equal(d, np.roll(source, -start)[np.arange(6000) % 5000])


def test_replayed_histogram_matches_its_cdf(tmp_path):
    edges = np.array([0.0, 0.01, 0.02, 0.05, 0.1])
    counts = np.array([10.0, 50.0, 30.0, 10.0])
    prof = make_profile({"h": {"unit": "s", "histogram": {"edges": edges.tolist(),
                                                          "counts": counts.tolist()}}})
    p = tmp_path / "h.json"
    p.write_text(json.dumps(prof))
    g = build({"latency": {"observation": {"level": {"dist": "profile", "file": str(p)}}}})
    cdf_pts = np.r_[0.0, np.cumsum(counts) / counts.sum()]
    assert stats.kstest(_draws(g), lambda x: np.interp(x, edges, cdf_pts)).pvalue > 1e-3


def test_empirical_samples():
    samples = [0.1, 0.1, 0.2, 0.7]
    g = build({"latency": {"observation": {"level": {"dist": "empirical", "samples_s": samples}}}})
    d = _draws(g)
    assert set(np.unique(d)) == {0.1, 0.2, 0.7}
    assert abs((d == 0.1).mean() - 0.5) < 4 * math.sqrt(0.25 / d.size)


def test_series_entry_round_trip_stats():
    e = series_entry(np.array([0.1, 0.2, 0.3]), "x")
    assert e["stats"]["n"] == 3 and e["stats"]["max"] == 0.3


def test_ring_is_a_power_of_two_covering_the_max_delay():
    assert lat.ring_slots(1.0, 0.1) == 16  # ceil(10) + 2 = 12 -> 16
    assert lat.ring_slots(0.6, 0.1) == 8
    g = build({"max_delay_s": 1.0, "latency": {"observation": {"level": {"value_s": 1.0}}}})
    m = run_sense(g, ramp, 100, STEP)
    np.testing.assert_allclose(m[10:, 0], np.arange(90) * STEP, atol=1e-12)
