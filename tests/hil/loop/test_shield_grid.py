"""The grid's line-rating family in the in-loop shield (plants/grid/line_limits.py
`fill_line_rows`, hil/loop/shield.py): the compiled rows against the numpy family the safety
process runs (PTDF rows on each line's headroom), the topology check (a trip makes the limits
unknown until the PTDF is computed again), and the shield's actions against the safety
process's projection on configs/grid118_policy.toml (its fallback: a fixed dispatch)."""

from __future__ import annotations

import numpy as np
import pytest

from hil.bus.config import action_input_names
from hil.scenario.config import load_scenario
from hil.loop.shield import FALLBACK_UNKNOWN, POLICY, PROJECTED, Shield
from plants.base import Plant
from tests.hil.safety.helpers import ROOT

FIXED = {"gen_11.p_set": 220.0, "gen_29.p_set": 392.0}


@pytest.fixture(scope="module")
def grid():
    sc = load_scenario(ROOT / "configs" / "grid118_policy.toml")  # its fallback: the fixed dispatch FIXED
    model = sc.plant.load()
    spec = model.spec
    names = action_input_names(sc, spec)
    shield = Shield(sc, spec, names, plant=model, max_age_steps=4)
    plant = Plant(model, dt=1.0)
    plant.step(1.0)
    return sc, model, spec, names, shield, plant.compute_outputs().copy(), plant.u.copy()


def _perturbed(model, y0, u0, rng, shield):
    from plants.grid.plant import kernels_of

    L = kernels_of(model).lay
    idx = np.arange(y0.size)
    for _ in range(40):
        y, u = y0.copy(), u0.copy()
        s = rng.uniform(0.7, 1.6, size=idx[L["y.pf"]].size)
        y[idx[L["y.pf"]]] *= s
        y[idx[L["y.loading"]]] *= np.abs(s)
        y[idx[L["y.vm"]]] *= rng.uniform(0.97, 1.03, size=idx[L["y.vm"]].size)
        u[shield.act_u] = rng.uniform(shield.lo, shield.hi)
        yield y, u


def _numpy_rows(shield, y, u):
    proj = shield.projector
    _, fam, _ = proj.families[0]
    W, b = np.zeros((fam.m, len(shield.names))), np.zeros(fam.m)
    fam.fill(y, u, W, b)
    return W, b


def _compiled_rows(shield, y, u):
    m0 = shield.m_static
    W, b = np.zeros_like(shield.W[m0:]), np.zeros_like(shield.b0[m0:])
    shield.kernel_fill(y, u, W, b, *shield.fill_args)
    return W, b


def test_compiled_line_rows_equal_the_numpy_family(grid):
    sc, model, spec, names, shield, y0, u0 = grid
    rng = np.random.default_rng(3)
    active = 0
    for y, u in _perturbed(model, y0, u0, rng, shield):
        Wn, bn = _numpy_rows(shield, y, u)
        Wc, bc = _compiled_rows(shield, y, u)
        np.testing.assert_allclose(Wc, Wn, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(bc, bn, rtol=1e-9, atol=1e-9)
        active += int((np.abs(Wn).sum(axis=1) > 0).sum())
    assert active > 40  # rows were exercised, not only zeros


def test_a_trip_makes_the_rows_unknown_until_refreshed(grid):
    sc, model, spec, names, shield, y0, u0 = grid
    from plants.grid.plant import kernels_of

    L = kernels_of(model).lay
    Wn0, _ = _numpy_rows(shield, y0, u0)
    line = int(np.flatnonzero(np.abs(Wn0).sum(axis=1) > 0)[0] // 2)  # a line with active rows
    y = y0.copy()
    y[np.arange(y.size)[L["y.closed"]][line]] = 0.0
    stale = shield.fill_args[2]
    _, bc = _compiled_rows(shield, y, u0)
    assert np.isnan(bc).all() and stale[0] == 1                     # fail closed: the PTDF is of the old topology
    out = np.zeros(len(names))
    prev = u0[shield.act_u].copy()
    assert shield.step(5, prev, 5, y, u0, prev, 1.0, out) == FALLBACK_UNKNOWN
    assert shield.refresh(y) and stale[0] == 0
    Wc, bc = _compiled_rows(shield, y, u0)
    Wn, bn = _numpy_rows(shield, y, u0)
    np.testing.assert_allclose(Wc, Wn, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bc, bn, rtol=1e-9, atol=1e-9)
    assert not Wc[2 * line:2 * line + 2].any()                       # the open line has no rows
    assert shield.refresh(y0) is False                               # not stale: nothing to do
    _compiled_rows(shield, y0, u0)
    assert stale[0] == 1 and shield.refresh(y0) and stale[0] == 0    # back to the closed topology


def test_shield_projects_as_the_safety_process(grid):
    sc, model, spec, names, shield, y0, u0 = grid
    rng = np.random.default_rng(4)
    proj = shield.projector
    out = np.zeros(len(names))
    seen = {POLICY: 0, PROJECTED: 0}
    for y, u in _perturbed(model, y0, u0, rng, shield):
        prev = u[shield.act_u].copy()
        a = rng.uniform(shield.lo, shield.hi)
        ref, _ = proj.project(a, prev, 1.0, y, u)
        code = shield.step(100, a, 99, y, u, prev, 1.0, out)
        assert code in (POLICY, PROJECTED)
        seen[code] += 1
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-9 * shield.scale.max())
    assert seen[PROJECTED] > 5, seen


def test_late_proposal_takes_the_fixed_redispatch(grid):
    sc, model, spec, names, shield, y0, u0 = grid
    out = np.zeros(len(names))
    prev = u0[shield.act_u].copy()
    code = shield.step(100, np.array([300.0, 300.0]), 80, y0, u0, prev, 1.0, out)
    assert code == 2  # FALLBACK_LATE
    assert np.array_equal(shield.a, [FIXED[n] for n in names])       # the configured dispatch, then projected
    ref, _ = shield.projector.project(shield.a.copy(), prev, 1.0, y0, u0)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-9 * shield.scale.max())


def test_n1_rows_are_refused_in_the_loop(grid):
    sc, model, spec, names, shield, y0, u0 = grid
    sc2 = load_scenario(ROOT / "configs" / "grid118_policy.toml",
                        {"safety": {"projection": {"plant": [{"name": "lines", "kind": "line_rating",
                                                              "options": {"contingencies": [1]}}]}}})
    with pytest.raises(ValueError, match="contingencies: the N-1 rows have no compiled form"):
        Shield(sc2, spec, names, plant=model)
