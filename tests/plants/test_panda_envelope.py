"""plants/panda.py `envelope_terms` (the dynamics the arm's safety limits are built on: the
in-loop shield and the safety process) against Pinocchio, an independent implementation:

    Minv = (M(q) + diag(armature))^-1         M from pin.crba, armature added here
    ddq0 = Minv (-C(q, dq) dq)                 no gravity (the drive compensates it), tau = 0;
                                               C dq from pin.nonLinearEffects with gravity zero

on random states across the joint range. Tolerance 1e-9 (relative to the largest entry): the two
are double-precision implementations of the same rigid-body model (the manipulator benchmark
checks ABA to 1e-9 rad/s^2 the same way). The column passes of `minv_after_aba` are also checked
against the plain form they replace (one full ABA per column) to 1e-12.
"""

import numpy as np
import pytest

from plants.manipulator import arm
from plants.manipulator import dynamics as dyn

pin = pytest.importorskip("pinocchio")


@pytest.fixture(scope="module")
def env():
    from hil.scenario.config import load_scenario
    from plants.panda import _Envelope
    from tests.hil.safety.helpers import ROOT

    plant = load_scenario(ROOT / "configs" / "panda_policy.toml").plant.load()
    return _Envelope(plant)


def _pin_model(armature):
    from benchmarks.manipulator_speed import pinocchio_model

    _, model = pinocchio_model()
    model.gravity.setZero()
    model.armature[:] = 0.0
    return model, model.createData()


def _states(env, n, seed):
    rng = np.random.default_rng(seed)
    from benchmarks.manipulator_speed import pinocchio_model

    _, model = pinocchio_model()
    lo, hi = model.lowerPositionLimit, model.upperPositionLimit
    Q = lo + (hi - lo) * rng.uniform(0.05, 0.95, size=(n, env.nb))
    dQ = rng.uniform(-2.0, 2.0, size=(n, env.nb))
    return Q, dQ


def test_minv_and_drift_match_pinocchio(env):
    from plants.panda import envelope_terms

    model, data = _pin_model(env.armature)
    worst_m = worst_a = 0.0
    for q, dq in zip(*_states(env, 40, 3)):
        envelope_terms(q, dq, env.mf0, env.mi, env.wf, env.armature, env.g0, env.pos, env.J, env.Minv, env.ddq0)
        M = pin.crba(model, data, q)
        M = np.triu(M) + np.triu(M, 1).T
        Minv_ref = np.linalg.inv(M + np.diag(env.armature))
        ddq0_ref = Minv_ref @ (-pin.nonLinearEffects(model, data, q, dq))
        worst_m = max(worst_m, np.abs(env.Minv - Minv_ref).max() / np.abs(Minv_ref).max())
        worst_a = max(worst_a, np.abs(env.ddq0 - ddq0_ref).max() / max(np.abs(ddq0_ref).max(), 1.0))
    assert worst_m < 1e-9 and worst_a < 1e-9, (worst_m, worst_a)


def test_column_passes_equal_one_full_aba_per_column(env):
    from plants.panda import envelope_terms

    model = arm.model_views(env.mf0, env.mi)
    work, _ = arm.work_views(env.wf.copy(), env.mi[0])
    parent, jtype, E_tree, r_tree, inertia0 = model[:5]
    E, r, v, c, pA, IA, U, D, uu, acc, T, tmp = work[:12]
    nb = env.nb
    for q, dq in zip(*_states(env, 10, 4)):
        envelope_terms(q, dq, env.mf0, env.mi, env.wf, env.armature, env.g0, env.pos, env.J, env.Minv, env.ddq0)
        ref = np.zeros((nb, nb))
        col, tau, zero, fext = np.zeros(nb), np.zeros(nb), np.zeros(nb), np.zeros((nb, 6))
        for j in range(nb):
            tau[:] = 0.0
            tau[j] = 1.0
            dyn.aba(parent, jtype, E_tree, r_tree, inertia0, env.armature, env.g0, q, zero, tau, fext, col,
                    E, r, v, c, pA, IA, U, D, uu, acc, T, tmp)
            ref[:, j] = col
        np.testing.assert_allclose(env.Minv, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
