"""Checks on a fit (hil/calibration/sysid.py): the profile-likelihood interval of one
parameter, identifiability findings (correlated, weak, at-bound, ill-conditioned parameters)
and the randomization ranges from the run-to-run spread of the per-run estimates.
Parameter values and intervals are in plant units (the spec's)."""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import least_squares

from hil.calibration.stats import Z95, long_run_factor

CHI2_95_1DOF = 3.841458820694124


def profile_interval(problem, result, name: str, n_points: int = 7, width: float = 3.0, max_nfev: int = 30):
    """Profile-likelihood 95 % interval of one parameter: fix it on a grid of +/- width std,
    refit the others, find where the (inflation-corrected) chi-square rises by 3.84.
    Returns dict(grid, delta_chi2, ci95, why) in plant units; an end is NaN when the
    chi-square does not rise by 3.84 inside the grid (or the grid leaves the bounds), and
    `why` says which."""
    i = problem.params.index(name)
    theta_hat = problem.theta_from(result)
    lo, hi = problem.bounds()
    free = np.array([j for j in range(theta_hat.size) if j != i])
    blocks = problem.output_blocks()
    r_hat = problem.residuals(theta_hat)
    groups = range(problem.n_groups)
    infl = np.array([long_run_factor(r_hat[blocks == g]) for g in groups])

    def chi2(th):
        rr = problem.residuals(th)
        return float(sum(np.sum(rr[blocks == g] ** 2) / infl[g] for g in groups))

    c0 = chi2(theta_hat)
    std = result.std[i]
    if not (math.isfinite(std) and std > 0):
        return {"parameter": name, "grid": [], "delta_chi2": [], "ci95": [math.nan, math.nan],
                "why": f"no finite standard error for {name} (std = {std}): the Jacobian is singular in it"}
    grid = result.values[i] + np.linspace(-width, width, n_points) * std
    out = []
    for v in grid:
        th = theta_hat.copy()
        th[i] = (v - problem.base_p[problem.p_idx[i]]) / problem.p_scale[i]
        if not lo[i] <= th[i] <= hi[i]:
            out.append(math.nan)
            continue
        if free.size:
            sol = least_squares(lambda z: problem.residuals(np.insert(z, i, th[i])),
                                np.clip(th[free], lo[free], hi[free]), bounds=(lo[free], hi[free]),
                                method="trf", x_scale="jac", max_nfev=max_nfev)
            th[free] = sol.x
        out.append(chi2(th) - c0)
    d = np.array(out)
    half = n_points // 2
    ci = [_crossing(grid[:half + 1][::-1], d[:half + 1][::-1]), _crossing(grid[half:], d[half:])]
    why = []
    for end, side, part in ((ci[0], "lower", d[:half]), (ci[1], "upper", d[half + 1:])):
        if math.isnan(end):
            why.append(f"{side} end: " + ("the grid leaves the physical bounds before the chi-square rises by 3.84"
                                          if np.isnan(part).any() else
                                          f"the chi-square rises by less than 3.84 within {width:g} std"))
    return {"parameter": name, "grid": grid.tolist(), "delta_chi2": d.tolist(), "ci95": ci, "why": "; ".join(why)}


def _crossing(x, d, level=CHI2_95_1DOF):
    """First x where d crosses `level` going outward (linear interpolation); NaN if never."""
    for a in range(len(x) - 1):
        if math.isfinite(d[a]) and math.isfinite(d[a + 1]) and d[a] < level <= d[a + 1]:
            f = (level - d[a]) / (d[a + 1] - d[a])
            return float(x[a] + f * (x[a + 1] - x[a]))
    return math.nan


def identifiability(result, corr_limit: float = 0.95, rel_limit: float = 0.5) -> list[dict]:
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


def per_run_fits(problem, pooled, **kw) -> list:
    """Each run fitted alone, starting from the pooled estimate (same parameters, sensor
    offsets, output and reference weights)."""
    out = []
    for r, run in enumerate(problem.runs):
        sub = type(problem)(problem.module, [run], problem.params, base_params=problem.base_p,
                           x0=[problem.x0[r]], init_states=problem.init_states, outputs=problem.outputs,
                           sigma={n: problem.sigma[problem.spec.index("outputs", n)] for n in problem.outputs},
                           correction=None, bias_outputs=problem.bias_outputs, drift_outputs=problem.drift_outputs,
                           ref_cv=pooled.ref_cv, lag_inputs=problem.lag_inputs)
        sub.sim = problem.sim
        th = sub.theta_of(pooled.values)
        full = problem.theta_from(pooled)
        tail = problem.n_sensor + len(problem.lag_inputs)  # lags and sensor offsets, shared by all runs
        th[sub.n_theta - tail:] = full[problem.n_theta - tail:]
        if problem.init_states:
            ns = len(problem.init_states)
            th[len(problem.params):len(problem.params) + ns] = (
                (pooled.init_values[r] - problem.x0[r][problem.s_idx]) / problem.s_scale)
        out.append(sub.fit(th, reweight=False, **kw))
    return out


def spread_ranges(problem, pooled, per_run) -> dict:
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
