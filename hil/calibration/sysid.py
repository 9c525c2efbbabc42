"""System identification: plant parameters (and unknown initial states) fitted to logged
runs by simulating the plant's Numba kernels over the logged inputs (scipy least_squares).

Residuals: (y_sim - y_meas) / sigma_j for every measured sample of every fitted output j;
sigma_j starts from the high-frequency scatter of the measurements (first differences,
robust) and is re-estimated from the fit's own residuals once (so outputs are weighted by
their noise, and the interval scale is the residual scale).

Parameterization: p_i = base_i * (1 + theta_i) (base_i != 0), bounded by the spec's
physical bounds; initial states likewise.

Multiple shooting (`shooting_s`): each run is cut into segments of that length; the state
at every segment start is a free variable and the continuity defects are residuals (weight
`DEFECT_WEIGHT` per state scale), so a wrong early guess cannot make a long run diverge.
Its result seeds a final single-shooting polish, whose Jacobian gives the intervals.

Intervals: sandwich covariance bread * meat * bread with bread = (J'J)^-1 and a meat that
inflates each output's block by its residuals' long-run variance factor (Bartlett window;
correlated residuals carry less information than white ones). 95 %
intervals are +/- 1.96 std. `profile_interval` checks one parameter by profile likelihood.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from hil.calibration.shooting import DEFECT_WEIGHT, multiple_shooting  # noqa: F401  (DEFECT_WEIGHT re-exported)
from hil.calibration.simulate import BAD_RESIDUAL, RunSimulator

Z95 = 1.959963984540054


def _robust_sigma_from_diffs(y: np.ndarray) -> float:
    d = np.diff(y[np.isfinite(y)])
    if d.size < 3:
        return math.nan
    mad = np.median(np.abs(d - np.median(d)))
    return float(1.4826 * mad / math.sqrt(2.0))


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

    def as_dict(self) -> dict:
        return {n: {"value": float(v), "std": float(s), "ci95": [float(a), float(b)]}
                for n, v, s, (a, b) in zip(self.params, self.values, self.std, self.ci95)}


class SysIdProblem:
    """Everything a fit needs: plant module, runs, which parameters and states are free."""

    def __init__(self, module, runs, params, *, base_params=None, x0=None, init_states=(),
                 outputs=None, sigma=None, correction=None, bias_outputs=()):
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
        # sensor biases fitted with the parameters (shared by all runs): y_meas = y_model + b_j
        self.bias_outputs = list(bias_outputs)
        for n in self.bias_outputs:
            if n not in self.outputs:
                raise ValueError(f"bias output {n!r} is not a fitted output")
        self.b_pos = np.array([self.outputs.index(n) for n in self.bias_outputs], dtype=np.int64)
        # measured sample masks per run
        self.masks = [np.isfinite(r.Y[:, self.o_idx]) for r in self.runs]
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
    def n_theta(self) -> int:
        return len(self.params) + len(self.init_states) * len(self.runs) + len(self.bias_outputs)

    def bias_of(self, theta) -> np.ndarray:
        """Per fitted output (self.outputs order) sensor bias, plant units."""
        b = np.zeros(len(self.outputs))
        nb = len(self.bias_outputs)
        if nb:
            b[self.b_pos] = theta[-nb:] * self.sigma[self.o_idx][self.b_pos]
        return b

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
        lo += [-np.inf] * len(self.bias_outputs)
        hi += [np.inf] * len(self.bias_outputs)
        return np.array(lo), np.array(hi)

    def theta_of(self, values=None) -> np.ndarray:
        th = np.zeros(self.n_theta)
        if values is not None:
            th[:len(self.params)] = (np.asarray(values, float) - self.base_p[self.p_idx]) / self.p_scale
        return th

    # ---- residuals ----
    def _run_residuals(self, r: int, Ysim: np.ndarray, bias=None) -> np.ndarray:
        run = self.runs[r]
        m = self.masks[r]
        b = 0.0 if bias is None else bias
        diff = (Ysim[:, self.o_idx] + b - run.Y[:, self.o_idx]) / self.sigma[self.o_idx]
        out = diff[m]
        bad = ~np.isfinite(out)
        if bad.any():
            out[bad] = BAD_RESIDUAL
        return out

    def residuals(self, theta) -> np.ndarray:
        p = self.p_of(theta)
        parts = []
        for r, run in enumerate(self.runs):
            Ysim, _, _, _ = self.sim.run(run, p, self.x0_of(theta, r))
            parts.append(self._run_residuals(r, Ysim, self.bias_of(theta)))
        return np.concatenate(parts)

    def simulate(self, theta):
        """Per run (Ysim, Xsim) at theta."""
        p = self.p_of(theta)
        return [self.sim.run(run, p, self.x0_of(theta, r))[:2] for r, run in enumerate(self.runs)]

    def output_blocks(self) -> np.ndarray:
        """Output index (position in self.outputs) of every residual, in residual order."""
        parts = []
        for m in self.masks:
            cols = np.broadcast_to(np.arange(len(self.outputs)), m.shape)
            parts.append(cols[m])
        return np.concatenate(parts)

    # ---- multiple shooting (hil/calibration/shooting.py) ----
    def multiple_shooting(self, theta0, shooting_s: float, max_nfev: int = 15, verbose: int = 0):
        return multiple_shooting(self, theta0, shooting_s, max_nfev, verbose)

    # ---- the fit ----
    def fit(self, theta0=None, *, shooting_s: float | None = None, reweight: bool = True,
            max_nfev: int = 100, shooting_max_nfev: int = 15, verbose: int = 0) -> FitResult:
        theta = self.theta_of() if theta0 is None else np.array(theta0, float)
        lo, hi = self.bounds()
        theta = np.clip(theta, lo, hi)
        nfev = 0
        if shooting_s is not None and any(r.duration_s > shooting_s for r in self.runs):
            theta, sol = self.multiple_shooting(theta, shooting_s, shooting_max_nfev, verbose=verbose)
            nfev += sol.nfev
        sol = least_squares(self.residuals, theta, bounds=(lo, hi), method="trf", x_scale="jac",
                            max_nfev=max_nfev, verbose=verbose)
        nfev += sol.nfev
        if reweight:
            r = sol.fun
            x = sol.x.copy()
            blocks = self.output_blocks()
            for pos, j in enumerate(self.o_idx):
                rr = r[blocks == pos]
                rms = float(np.sqrt(np.mean(rr ** 2))) if rr.size else 1.0
                if math.isfinite(rms) and rms > 0:
                    self.sigma[j] *= rms
                    if self.outputs[pos] in self.bias_outputs:  # keep the bias in plant units
                        x[self.n_theta - len(self.bias_outputs) + self.bias_outputs.index(self.outputs[pos])] /= rms
            sol = least_squares(self.residuals, x, bounds=(lo, hi), method="trf", x_scale="jac",
                                max_nfev=max_nfev, verbose=verbose)
            nfev += sol.nfev
        return self._result(sol, nfev)

    def _result(self, sol, nfev: int) -> FitResult:
        theta = sol.x
        J = np.asarray(sol.jac)
        r = sol.fun
        blocks = self.output_blocks()
        n, k = J.shape
        rho = np.full(self.spec.n_outputs, np.nan)
        meat = np.zeros((k, k))
        for pos, j in enumerate(self.o_idx):
            sel = blocks == pos
            rr = r[sel]
            # lag-1 autocorrelation within runs (adjacent residual pairs of one output)
            rho[j] = _lag1(rr)
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
        )

    def profile_interval(self, result: FitResult, name: str, n_points: int = 7, width: float = 3.0,
                         max_nfev: int = 30):
        """Profile-likelihood 95 % interval of one parameter: fix it on a grid of +/- width std,
        refit the others, find where the (inflation-corrected) chi-square rises by 3.84.
        Returns dict(grid, delta_chi2, ci95) in plant units."""
        i = self.params.index(name)
        theta_hat = self.theta_of(result.values)
        for pos, n in enumerate(self.bias_outputs):
            theta_hat[self.n_theta - len(self.bias_outputs) + pos] = (
                result.biases[n] / self.sigma[self.spec.index("outputs", n)])
        if self.init_states:
            for r in range(len(self.runs)):
                off = len(self.params) + r * len(self.init_states)  # noqa: E501
                theta_hat[off:off + len(self.init_states)] = (
                    (result.init_values[r] - self.x0[r][self.s_idx]) / self.s_scale)
        lo, hi = self.bounds()
        free = np.array([j for j in range(theta_hat.size) if j != i])
        blocks = self.output_blocks()
        r_hat = self.residuals(theta_hat)
        infl = np.array([long_run_factor(r_hat[blocks == pos]) for pos in range(len(self.o_idx))])

        def chi2(th):
            rr = self.residuals(th)
            return float(sum(np.sum(rr[blocks == pos] ** 2) / infl[pos] for pos in range(len(self.o_idx))))

        c0 = chi2(theta_hat)
        grid = result.values[i] + np.linspace(-width, width, n_points) * result.std[i]
        out = []
        for v in grid:
            th = theta_hat.copy()
            th[i] = (v - self.base_p[self.p_idx[i]]) / self.p_scale[i]
            if not lo[i] <= th[i] <= hi[i]:
                out.append(math.nan)
                continue
            if free.size:
                sol = least_squares(lambda z: self.residuals(np.insert(z, i, th[i])), th[free],
                                    bounds=(lo[free], hi[free]), method="trf", x_scale="jac",
                                    max_nfev=max_nfev)
                th[free] = sol.x
            out.append(chi2(th) - c0)
        d = np.array(out)
        ci = [_crossing(grid[:n_points // 2 + 1][::-1], d[:n_points // 2 + 1][::-1]),
              _crossing(grid[n_points // 2:], d[n_points // 2:])]
        return {"parameter": name, "grid": grid.tolist(), "delta_chi2": d.tolist(), "ci95": ci}


def _crossing(x, d, level=3.841458820694124):
    """First x where d crosses `level` going outward (linear interpolation); NaN if never."""
    for a in range(len(x) - 1):
        if math.isfinite(d[a]) and math.isfinite(d[a + 1]) and d[a] < level <= d[a + 1]:
            f = (level - d[a]) / (d[a + 1] - d[a])
            return float(x[a] + f * (x[a + 1] - x[a]))
    return math.nan


def long_run_factor(r: np.ndarray) -> float:
    """Long-run variance / variance of a residual series (Bartlett window, bandwidth
    2 sqrt(n)): how much less information correlated residuals carry than white ones, >= 1."""
    n = r.size
    if n < 8:
        return 1.0
    a = r - r.mean()
    g0 = float(a @ a)
    if g0 <= 0:
        return 1.0
    L = min(int(2 * math.sqrt(n)), n // 4)
    f = 1.0
    for lag in range(1, L + 1):
        f += 2.0 * (1.0 - lag / (L + 1)) * float(a[:-lag] @ a[lag:]) / g0
    return max(f, 1.0)


def _lag1(r: np.ndarray) -> float:
    if r.size < 4:
        return 0.0
    a = r - r.mean()
    den = float(a @ a)
    return float(np.clip((a[:-1] @ a[1:]) / den, -0.99, 0.99)) if den > 0 else 0.0


def identifiability(result: FitResult, corr_limit: float = 0.95, rel_limit: float = 0.5) -> list[dict]:
    """Findings: which parameters the data cannot pin down, and why."""
    out = []
    n = len(result.params)
    for a in range(n):
        for b in range(a + 1, n):
            c = result.corr[a, b]
            if math.isfinite(c) and abs(c) >= corr_limit:
                out.append({"kind": "correlated", "params": [result.params[a], result.params[b]],
                            "corr": float(c),
                            "why": f"corr({result.params[a]}, {result.params[b]}) = {c:+.3f}: the data pin "
                                   "down a combination of the two, not each (excite the plant so their "
                                   "effects differ, or fix one)"})
    for i, name in enumerate(result.params):
        v, s = result.values[i], result.std[i]
        rel = s / abs(v) if v else math.inf
        if not math.isfinite(rel) or rel > rel_limit:
            out.append({"kind": "weak", "params": [name], "rel_std": float(rel),
                        "why": f"{name}: std/value = {rel:.0%}: the fitted outputs are barely sensitive to it "
                               "on these runs (log an output it drives, or runs that excite it)"})
        if name in result.at_bound:
            out.append({"kind": "at_bound", "params": [name],
                        "why": f"{name} stopped at its physical bound: the model needs it beyond; "
                               "suspect an unmodelled effect or a unit mismatch"})
    sv = result.jac_singular_values
    if sv is not None and sv.size and sv[0] > 0 and sv[-1] / sv[0] < 1e-4:
        out.append({"kind": "ill_conditioned", "params": list(result.params),
                    "why": f"column-normalized Jacobian condition {sv[0] / sv[-1]:.2e}: near-collinear "
                           "sensitivities"})
    return out


def per_run_fits(problem: SysIdProblem, pooled: FitResult, **kw) -> list[FitResult]:
    """Each run fitted alone, starting from the pooled estimate (same parameters)."""
    out = []
    for r, run in enumerate(problem.runs):
        sub = SysIdProblem(problem.module, [run], problem.params, base_params=problem.base_p,
                           x0=[problem.x0[r]], init_states=problem.init_states, outputs=problem.outputs,
                           sigma={n: problem.sigma[problem.spec.index("outputs", n)] for n in problem.outputs},
                           correction=None, bias_outputs=problem.bias_outputs)
        sub.sim = problem.sim
        th = sub.theta_of(pooled.values)
        for pos, n in enumerate(problem.bias_outputs):
            th[sub.n_theta - len(problem.bias_outputs) + pos] = pooled.biases[n] / sub.sigma[sub.spec.index("outputs", n)]
        if problem.init_states:
            ns = len(problem.init_states)
            th[len(problem.params):len(problem.params) + ns] = (
                (pooled.init_values[r] - problem.x0[r][problem.s_idx]) / problem.s_scale)
        out.append(sub.fit(th, reweight=False, **kw))
    return out


def spread_ranges(problem: SysIdProblem, pooled: FitResult, per_run: list[FitResult]) -> dict:
    """[gaps.randomize.plant.<param>] tables from the run-to-run spread of the estimates:
    uniform over [min, max] of the per-run estimates widened by each run's 95 % half-width
    (with a single run: the pooled 95 % interval), clipped to the physical bounds."""
    spec = problem.spec
    out = {}
    for i, name in enumerate(pooled.params):
        q = spec.quantity("params", name)
        if len(per_run) >= 2:
            lo = min(f.values[i] - Z95 * f.std[i] for f in per_run)
            hi = max(f.values[i] + Z95 * f.std[i] for f in per_run)
        else:
            lo, hi = pooled.ci95[i]
        lo, hi = max(lo, q.low), min(hi, q.high)
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            lo, hi = q.low, q.high
        out[name] = {"dist": "uniform", "low": float(lo), "high": float(hi)}
    return out
