"""Residuals of a SysIdProblem on every core: runs and finite-difference Jacobian columns as
independent tasks on a thread pool (the simulation kernel releases the GIL: nogil Numba),
one RunSimulator (its preallocated buffers) per worker thread.

`ParallelResiduals(problem)` gives `fun(theta)` and `jac(theta)` for scipy least_squares.
The Jacobian is scipy's default "2-point" forward difference to the bit: the same absolute
step (sqrt(eps) * max(1, |theta_i|) signed like theta_i, made exactly representable), the
same side flipped or shortened at a bound (`fd_steps`), the same column (f(theta + h e_i)
- f(theta)) / h, with f(theta) the value least_squares just computed (cached), so a fit
takes the same path and reaches the same answer as with `jac="2-point"` (tested in
tests/hil/calibration/test_sysid_speed.py); only the wall time changes.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hil.calibration.simulate import RunSimulator

EPS = np.finfo(np.float64).eps


def fd_steps(x0: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """The signed forward-difference steps scipy's approx_derivative takes for method
    "2-point" with bounds (scipy.optimize._numdiff: _compute_absolute_step, then
    _adjust_scheme_to_bounds, "1-sided"); the column's divisor is recomputed from the
    evaluation point (`ParallelResiduals.jac`), as scipy does."""
    sign = (x0 >= 0).astype(float) * 2 - 1
    h = EPS ** 0.5 * sign * np.maximum(1.0, np.abs(x0))
    if np.all((lb == -np.inf) & (ub == np.inf)):
        return h
    lower, upper = x0 - lb, ub - x0
    x = x0 + h
    violated = (x < lb) | (x > ub)
    fitting = np.abs(h) <= np.maximum(lower, upper)
    h[violated & fitting] *= -1
    forward = (upper >= lower) & ~fitting
    h[forward] = upper[forward]
    backward = (upper < lower) & ~fitting
    h[backward] = -lower[backward]
    return h


class ParallelResiduals:
    """fun / jac of `problem` (a SysIdProblem) over a thread pool of `workers` threads
    (default: the cores), bounds (lb, ub) for the Jacobian's steps."""

    def __init__(self, problem, bounds, workers: int | None = None):
        self.pb = problem
        self.lb, self.ub = (np.asarray(b, float) for b in bounds)
        self.workers = max(1, int(workers or os.cpu_count() or 1))
        self._local = threading.local()
        self._last: tuple[bytes, np.ndarray] | None = None
        self.n_runs_simulated = 0

    def _sim(self) -> RunSimulator:
        s = getattr(self._local, "sim", None)
        if s is None:
            pb = self.pb
            s = self._local.sim = RunSimulator(pb.module)
            # the problem's correction (a residual model), if any: same arrays, own buffer
            s.W, s.feat_lo, s.feat_scale, s.corr_idx = pb.sim.W, pb.sim.feat_lo, pb.sim.feat_scale, pb.sim.corr_idx
            s.corr_incr, s.extra_columns = np.zeros_like(pb.sim.corr_incr), list(pb.sim.extra_columns)
        return s

    def _one(self, theta: np.ndarray, r: int) -> np.ndarray:
        pb = self.pb
        Ysim = self._sim().run(pb.run_at(theta, r), pb.p_of(theta), pb.x0_of(theta, r))[0]
        return pb._run_residuals(r, Ysim, pb.offset_of(theta, pb.runs[r]))

    def many(self, thetas: list[np.ndarray]) -> list[np.ndarray]:
        """Residual vectors at each theta (every (theta, run) pair one task)."""
        nr = len(self.pb.runs)
        tasks = [(th, r) for th in thetas for r in range(nr)]
        self.n_runs_simulated += len(tasks)
        if self.workers == 1 or len(tasks) == 1:
            parts = [self._one(th, r) for th, r in tasks]
        else:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(tasks))) as ex:
                parts = list(ex.map(lambda t: self._one(*t), tasks))
        return [np.concatenate(parts[i * nr:(i + 1) * nr]) for i in range(len(thetas))]

    def fun(self, theta) -> np.ndarray:
        theta = np.asarray(theta, float)
        f = self.many([theta])[0]
        self._last = (theta.tobytes(), f)
        return f

    def jac(self, theta) -> np.ndarray:
        theta = np.asarray(theta, float)
        h = fd_steps(theta, self.lb, self.ub)
        points = [theta + h_e for h_e in np.diag(h)]
        if self._last is not None and self._last[0] == theta.tobytes():
            f0, cols = self._last[1], self.many(points)
        else:  # not the point least_squares evaluated last: f(theta) with the columns
            f0, *cols = self.many([theta] + points)
        Jt = np.empty((theta.size, f0.size))  # column-major, as scipy builds it (LAPACK sees the same layout)
        for i, (x, fi) in enumerate(zip(points, cols)):
            Jt[i] = (fi - f0) / (x[i] - theta[i])
        return Jt.T
