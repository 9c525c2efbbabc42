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


# ---- rings sized to the delays a channel can draw (channel_bound_s; issue 18) ----


def _channel(**kw) -> dict:
    from hil.gaps.config import LatencyChannel

    return LatencyChannel(**kw).model_dump()


@pytest.mark.parametrize("kw, randomized, want", [
    ({"value_s": 1.2}, False, 1.2),                                           # constant
    ({"value_s": 1.2, "jitter_s": 0.3}, False, 1.5),                          # + jitter
    ({"value_s": 9.0}, False, 5.0),                                           # clipped to max_delay_s
    ({"value_s": 1.2, "max_s": 1.0}, False, 1.0),                             # clipped to max_s
    ({"value_s": 0.1, "min_s": 0.7}, False, 0.7),                             # raised to min_s
    ({"dist": "uniform", "low_s": 0.2, "high_s": 0.9}, False, 0.9),
    ({"dist": "empirical", "samples_s": [0.1, 2.5, 0.3]}, False, 2.5),
    ({"dist": "normal", "mean_s": 0.2, "std_s": 0.01}, False, 5.0),           # unbounded: the clip
    ({"dist": "lognormal", "median_s": 0.2, "sigma": 0.1, "max_s": 2.0}, False, 2.0),
    ({"value_s": 1.2, "max_s": 3.0}, True, 3.0),                              # drawn per episode: the clip
])
def test_channel_bound_is_the_largest_delay_a_channel_can_draw(kw, randomized, want):
    assert lat.channel_bound_s(_channel(**kw), None, 5.0, randomized) == pytest.approx(want, abs=1e-12)


def test_channel_bound_holds_for_every_draw():
    """No draw of draw_delay exceeds the bound (jitter, clip, the uniform's top end)."""
    for kw in ({"dist": "uniform", "low_s": 0.2, "high_s": 0.9, "jitter_s": 0.05},
               {"dist": "empirical", "samples_s": [0.1, 0.4], "jitter_s": 0.02},
               {"dist": "normal", "mean_s": 1.0, "std_s": 2.0, "max_s": 2.0}):
        g = build({"max_delay_s": 3.0, "latency": {"observation": {"level": kw}}})
        line = g.observation
        bound = line.bound_s
        L, I, R = line.L.copy(), line.I.copy(), line.R.copy()
        d = np.array([lat.draw_delay(L, 0, I, R, line.prof) for _ in range(20000)])
        assert d.max() <= bound and d.max() > 0.8 * bound  # tight, and never above


def test_ring_is_sized_to_the_channels_not_to_max_delay_s():
    g = build({"max_delay_s": 100.0, "latency": {
        "observation": {"level": {"value_s": 1.0}, "temp": {"dist": "uniform", "low_s": 0.1, "high_s": 0.5}},
        "actuation": {"valve": {"dist": "normal", "mean_s": 0.2, "std_s": 0.05}}}})
    assert g.observation.bound_s == 1.0 and g.observation.m == lat.ring_slots(1.0, STEP) == 16
    assert g.actuation.bound_s == 100.0 and g.actuation.m == lat.ring_slots(100.0, STEP)  # normal: unbounded
    # a field drawn per episode: only the clip bounds it, and the draws fit the ring
    g = build({"max_delay_s": 100.0, "latency": {"observation": {"level": {"value_s": 1.0, "max_s": 4.0}}},
               "randomize": {"latency": {"observation": {"level": {
                   "value_s": {"dist": "uniform", "low": 0.5, "high": 3.9}}}}}})
    assert g.observation.bound_s == 4.0
    for episode in range(5):
        drawn = g.randomize(np.array([1.0, 0.2]), episode)
        assert 0.5 <= drawn["gaps.latency.observation.level.value_s"] <= 3.9


@pytest.mark.parametrize("order", ["fifo", "latest"])
def test_outputs_do_not_depend_on_the_ring_length(order):
    """The same channels and streams through a ring sized to the channels' bound and one sized
    to max_delay_s (the former sizing) deliver identical values, bit for bit."""
    chans = [(_channel(dist="uniform", low_s=0.05, high_s=0.45, jitter_s=0.05, order=order), [0], None),
             (_channel(value_s=0.3, order=order), [1], None),
             (_channel(dist="lognormal", median_s=0.1, sigma=0.9, max_s=0.6, order=order), [2, 3], None)]
    lines = [lat.DelayLine(chans, 5, STEP, 20.0), lat.DelayLine(chans, 5, STEP, 20.0, bounds_s=[
        lat.channel_bound_s(c, None, 20.0) for c, _, _ in chans])]
    assert lines[0].m == 256 and lines[1].m == 8
    for line in lines:
        line.reset(lambda R: R.__setitem__(slice(None), np.arange(1, R.size + 1, dtype=np.uint64) * 977))
    out = [np.zeros(5), np.zeros(5)]
    x = np.zeros(5)
    for k in range(3000):
        x[:] = np.sin(0.37 * k + np.arange(5))
        for line, o in zip(lines, out):
            line.apply(k * STEP, x, o)
        np.testing.assert_array_equal(out[0], out[1])


def test_a_channel_set_beyond_its_ring_is_refused():
    g = build({"max_delay_s": 100.0, "latency": {"observation": {"level": {"value_s": 1.0}}}})
    with pytest.raises(ValueError, match="exceed"):
        g.observation.set(0, _channel(value_s=5.0))
    g.observation.set(0, _channel(value_s=0.5))  # shorter: fine
    assert g.observation.L[0, lat.L_P1] == 0.5
