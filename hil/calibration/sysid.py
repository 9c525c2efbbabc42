"""System identification: plant parameters (and unknown initial states) fitted to logged
runs by simulating the plant's Numba kernels over the logged inputs (scipy least_squares).

Residuals: (y_sim + offset_j(t) - y_meas) / sigma_j for every measured sample of every
fitted output j; sigma_j starts from the high-frequency scatter of the measurements (first
differences, robust) and is re-estimated from the fit's own residuals once (so outputs are
weighted by their noise, and the interval scale is the residual scale). The sensor offset
is bias_j + drift_j * t (t since the run's start) for the outputs named in `bias_outputs` /
`drift_outputs` (shared by all runs), else 0.

References: an output with an independent reference in the logs (a column with role =
"reference", e.g. lab assays) gets a second residual group (y_sim - y_ref) / (cv_j * level)
at the reference samples, level = max(|y_ref|, a tenth of the median reference): assays
have a relative error; cv_j starts at 5 % and is re-estimated with the sigmas. The
reference sees the model output without the sensor offset, so it anchors the level a
drifting online probe cannot (bias and drift of the probe are then identifiable).

Parameterization: p_i = base_i * (1 + theta_i) (base_i != 0), bounded by the spec's
physical bounds; initial states likewise.

Actuator lags (`lag_inputs`): the logged command of each named input passes through a
first-order lag whose time constant lag_s = LAG_SCALE_S * theta (0 .. a quarter of the
shortest run, shared by all runs) is fitted with the parameters, with its interval
(hil/calibration/logs.py lag_filter, the same ZOH filter a known `lag_s` uses).

Multiple shooting (`shooting_s`): each run is cut into segments of that length; the state
at every segment start is a free variable and the continuity defects are residuals (weight
`DEFECT_WEIGHT` per state scale), so a wrong early guess cannot make a long run diverge.
Its result seeds a final single-shooting polish, whose Jacobian gives the intervals.

Intervals: sandwich covariance bread * meat * bread with bread = (J'J)^-1 and a meat that
inflates each output's block by its residuals' long-run variance factor (Bartlett window;
correlated residuals carry less information than white ones), per residual group. 95 %
intervals are +/- 1.96 std. `profile_interval` checks one parameter by profile likelihood.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
from scipy.optimize import least_squares

from hil.calibration.shooting import DEFECT_WEIGHT, multiple_shooting  # noqa: F401  (DEFECT_WEIGHT re-exported)
from hil.calibration.checks import identifiability, per_run_fits, spread_ranges  # noqa: F401  (re-exported)
from hil.calibration.parallel import ParallelResiduals
from hil.calibration.simulate import BAD_RESIDUAL, RunSimulator
from hil.calibration.stats import Z95, _lag1, _robust_sigma_from_diffs, long_run_factor  # noqa: F401

REF_CV0 = 0.05  # initial relative error of reference assays, re-estimated by the fit
LAG_SCALE_S = 600.0  # theta scale of a fitted actuator lag, s


@dataclass
class FitResult:
    """A fit's estimates in plant units, with the evidence behind them."""

    params: list[str]
    values: np.ndarray
    std: np.ndarray
    ci95: np.ndarray              # (n, 2)
    cov: np.ndarray
    corr: np.ndarray
    p_full: np.ndarray            # the whole parameter vector used
    x0: list[np.ndarray]          # per-run initial state used
    sigma: np.ndarray             # per output weight (plant units), NaN if not fitted
    rho: np.ndarray               # per output lag-1 residual autocorrelation
    cost: float
    n_residuals: int
    nfev: int
    runs: list[str]
    outputs: list[str]
    at_bound: list[str] = field(default_factory=list)
    init_states: list[str] = field(default_factory=list)
    init_values: list[np.ndarray] = field(default_factory=list)
    jac_singular_values: np.ndarray | None = None
    biases: dict = field(default_factory=dict)   # output -> fitted sensor bias, plant units
    drifts: dict = field(default_factory=dict)   # output -> fitted sensor drift, plant units per hour
    sensor_ci95: dict = field(default_factory=dict)  # "bias.<out>" / "drift.<out>" -> [lo, hi]
    ref_cv: dict = field(default_factory=dict)   # output -> relative error of its reference assays
    lags: dict = field(default_factory=dict)     # input -> fitted actuator lag time constant, s
    lag_ci95: dict = field(default_factory=dict)  # input -> [lo, hi], s

    def as_dict(self) -> dict:
        return {n: {"value": float(v), "std": float(s), "ci95": [float(a), float(b)]}
                for n, v, s, (a, b) in zip(self.params, self.values, self.std, self.ci95)}


class SysIdProblem:
    """Everything a fit needs: plant module, runs, which parameters and states are free."""

    def __init__(self, module, runs, params, *, base_params=None, x0=None, init_states=(),
                 outputs=None, sigma=None, correction=None, bias_outputs=(), drift_outputs=(), ref_cv=None,
                 lag_inputs=()):
        self.module = module
        self.spec = spec = module.SPEC
        self.runs = list(runs)
        self.params = list(params)
        self.p_idx = np.array([spec.index("params", n) for n in self.params], dtype=np.int64)
        self.base_p = np.array(spec.nominal("params") if base_params is None else base_params, float)
        x0 = spec.nominal("states") if x0 is None else np.asarray(x0, float)
        self.x0 = [np.array(x0, float) for _ in self.runs] if np.ndim(x0) == 1 else [np.array(a, float) for a in x0]
        self.init_states = list(init_states)
        self.s_idx = np.array([spec.index("states", n) for n in self.init_states], dtype=np.int64)
        self.lag_inputs = list(lag_inputs)
        self.l_idx = np.array([spec.index("inputs", n) for n in self.lag_inputs], dtype=np.int64)
        self.lag_hi = 0.25 * min(r.duration_s for r in self.runs) / LAG_SCALE_S if self.runs else 1.0
        self._lag_cache = {}
        self.sim = RunSimulator(module, correction)
        measured = set()
        for r in self.runs:
            measured |= set(r.measured_outputs(spec))
        names = spec.names("outputs")
        self.outputs = [n for n in names if n in measured] if outputs is None else list(outputs)
        for n in self.outputs:
            if n not in measured:
                raise ValueError(f"output {n!r} is not measured in any run")
        self.o_idx = np.array([spec.index("outputs", n) for n in self.outputs], dtype=np.int64)
        self.sigma = np.full(spec.n_outputs, np.nan)
        for j in self.o_idx:
            est = [_robust_sigma_from_diffs(r.Y[:, j]) for r in self.runs]
            est = [e for e in est if math.isfinite(e) and e > 0]
            q = spec.outputs[j]
            floor = 1e-6 * max(q.high - q.low, abs(q.nominal), 1e-12)
            self.sigma[j] = max(float(np.median(est)) if est else floor, floor)
        if sigma:
            for n, s in sigma.items():
                self.sigma[spec.index("outputs", n)] = float(s)
        # sensor offsets fitted with the parameters (shared by all runs): y_meas = y_model + b_j + d_j t
        self.bias_outputs = list(bias_outputs)
        self.drift_outputs = list(drift_outputs)
        for key, names_ in (("bias", self.bias_outputs), ("drift", self.drift_outputs)):
            for n in names_:
                if n not in self.outputs:
                    raise ValueError(f"{key} output {n!r} is not a fitted output (fitted: {', '.join(self.outputs)})")
        self.b_pos = np.array([self.outputs.index(n) for n in self.bias_outputs], dtype=np.int64)
        self.d_pos = np.array([self.outputs.index(n) for n in self.drift_outputs], dtype=np.int64)
        # measured sample masks per run
        self.masks = [np.isfinite(r.Y[:, self.o_idx]) for r in self.runs]
        # independent references of fitted outputs: a residual group each (module docstring)
        self.ref_outputs = [n for n in self.outputs
                            if any(np.isfinite(r.refs.get(n, np.zeros(0))).sum() for r in self.runs)]
        self.ref_masks, self.ref_level = [], []
        for r in self.runs:
            ms, ls = [], []
            for n in self.ref_outputs:
                v = r.refs.get(n)
                v = np.full(r.t_s.size, np.nan) if v is None else v
                ms.append(np.isfinite(v))
                ls.append(v)
            self.ref_masks.append(ms)
            self.ref_level.append(ls)
        for q, n in enumerate(self.ref_outputs):
            allv = np.concatenate([np.abs(ls[q][ms[q]]) for ls, ms in zip(self.ref_level, self.ref_masks)])
            floor = 0.1 * max(float(np.median(allv)), 1e-12)
            for ls, ms in zip(self.ref_level, self.ref_masks):
                ls[q] = np.where(ms[q], np.maximum(np.abs(np.nan_to_num(ls[q])), floor), 1.0)
        self.ref_cv = np.array([float((ref_cv or {}).get(n, REF_CV0)) for n in self.ref_outputs])
        lo, hi = spec.lows("params")[self.p_idx], spec.highs("params")[self.p_idx]
        self.p_scale = np.where(self.base_p[self.p_idx] != 0, np.abs(self.base_p[self.p_idx]), hi - lo)
        self.p_lo = (lo - self.base_p[self.p_idx]) / self.p_scale
        self.p_hi = (hi - self.base_p[self.p_idx]) / self.p_scale
        slo, shi = spec.lows("states")[self.s_idx], spec.highs("states")[self.s_idx]
        self.s_scale = np.array([max(abs(spec.states[i].nominal), 1e-3 * (spec.states[i].high - spec.states[i].low))
                                 for i in self.s_idx])
        self.s_lo, self.s_hi = slo, shi

    # ---- parameter vector <-> plant arrays ----
    @property
    def n_sensor(self) -> int:
        return len(self.bias_outputs) + len(self.drift_outputs)

    @property
    def n_theta(self) -> int:
        """[parameters | initial states per run | actuator lags | sensor biases | sensor drifts]"""
        return len(self.params) + len(self.init_states) * len(self.runs) + len(self.lag_inputs) + self.n_sensor

    def lags_of(self, theta) -> np.ndarray:
        """Fitted actuator lag time constants (self.lag_inputs order), s."""
        nl = len(self.lag_inputs)
        if not nl:
            return np.zeros(0)
        off = self.n_theta - self.n_sensor - nl
        return np.asarray(theta[off:off + nl], float) * LAG_SCALE_S

    def run_at(self, theta, r: int):
        """Run r as the plant sees it at theta: the lagged inputs filtered (cached per lag)."""
        run = self.runs[r]
        if not self.lag_inputs:
            return run
        import dataclasses

        from hil.calibration.logs import lag_filter

        lags = self.lags_of(theta)
        key = (r, tuple(lags))
        hit = self._lag_cache.get(key)
        if hit is None:
            U = run.U.copy()
            for j, tau in zip(self.l_idx, lags):
                if tau > 0:
                    U[:, j] = lag_filter(run.t_s, run.U[:, j], float(tau))
            hit = dataclasses.replace(run, U=U)
            if len(self._lag_cache) > 64:
                self._lag_cache.clear()
            self._lag_cache[key] = hit
        return hit

    @property
    def n_groups(self) -> int:
        """Residual groups: one per fitted output, then one per output with references."""
        return len(self.outputs) + len(self.ref_outputs)

    def _sensor_theta(self, theta):
        nb, nd = len(self.bias_outputs), len(self.drift_outputs)
        tail = theta[self.n_theta - self.n_sensor:] if self.n_sensor else theta[:0]
        return tail[:nb], tail[nb:nb + nd]

    def bias_of(self, theta) -> np.ndarray:
        """Per fitted output (self.outputs order) sensor bias, plant units."""
        b = np.zeros(len(self.outputs))
        if len(self.bias_outputs):
            b[self.b_pos] = self._sensor_theta(theta)[0] * self.sigma[self.o_idx][self.b_pos]
        return b

    def drift_of(self, theta) -> np.ndarray:
        """Per fitted output sensor drift, plant units per hour (theta in sigma per hour)."""
        d = np.zeros(len(self.outputs))
        if len(self.drift_outputs):
            d[self.d_pos] = self._sensor_theta(theta)[1] * self.sigma[self.o_idx][self.d_pos]
        return d

    def offset_of(self, theta, run, kk=slice(None)) -> np.ndarray:
        """Sensor offsets (samples kk of `run`, fitted outputs): bias + drift * hours since the
        run's start (a sliced run keeps its origin)."""
        b = self.bias_of(theta)
        if not len(self.drift_outputs):
            return b
        t_h = (run.t_s[kk] + getattr(run, "t_origin_s", 0.0)) / 3600.0
        return b + t_h[:, None] * self.drift_of(theta)

    def p_of(self, theta) -> np.ndarray:
        p = self.base_p.copy()
        p[self.p_idx] = self.base_p[self.p_idx] + theta[:len(self.params)] * self.p_scale
        return p

    def x0_of(self, theta, r: int) -> np.ndarray:
        x0 = self.x0[r].copy()
        ns = len(self.init_states)
        if ns:
            off = len(self.params) + r * ns
            x0[self.s_idx] = self.x0[r][self.s_idx] + theta[off:off + ns] * self.s_scale
        return x0

    def bounds(self):
        lo, hi = list(self.p_lo), list(self.p_hi)
        for r in range(len(self.runs)):
            lo += list((self.s_lo - self.x0[r][self.s_idx]) / self.s_scale)
            hi += list((self.s_hi - self.x0[r][self.s_idx]) / self.s_scale)
        lo += [0.0] * len(self.lag_inputs)
        hi += [self.lag_hi] * len(self.lag_inputs)
        lo += [-np.inf] * self.n_sensor
        hi += [np.inf] * self.n_sensor
        return np.array(lo), np.array(hi)

    def theta_of(self, values=None) -> np.ndarray:
        th = np.zeros(self.n_theta)
        if values is not None:
            th[:len(self.params)] = (np.asarray(values, float) - self.base_p[self.p_idx]) / self.p_scale
        return th

    def theta_from(self, result: FitResult) -> np.ndarray:
        """The theta vector of a fit result (parameters, initial states, sensor offsets), at
        this problem's sigmas."""
        th = self.theta_of(result.values)
        ns = len(self.init_states)
        if ns and result.init_values:
            for r in range(len(self.runs)):
                off = len(self.params) + r * ns
                th[off:off + ns] = (result.init_values[r] - self.x0[r][self.s_idx]) / self.s_scale
        base = self.n_theta - self.n_sensor
        for pos, n in enumerate(self.lag_inputs):
            th[base - len(self.lag_inputs) + pos] = result.lags.get(n, 0.0) / LAG_SCALE_S
        for pos, n in enumerate(self.bias_outputs):
            th[base + pos] = result.biases.get(n, 0.0) / self.sigma[self.spec.index("outputs", n)]
        for pos, n in enumerate(self.drift_outputs):
            th[base + len(self.bias_outputs) + pos] = (result.drifts.get(n, 0.0)
                                                       / self.sigma[self.spec.index("outputs", n)])
        return th

    # ---- residuals ----
    def _run_residuals(self, r: int, Ysim: np.ndarray, offset=None) -> np.ndarray:
        """Output residuals (then reference residuals) of run r; offset: the sensor offsets
        (fitted outputs), a vector or (n, n_outputs), or None."""
        run = self.runs[r]
        m = self.masks[r]
        b = 0.0 if offset is None else offset
        diff = (Ysim[:, self.o_idx] + b - run.Y[:, self.o_idx]) / self.sigma[self.o_idx]
        parts = [diff[m]]
        for q, n in enumerate(self.ref_outputs):
            mq = self.ref_masks[r][q]
            j = self.spec.index("outputs", n)
            parts.append((Ysim[mq, j] - run.refs[n][mq]) / (self.ref_cv[q] * self.ref_level[r][q][mq]))
        out = np.concatenate(parts) if len(parts) > 1 else parts[0]
        bad = ~np.isfinite(out)
        if bad.any():
            out[bad] = BAD_RESIDUAL
        return out

    def residuals(self, theta) -> np.ndarray:
        p = self.p_of(theta)
        parts = []
        for r, run in enumerate(self.runs):
            Ysim, _, _, _ = self.sim.run(self.run_at(theta, r), p, self.x0_of(theta, r))
            parts.append(self._run_residuals(r, Ysim, self.offset_of(theta, run)))
        return np.concatenate(parts)

    def simulate(self, theta):
        """Per run (Ysim, Xsim) at theta."""
        p = self.p_of(theta)
        return [self.sim.run(self.run_at(theta, r), p, self.x0_of(theta, r))[:2] for r in range(len(self.runs))]

    def output_blocks(self) -> np.ndarray:
        """Residual group (an output's position in self.outputs, or len(outputs) + q for the
        q-th reference group) of every residual, in residual order."""
        parts = []
        no = len(self.outputs)
        for r, m in enumerate(self.masks):
            cols = np.broadcast_to(np.arange(no), m.shape)
            parts.append(cols[m])
            for q in range(len(self.ref_outputs)):
                parts.append(np.full(int(self.ref_masks[r][q].sum()), no + q))
        return np.concatenate(parts)

    def corrected_runs(self, theta) -> list:
        """The runs as the plant sees them at theta (fitted lags applied) with the fitted sensor
        offsets removed from the measured outputs (copies)."""
        import dataclasses

        out = []
        for r in range(len(self.runs)):
            run = self.run_at(theta, r)
            Y = run.Y.copy()
            Y[:, self.o_idx] -= self.offset_of(theta, run)
            out.append(dataclasses.replace(run, Y=Y))
        return out

    # ---- multiple shooting (hil/calibration/shooting.py) ----
    def multiple_shooting(self, theta0, shooting_s: float, max_nfev: int = 15, verbose: int = 0):
        return multiple_shooting(self, theta0, shooting_s, max_nfev, verbose)

    # ---- the fit ----
    def fit(self, theta0=None, *, shooting_s: float | None = None, reweight: bool = True,
            max_nfev: int = 100, shooting_max_nfev: int = 15, verbose: int = 0,
            workers: int | None = None, parallel: bool = True) -> FitResult:
        """Single shooting (after multiple shooting when `shooting_s`), then once more after
        re-weighting by each output's residual RMS. The residuals of the runs and the
        Jacobian's finite-difference columns are evaluated on `workers` threads (default: the
        cores; hil/calibration/parallel.py: the same Jacobian as scipy's "2-point");
        parallel=False: scipy's own "2-point" on the calling thread (the reference path)."""
        theta = self.theta_of() if theta0 is None else np.array(theta0, float)
        if theta0 is None and self.lag_inputs:  # start fitted lags at LAG_SCALE_S, not on their bound
            nl = len(self.lag_inputs)
            theta[self.n_theta - self.n_sensor - nl:self.n_theta - self.n_sensor] = 1.0
        lo, hi = self.bounds()
        theta = np.clip(theta, lo, hi)
        nfev = 0
        if shooting_s is not None and any(r.duration_s > shooting_s for r in self.runs):
            theta, sol = self.multiple_shooting(theta, shooting_s, shooting_max_nfev, verbose=verbose)
            nfev += sol.nfev
        par = self._evaluator((lo, hi), workers, parallel)
        sol = least_squares(par.fun, theta, jac=par.jac, bounds=(lo, hi), method="trf", x_scale="jac",
                            max_nfev=max_nfev, verbose=verbose)
        nfev += sol.nfev
        if reweight:
            r = sol.fun
            x = sol.x.copy()
            blocks = self.output_blocks()
            base = self.n_theta - self.n_sensor
            no = len(self.outputs)
            for g in range(self.n_groups):
                rr = r[blocks == g]
                rms = float(np.sqrt(np.mean(rr ** 2))) if rr.size else 1.0
                if not (math.isfinite(rms) and rms > 0):
                    continue
                if g >= no:
                    self.ref_cv[g - no] *= rms
                    continue
                self.sigma[self.o_idx[g]] *= rms
                name = self.outputs[g]  # keep the sensor offsets in plant units
                if name in self.bias_outputs:
                    x[base + self.bias_outputs.index(name)] /= rms
                if name in self.drift_outputs:
                    x[base + len(self.bias_outputs) + self.drift_outputs.index(name)] /= rms
            par = self._evaluator((lo, hi), workers, parallel)  # the new weights: nothing cached
            sol = least_squares(par.fun, x, jac=par.jac, bounds=(lo, hi), method="trf", x_scale="jac",
                                max_nfev=max_nfev, verbose=verbose)
            nfev += sol.nfev
        return self._result(sol, nfev)

    def _evaluator(self, bounds, workers, parallel: bool):
        """fun / jac for least_squares: threaded (ParallelResiduals) or scipy's serial 2-point."""
        if parallel:
            return ParallelResiduals(self, bounds, workers)
        return SimpleNamespace(fun=self.residuals, jac="2-point")

    def _result(self, sol, nfev: int) -> FitResult:
        theta = sol.x
        J = np.asarray(sol.jac)
        r = sol.fun
        blocks = self.output_blocks()
        n, k = J.shape
        rho = np.full(self.spec.n_outputs, np.nan)
        meat = np.zeros((k, k))
        for g in range(self.n_groups):
            sel = blocks == g
            rr = r[sel]
            if g < len(self.outputs):  # lag-1 autocorrelation within runs (adjacent residual pairs)
                rho[self.o_idx[g]] = _lag1(rr)
            f = long_run_factor(rr)
            s2 = float(np.mean(rr ** 2)) if rr.size else 1.0
            Jj = J[sel]
            meat += f * s2 * (Jj.T @ Jj)
        JtJ = J.T @ J
        try:
            bread = np.linalg.pinv(JtJ, rcond=1e-12)
        except np.linalg.LinAlgError:
            bread = np.full((k, k), np.nan)
        cov_t = bread @ meat @ bread
        npar = len(self.params)
        D = np.diag(np.concatenate([self.p_scale, np.ones(k - npar)]))
        cov = D @ cov_t @ D
        cov_p = cov[:npar, :npar]
        std = np.sqrt(np.clip(np.diag(cov_p), 0, None))
        values = self.p_of(theta)[self.p_idx]
        with np.errstate(invalid="ignore", divide="ignore"):
            corr = cov_p / np.outer(std, std)
        lo, hi = self.bounds()
        at_bound = [self.params[i] for i in range(npar)
                    if theta[i] <= lo[i] + 1e-9 or theta[i] >= hi[i] - 1e-9]
        sv = np.linalg.svd(J[:, :npar] / np.maximum(np.linalg.norm(J[:, :npar], axis=0), 1e-300),
                           compute_uv=False) if n else None
        ns = len(self.init_states)
        sensor_ci = {}
        base = self.n_theta - self.n_sensor
        for kind, names_, off, vals in (("bias", self.bias_outputs, 0, self.bias_of(theta)),
                                        ("drift", self.drift_outputs, len(self.bias_outputs), self.drift_of(theta))):
            for pos, name in enumerate(names_):
                c = base + off + pos
                s = self.sigma[self.spec.index("outputs", name)] * math.sqrt(max(cov_t[c, c], 0.0))
                v = vals[self.outputs.index(name)]
                sensor_ci[f"{kind}.{name}"] = [float(v - Z95 * s), float(v + Z95 * s)]
        return FitResult(
            params=self.params, values=values, std=std,
            ci95=np.stack([values - Z95 * std, values + Z95 * std], axis=1),
            cov=cov_p, corr=corr, p_full=self.p_of(theta),
            x0=[self.x0_of(theta, i) for i in range(len(self.runs))],
            sigma=self.sigma.copy(), rho=rho, cost=float(sol.cost), n_residuals=int(n),
            nfev=nfev, runs=[r_.name for r_ in self.runs], outputs=self.outputs, at_bound=at_bound,
            init_states=self.init_states,
            init_values=[self.x0_of(theta, i)[self.s_idx] for i in range(len(self.runs))] if ns else [],
            jac_singular_values=sv,
            biases={n: float(b) for n, b in zip(self.outputs, self.bias_of(theta)) if n in self.bias_outputs},
            drifts={n: float(d) for n, d in zip(self.outputs, self.drift_of(theta)) if n in self.drift_outputs},
            sensor_ci95=sensor_ci,
            lags={n: float(v) for n, v in zip(self.lag_inputs, self.lags_of(theta))},
            lag_ci95={n: [float(v - Z95 * LAG_SCALE_S * math.sqrt(max(cov_t[c, c], 0.0))),
                          float(v + Z95 * LAG_SCALE_S * math.sqrt(max(cov_t[c, c], 0.0)))]
                      for n, v, c in zip(self.lag_inputs, self.lags_of(theta),
                                         range(base - len(self.lag_inputs), base))},
            ref_cv={n: float(c) for n, c in zip(self.ref_outputs, self.ref_cv)},
        )

    def profile_interval(self, result: FitResult, name: str, n_points: int = 7, width: float = 3.0,
                         max_nfev: int = 30):
        """Profile-likelihood 95 % interval of one parameter (hil/calibration/checks.py)."""
        from hil.calibration.checks import profile_interval

        return profile_interval(self, result, name, n_points, width, max_nfev)
