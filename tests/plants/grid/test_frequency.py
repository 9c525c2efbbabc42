"""Island frequency: swing + governor + AGC against the closed form of the same linear model."""

import numpy as np
import pytest
from scipy.linalg import expm

from plants.grid.case import read_matpower
from plants.grid.dynamics import frequency_step
from plants.grid.network import GridModel, GridParams

from .conftest import GRIDS


def closed_form(m, d, kgov, tg, ki, dpl, t):
    """Exact solution x(t) of x' = A x + b (x = [dw, dPm, Pagc], x(0) = 0) by the augmented exponential."""
    A = np.array([[-d / m, 1 / m, 1 / m], [-kgov / tg, -1 / tg, 0.0], [-ki, 0.0, 0.0]])
    aug = np.zeros((4, 4))
    aug[:3, :3] = A
    aug[:3, 3] = [-dpl / m, 0.0, 0.0]
    return expm(aug * t)[:3, 3]


@pytest.mark.parametrize("ki", [0.0, 2.0])
def test_kernel_matches_closed_form(ki):
    m, d, kgov, tg, dpl = 10.0, 1.5, 20.0, 0.5, 0.3     # pu s, pu/pu, pu/pu, s, pu
    x = np.zeros(3)
    out = np.zeros(3)
    for k in range(1, 31):
        frequency_step(x[0], x[1], x[2], dpl, m, d, kgov, tg, ki, 1.0, out)
        x[:] = out
        # RK4 at h <= min(Tg, M/(D+K))/20: local error ~ (h/tau)^5 / 120 ~ 3e-9 relative; 1e-7 pu of a
        # ~1e-2 pu deviation leaves margin and still catches a wrong sign or term (those are >1e-3).
        assert np.abs(x - closed_form(m, d, kgov, tg, ki, dpl, float(k))).max() < 1e-7
    if ki == 0.0:
        assert x[0] == pytest.approx(-dpl / (d + kgov), rel=1e-6)   # droop steady state
    else:
        # AGC's integral removes the droop offset: after 30 s (about 3 AGC time constants (D+K)/Ki) the
        # deviation is under 10 % of the droop-only steady state and mechanical power has risen to dPL.
        assert abs(x[0]) < 0.1 * dpl / (d + kgov) and x[1] + x[2] == pytest.approx(dpl, rel=0.01)


def test_kernel_first_order_limit():
    """Tg -> 0: dw(t) = -dPL/(D+K) (1 - exp(-(D+K) t / M)), the textbook swing/droop closed form."""
    m, d, kgov, dpl = 8.0, 1.0, 15.0, 0.2
    x, out = np.zeros(3), np.zeros(3)
    for k in range(1, 11):
        frequency_step(x[0], x[1], x[2], dpl, m, d, kgov, 1e-4, 0.0, 0.25, out)
        x[:] = out
        t = 0.25 * k
        expected = -dpl / (d + kgov) * (1 - np.exp(-(d + kgov) * t / m))
        assert x[0] == pytest.approx(expected, rel=1e-3)  # Tg/tau = 2e-4 sets the tolerance


def _case14_model(**kw):
    model = GridModel(read_matpower(GRIDS / "case14.m"), GridParams(**kw))
    assert model.out["freq_hz"][0] == 50.0  # balance() starts at rest
    return model


def test_grid_load_step_follows_closed_form():
    """case14, every load +5 % at t = 0: frequency vs the closed form with the island's M, D, K, dPL."""
    model = _case14_model()
    model.load_scale[:] = 1.05
    freqs, dpls = [], []
    for _ in range(20):
        model.step(1.0)
        freqs.append(model.out["freq_hz"][0])
        r = model.state["island"][0]
        dpls.append(model._p_elec[r] - model._p_sched[r])
    m, kgov, d = model._m[0], model._kgov[0], model.p.load_damping * model._p_load[0]
    dpl = dpls[0]
    # dPL is the demand step plus the change of losses as flows shift: it varies by < 1 % over the run,
    # which bounds the difference to the constant-dPL closed form.
    assert np.ptp(dpls) < 0.01 * abs(dpl)
    for k, f in enumerate(freqs, start=1):
        expected = 50.0 * (1 + closed_form(m, d, kgov, model.p.governor_tg_s, 0.0, dpl, float(k))[0])
        assert f - 50.0 == pytest.approx(expected - 50.0, rel=0.02)
    assert freqs[-1] < 50.0 and dpl == pytest.approx(0.05 * model.case.pd_mw.sum() / 100, rel=0.1)


def test_agc_restores_frequency_and_picks_up_the_load():
    model = _case14_model(agc_ki=5.0)
    p0 = model.out["p_gen_mw"].sum()
    model.load_scale[:] = 1.05
    for _ in range(300):
        model.step(1.0)
    assert abs(model.out["freq_hz"][0] - 50.0) < 1e-5
    # Generation covers the extra 5 % of 259 MW plus the extra losses.
    assert model.out["p_gen_mw"].sum() - p0 == pytest.approx(0.05 * 259.0, rel=0.1)
