"""Domain randomization (hil/gaps/randomization.py and GapPipeline.randomize)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from hil.gaps import GapsSection, batch_parameters
from hil.gaps.config import Dist
from hil.gaps.randomization import draw, episode_rng
from tests.hil.gaps.gaps_util import TANK, build, run_sense

RZ = {"randomize": {
    "plant": {"area": {"dist": "normal", "mean": 1.0, "std": 0.5},          # truncated [0.5, 2]
              "k_out": {"dist": "uniform", "low": 0.9, "high": 1.1, "relative": True}},
    "sensors": {"level": {"bias": {"dist": "uniform", "low": -0.2, "high": 0.2}}},
    "actuators": {"valve": {"gain": {"dist": "lognormal", "median": 1.0, "sigma": 0.05}}},
}}


def test_reproducible_by_seed_and_episode_and_independent_of_order():
    g = build(RZ, seed=11)
    p = TANK.nominal("params")
    d3 = g.randomize(p, 3)
    p3 = p.copy()
    g.randomize(p, 0)
    g2 = build(RZ, seed=11)
    q = TANK.nominal("params")
    assert g2.randomize(q, 3) == d3 and np.array_equal(q, p3)
    assert build(RZ, seed=12).randomize(TANK.nominal("params"), 3) != d3
    assert set(d3) == {"plant.area", "plant.k_out", "gaps.sensors.level.bias",
                       "gaps.actuators.valve.gain"}


def test_truncation_to_physical_bounds_and_relative_factor():
    g = build(RZ)
    p = TANK.nominal("params")
    areas, kouts = [], []
    for ep in range(3000):
        d = g.randomize(p, ep)
        areas.append(d["plant.area"])
        kouts.append(d["plant.k_out"])
    areas, kouts = np.array(areas), np.array(kouts)
    assert areas.min() >= 0.5 and areas.max() <= 2.0
    tn = stats.truncnorm((0.5 - 1.0) / 0.5, (2.0 - 1.0) / 0.5, loc=1.0, scale=0.5)
    assert stats.kstest(areas, tn.cdf).pvalue > 1e-3  # exact truncated normal (rejection)
    assert kouts.min() >= 0.18 and kouts.max() <= 0.22  # 0.2 * [0.9, 1.1]


def test_drawn_gap_parameters_act_on_the_signal():
    g = build(RZ)
    d = g.randomize(TANK.nominal("params"), 5)
    g.reset(5)
    m = run_sense(g, lambda t: (2.0, 300.0, 0.5), 3, 0.1)
    np.testing.assert_allclose(m[:, 0], 2.0 + d["gaps.sensors.level.bias"], rtol=1e-15)
    d6 = g.randomize(TANK.nominal("params"), 6)  # next episode: a new draw, not compounded
    g.reset(6)
    m = run_sense(g, lambda t: (2.0, 300.0, 0.5), 1, 0.1)
    assert m[0, 0] == pytest.approx(2.0 + d6["gaps.sensors.level.bias"], rel=1e-15)


def test_table_of_fitted_samples(tmp_path):
    p = tmp_path / "fits.csv"
    p.write_text("area,k_out\n0.8,0.15\n1.2,0.25\n1.5,0.2\n")
    g = build({"randomize": {"table": {"file": str(p), "rows": "sequential"}}})
    q = TANK.nominal("params")
    rows = [(g.randomize(q, ep)["plant.area"], q[1]) for ep in range(4)]
    assert rows == [(0.8, 0.15), (1.2, 0.25), (1.5, 0.2), (0.8, 0.15)]
    g = build({"randomize": {"table": {"file": str(p)}}})
    picked = {g.randomize(q, ep)["plant.table_row"] for ep in range(50)}
    assert picked == {0.0, 1.0, 2.0}


def test_batch_parameters_match_the_episodes():
    sec = GapsSection.model_validate(RZ)
    P = batch_parameters(sec, TANK, 64, seed=11, first_episode=10)
    assert P.shape == (64, TANK.n_params)
    g = build(RZ, seed=11)
    for i in (0, 17, 63):
        p = TANK.nominal("params")
        g.randomize(p, 10 + i)
        np.testing.assert_array_equal(P[i], p)


def test_batch_runs_randomized_bioreactors():
    """N randomized instances through the plant's batch form, rows within bounds."""
    from plants import bioreactor as bio

    sec = GapsSection.model_validate({"randomize": {"plant": {
        "mu_x": {"dist": "uniform", "low": 0.07, "high": 0.11}}}})
    n = 8
    P = batch_parameters(sec, bio.SPEC, n, seed=1)
    assert len(np.unique(P[:, bio.SPEC.index("params", "mu_x")])) == n
    X = np.repeat(bio.SPEC.nominal("states")[None], n, axis=0)
    U = np.repeat(bio.SPEC.nominal("inputs")[None], n, axis=0)
    bio.run_batch(0.0, X, U, P, 1.0 / 3600, 1, 3600)  # one simulated hour each
    bx = X[:, bio.SPEC.index("states", "biomass")]
    assert np.all(np.isfinite(X)) and np.all(np.diff(bx[np.argsort(P[:, 0])]) > 0)


def test_draw_choice_and_lognormal():
    rng = episode_rng(1, 0, 0)
    d = Dist(dist="choice", values=[1.0, 2.0, 3.0], max=2.5)
    assert {draw(d, rng, -10, 10) for _ in range(200)} == {1.0, 2.0}
    d = Dist(dist="lognormal", median=2.0, sigma=0.3)
    x = np.array([draw(d, rng, 0, 1e9) for _ in range(5000)])
    assert stats.kstest(x, stats.lognorm(s=0.3, scale=2.0).cdf).pvalue > 1e-3
