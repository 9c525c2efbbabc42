"""The threaded residuals and Jacobian of a fit (hil/calibration/parallel.py): the same
residuals as the serial path to the bit, scipy's own "2-point" Jacobian to the bit (values
and memory layout), hence the serial fit's path and answer to the bit."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize._numdiff import _adjust_scheme_to_bounds, _compute_absolute_step, approx_derivative

from hil.calibration.parallel import ParallelResiduals, fd_steps
from hil.calibration.residual import ResidualModel
from hil.calibration.sysid import SysIdProblem
from plants.base import load_plant_module

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from sysid_speed import OUTS, PARAMS, make_runs  # noqa: E402

MODULE = load_plant_module("bioreactor")
SPEC = MODULE.SPEC


@pytest.fixture(scope="module")
def small():
    runs, x0 = make_runs(MODULE, 3, 4.0, 10.0)
    return runs, x0


def test_fd_steps_are_scipys():
    rng = np.random.default_rng(3)
    lb, ub = np.array([-1.0, 0.0, -np.inf, 0.0]), np.array([1.0, 2e-9, np.inf, 1.0])
    for _ in range(50):
        x = np.clip(rng.normal(0, 0.7, 4), lb, ub)
        x[3] = rng.choice([0.0, 1.0, 1.0 - 1e-9, 0.5])
        h = _compute_absolute_step(None, x, np.zeros(1), "2-point")
        ref, _ = _adjust_scheme_to_bounds(x, h, 1, "1-sided", lb, ub)
        np.testing.assert_array_equal(fd_steps(x, lb, ub), ref)


def test_threaded_residuals_and_jacobian_are_the_serial_ones_to_the_bit(small):
    runs, x0 = small
    pb = SysIdProblem(MODULE, runs, PARAMS, x0=x0, outputs=OUTS, bias_outputs=["glucose"])
    lo, hi = pb.bounds()
    for th in (pb.theta_of() + 0.01, np.clip(pb.theta_of() + 10.0, lo, hi)):  # the second on upper bounds
        ref = pb.residuals(th)
        J_ref = approx_derivative(pb.residuals, th, method="2-point", f0=ref, bounds=(lo, hi))
        for workers in (1, 2, 4):
            par = ParallelResiduals(pb, (lo, hi), workers)
            np.testing.assert_array_equal(par.fun(th), ref)
            J = par.jac(th)                                             # f(theta) from the cache
            np.testing.assert_array_equal(J, J_ref)
            assert J.flags.f_contiguous == J_ref.flags.f_contiguous
            np.testing.assert_array_equal(ParallelResiduals(pb, (lo, hi), workers).jac(th), J_ref)  # computed


def test_threaded_residuals_carry_the_problems_residual_model(small):
    """A problem simulated with a residual model (event features included): each thread's
    simulator applies the same correction, with its own event state."""
    runs, x0 = small
    nf = SPEC.n_states + SPEC.n_inputs + 1
    m = ResidualModel.zeros(SPEC, ["dissolved_o2"], ["x.biomass", "since.aeration_rate"], np.zeros(nf),
                            np.ones(nf), time_unit_s=MODULE.TIME_UNIT_S)
    m.W[0, 0], m.W[0, 1 + SPEC.index("states", "biomass")], m.W[0, -1] = -0.5, 0.1, -0.2
    pb = SysIdProblem(MODULE, runs, PARAMS, x0=x0, outputs=OUTS, correction=m)
    plain = SysIdProblem(MODULE, runs, PARAMS, x0=x0, outputs=OUTS)
    th = pb.theta_of()
    par = ParallelResiduals(pb, pb.bounds(), 2)
    np.testing.assert_array_equal(par.fun(th), pb.residuals(th))
    assert not np.array_equal(pb.residuals(th), plain.residuals(th))


def test_the_threaded_fit_gives_the_serial_fits_answer(small):
    runs, x0 = small
    a = SysIdProblem(MODULE, runs, PARAMS, x0=x0, outputs=OUTS).fit(parallel=True, workers=2)
    b = SysIdProblem(MODULE, runs, PARAMS, x0=x0, outputs=OUTS).fit(parallel=False)
    assert a.nfev == b.nfev
    np.testing.assert_array_equal(a.values, b.values)  # the same path to the bit
    np.testing.assert_array_equal(a.std, b.std)
