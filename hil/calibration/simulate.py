"""Simulate any plant over a logged run: the loop's plant stages (hil/loop/step.py: the
plant's own kernels through `advance_ode` and `outputs_ode`, then `correct_stage`, the
residual correction (hil/calibration/residual.py) and the finite-state check, exactly as
every loop step runs them), zero-order hold on the logged inputs, sub-steps derived from
the plant's MAX_SUBSTEP for every (irregular) sample interval, prescribed states overwritten
before each step. What the loop step adds around these stages (the clip, the gaps, the
recording row) is not part of a log replay: the logged inputs are the applied ones and the
logged outputs are compared with the true ones.

`simulator_for(module)` compiles one simulation kernel per plant module (closing over its
`step` and `outputs`); compiled once per process (a few seconds), then each call runs at the
speed of the plant kernel. The per-sample path allocates nothing.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import njit

from hil.loop.step import advance_ode, correct_stage, outputs_ode

BAD_RESIDUAL = 1e3  # the residual (in sigmas) of a sample the simulation could not compute (non-finite)


@lru_cache(maxsize=None)
def simulator_for(module):
    """A compiled `sim(x0, k0, k1, t_s, U, Uc, X_presc, p, Ysim, Xsim, time_unit_s, max_sub,
    min_sub, W, feat_lo, feat_scale, corr_idx, corr_incr, work, y, x_lo, x_hi, x_tol, x_out, z, d)
    -> bool` for this plant module ("ode" form).

    Uc: the rows the residual correction reads as its inputs (U itself, or U with the logged
    extra columns a diagnosis-only model reads appended; hil/calibration/residual.py).

    Integrates from sample k0 (state x0, modified in place) to sample k1; writes the outputs
    at samples k0..k1-1 into Ysim rows (and k1 too when k1 is the last sample) and the state
    at each sample into Xsim rows; on return x0 holds the state at sample k1. False when the
    state became non-finite (the remaining rows are NaN).
    """
    step = module.step
    outputs = module.outputs

    @njit(nogil=True)
    def sim(x, k0, k1, t_s, U, Uc, X_presc, p, Ysim, Xsim, time_unit_s, max_sub, min_sub,
            W, feat_lo, feat_scale, corr_idx, corr_incr, work, y, x_lo, x_hi, x_tol, x_out, z, d):
        nx = x.size
        n = t_s.size
        last = k1 == n - 1
        for k in range(k0, k1 + 1):
            for i in range(nx):
                v = X_presc[k, i]
                if v == v:  # not NaN
                    x[i] = v
            if k < k1 or last:
                outputs_ode(outputs, x, z, d, U[k], p, y, ())
                for j in range(y.size):
                    Ysim[k, j] = y[j]
                for i in range(nx):
                    Xsim[k, i] = x[i]
            if k == k1:
                break
            dt = (t_s[k + 1] - t_s[k]) / time_unit_s
            nsub = int(math.ceil(dt / max_sub * (1.0 - 1e-12)))
            if nsub < min_sub:
                nsub = min_sub
            advance_ode(step, t_s[k] / time_unit_s, x, z, d, U[k], p, dt, nsub, work, ())
            if correct_stage(x, Uc[k], dt, W, feat_lo, feat_scale, corr_idx, corr_incr, x_lo, x_hi, x_tol,
                             x_out) < 0:  # a state not finite
                for kk in range(k + 1, k1 + 1):
                    if kk < k1 or last:
                        for j in range(y.size):
                            Ysim[kk, j] = math.nan
                        for i in range(nx):
                            Xsim[kk, i] = math.nan
                return False
        return True

    return sim


class RunSimulator:
    """Simulation of one plant over RunLogs, with preallocated buffers per run."""

    def __init__(self, module, correction=None):
        self.module = module
        self.spec = module.SPEC
        self.sim = simulator_for(module)
        self.time_unit_s = float(getattr(module, "TIME_UNIT_S", 1.0))
        self.max_sub = float(module.MAX_SUBSTEP)
        self.min_sub = 1
        self.work = np.zeros((5, self.spec.n_states))
        self.y = np.zeros(self.spec.n_outputs)
        # the state check of correct_stage: only its non-finite test matters here (bounds open)
        nx = self.spec.n_states
        self.x_lo, self.x_hi = np.full(nx, -np.inf), np.full(nx, np.inf)
        self.x_tol, self.x_out = np.zeros(nx), np.zeros(nx, dtype=np.int64)
        self.z, self.d = np.zeros(0), np.zeros(0, dtype=np.int64)
        self.extra_columns: list[str] = []
        self.set_correction(correction)

    def set_correction(self, correction) -> None:
        """correction: a residual.ResidualModel or None (no correction)."""
        if correction is None:
            nx, nu = self.spec.n_states, self.spec.n_inputs
            self.W = np.zeros((0, 1 + nx + nu))
            self.feat_lo = np.zeros(nx + nu)
            self.feat_scale = np.ones(nx + nu)
            self.corr_idx = np.zeros(0, dtype=np.int64)
            self.corr_incr = np.zeros(0)
            self.extra_columns = []
        else:
            self.W, self.feat_lo, self.feat_scale, self.corr_idx, self.corr_incr = correction.arrays()
            self.extra_columns = list(correction.extra_columns)

    def correction_inputs(self, run) -> np.ndarray:
        """The rows the correction reads: run.U, with the model's logged extra columns appended
        (NaN -> 0: no event); ValueError naming the run and the column if one is missing."""
        if not self.extra_columns:
            return run.U
        cols = []
        for c in self.extra_columns:
            v = run.extras.get(c)
            if v is None:
                raise ValueError(f"run {run.name!r}: the residual model reads the extra column {c!r}, "
                                 f"which this log lacks (extras: {', '.join(sorted(run.extras)) or 'none'})")
            cols.append(np.nan_to_num(v, nan=0.0))
        return np.ascontiguousarray(np.column_stack([run.U] + cols))

    def _event_state_at(self, t_s, Uc, k0: int) -> None:
        """The correction's event state on entry to step k0: zeros at a run's start, else
        what steps 0..k0-1 left (time since each source's last rising edge, its last value)."""
        self.corr_incr[:] = 0.0
        nr = self.W.shape[0]
        ne = (self.corr_idx.size - nr) // 2
        if k0 == 0 or ne == 0:
            return
        from hil.calibration.residual import SINCE, event_series

        for e in range(ne):
            if self.corr_idx[nr + ne + e] == 0:
                continue
            s = Uc[:k0, self.corr_idx[nr + e]]
            since = event_series(s, t_s[:k0], SINCE)
            self.corr_incr[nr + 2 * e] = (since[-1] + t_s[k0] - t_s[k0 - 1]) / self.time_unit_s
            self.corr_incr[nr + 2 * e + 1] = s[-1]

    def run(self, run, p, x0, k0: int = 0, k1: int | None = None, Ysim=None, Xsim=None):
        """Simulate `run` from sample k0 (state x0, copied) to k1 (default: the end).
        Returns (Ysim, Xsim, x_end, ok)."""
        n = run.t_s.size
        k1 = n - 1 if k1 is None else k1
        if Ysim is None:
            Ysim = np.full((n, self.spec.n_outputs), np.nan)
        if Xsim is None:
            Xsim = np.full((n, self.spec.n_states), np.nan)
        x = np.array(x0, dtype=np.float64)
        Uc = self.correction_inputs(run)
        self._event_state_at(run.t_s, Uc, k0)
        ok = self.sim(x, k0, k1, run.t_s, run.U, Uc, run.X_presc, p, Ysim, Xsim, self.time_unit_s,
                      self.max_sub, self.min_sub, self.W, self.feat_lo, self.feat_scale,
                      self.corr_idx, self.corr_incr, self.work, self.y, self.x_lo, self.x_hi, self.x_tol,
                      self.x_out, self.z, self.d)
        return Ysim, Xsim, x, bool(ok)
