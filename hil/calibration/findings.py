"""Finding what the model lacks, from a calibrated fit (hil/calibration/sysid.py):

- `windowed_estimates` / `trend_findings`: chosen parameters re-estimated on consecutive
  windows of each run (the other parameters at the pooled fit, the state at each window
  start from the pooled simulation), with 95 % intervals; a slope of the estimates against
  time more than 3 standard errors from zero, and a change larger than the windows'
  typical 95 % half-width, is a finding ("kla_alpha falls from X to Y over run r").
- `correlation_findings`: the slow part of each fitted output's residual tested for
  correlation with every extra column of the logs (and, for event columns, the time since
  the last event), with the effective sample size of a smooth series; names the column.
- `spread_findings`: per-run estimates that differ by more than their intervals allow
  (chi-square of the per-run values about their weighted mean, 99 %).
- `bound_findings`: a parameter at its physical bound, with the direction the data pull it.
- `unlogged_state_warnings`: a state neither logged, prescribed nor seen through a measured
  output, that the model moves, and whose excursion moves the fitted outputs by more than
  their noise.
Units: time in h in the messages, parameters in plant units.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from hil.calibration.noise import _smooth


def windowed_estimates(problem, pooled, params, n_windows: int = 6, max_nfev: int = 20) -> dict:
    """{param: [{run, t_h (window mid), value, ci95}]} from fits on n_windows windows per run."""
    from hil.calibration.sysid import SysIdProblem

    spec = problem.spec
    theta = problem.theta_from(pooled)
    sims = problem.simulate(theta)
    out = {p: [] for p in params}
    sigma = {n: problem.sigma[spec.index("outputs", n)] for n in problem.outputs}
    for r, run in enumerate(problem.corrected_runs(theta)):  # the fitted sensor offsets held
        n = run.t_s.size
        edges = np.linspace(0, n - 1, n_windows + 1).astype(int)
        Xs = sims[r][1]
        for a, b in zip(edges[:-1], edges[1:]):
            if b - a < 10 or not np.all(np.isfinite(Xs[a])):
                continue
            sub = run.slice(a, b + 1)
            meas = set(sub.measured_outputs(spec))
            outs = [o for o in problem.outputs if o in meas]
            if not outs:
                continue
            pb = SysIdProblem(problem.module, [sub], list(params), base_params=pooled.p_full, x0=Xs[a],
                              outputs=outs, sigma={o: sigma[o] for o in outs}, ref_cv=pooled.ref_cv)
            pb.sim = problem.sim
            try:
                res = pb.fit(reweight=False, max_nfev=max_nfev)
            except (ValueError, np.linalg.LinAlgError):
                continue
            t_mid = 0.5 * (sub.t_s[-1]) / 3600.0 + run.t_s[a] / 3600.0
            for i, p in enumerate(params):
                out[p].append({"run": run.name, "t_h": float(t_mid), "value": float(res.values[i]),
                               "std": float(res.std[i]), "ci95": [float(x) for x in res.ci95[i]],
                               "at_bound": p in res.at_bound})
    return out


def trend_findings(windowed: dict, unit_of=lambda p: "") -> list[dict]:
    out = []
    for p, rows in windowed.items():
        for run in sorted({r["run"] for r in rows}):
            rr = [r for r in rows if r["run"] == run and math.isfinite(r["std"]) and r["std"] > 0]
            if len(rr) < 3:
                continue
            t = np.array([r["t_h"] for r in rr])
            v = np.array([r["value"] for r in rr])
            s = np.array([r["std"] for r in rr])
            w = 1.0 / s ** 2
            A = np.stack([np.ones_like(t), t], axis=1)
            cov = np.linalg.pinv(A.T @ (A * w[:, None]))
            coef = cov @ (A.T @ (w * v))
            # scale the interval by the scatter about the line when it exceeds the stated stds
            chi2 = float(np.sum(w * (v - A @ coef) ** 2)) / max(len(rr) - 2, 1)
            se = math.sqrt(cov[1, 1] * max(chi2, 1.0))
            change = coef[1] * (t[-1] - t[0])
            half = float(np.median(1.96 * s))
            if abs(coef[1]) > 3.0 * se and abs(change) > half:
                a, b = coef[0] + coef[1] * t[0], coef[0] + coef[1] * t[-1]
                word = "falls" if change < 0 else "rises"
                out.append({"kind": "trend", "params": [p], "run": run, "from": float(a), "to": float(b),
                            "t_from_h": float(t[0]), "t_to_h": float(t[-1]), "slope_per_h": float(coef[1]),
                            "why": f"{p} {word} from {a:.4g} to {b:.4g} {unit_of(p)} between {t[0]:.1f} h and "
                                   f"{t[-1]:.1f} h of run {run} (windowed re-estimation, slope {coef[1]:+.3g}/h, "
                                   f"{abs(coef[1]) / se:.1f} standard errors): the model lacks an effect that "
                                   "changes it along the run"})
    return out


def _events_since(t_s: np.ndarray, v: np.ndarray) -> np.ndarray | None:
    """Hours since the last nonzero sample of an event-like column (sparse nonzero); None if
    the column is not event-like."""
    f = np.isfinite(v)
    nz = f & (v != 0)
    if nz.sum() == 0 or nz.sum() > 0.05 * f.sum():
        return None
    out = np.empty_like(t_s)
    last = t_s[0]
    for k in range(t_s.size):
        if nz[k]:
            last = t_s[k]
        out[k] = (t_s[k] - last) / 3600.0
    return out


def correlation_findings(problem, sims, window_frac: float = 0.1, r_min: float = 0.5, theta=None) -> list[dict]:
    """The slow residual of each fitted output against each extra column (value, and time
    since the last event for event columns), and against time itself for comparison; the
    fitted sensor offsets of `theta` (if given) are removed first."""
    spec = problem.spec
    extras = sorted(set().union(*[set(r.extras) for r in problem.runs]))
    runs = problem.runs if theta is None else problem.corrected_runs(theta)
    out = []
    for name in problem.outputs:
        j = spec.index("outputs", name)
        slow, feats = [], {}
        t_all = []
        for r, run in enumerate(runs):
            y, ys = run.Y[:, j], sims[r][0][:, j]
            m = np.isfinite(y) & np.isfinite(ys)
            if m.sum() < 20:
                continue
            e = y[m] - ys[m]
            w = max(3, int(m.sum() * window_frac / 10))  # a tenth of the smoothing of the noise fit
            slow.append(_smooth(e, w))
            t_all.append(run.t_s[m] / 3600.0)
            for c in extras:
                v = run.extras.get(c)
                if v is None:
                    v = np.full(run.t_s.size, np.nan)
                ev = _events_since(run.t_s, np.nan_to_num(v, nan=0.0))
                if ev is not None:
                    feats.setdefault(f"time since {c}", []).append(ev[m])
                else:
                    feats.setdefault(c, []).append(v[m])
        if not slow:
            continue
        e = np.concatenate(slow)
        n_eff = max(3.0, len(slow) * 10.0 / window_frac / 10.0)  # ~ independent windows
        tt = np.concatenate(t_all)
        r_time = abs(_corr(e, tt))
        for fname, parts in feats.items():
            if len(parts) != len(slow):
                continue
            x = np.concatenate(parts)
            r = _corr(e, x)
            if not math.isfinite(r) or abs(r) < r_min:
                continue
            tstat = r * math.sqrt((n_eff - 2) / max(1 - r * r, 1e-12))
            p = 2 * stats.t.sf(abs(tstat), n_eff - 2)
            if p < 0.01 and abs(r) > r_time + 0.1:
                col = fname.replace("time since ", "")
                out.append({"kind": "correlation", "params": [], "output": name, "column": col,
                            "feature": fname, "r": float(r), "r_time": float(r_time),
                            "why": f"the {name} residual correlates with {fname} (column {col!r}): r = {r:+.2f} "
                                   f"(with time alone {r_time:.2f}); the model lacks an effect tied to {col}"})
    return out


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    m = np.isfinite(a) & np.isfinite(b)
    if m.sum() < 5:
        return math.nan
    a, b = a[m] - a[m].mean(), b[m] - b[m].mean()
    d = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / d if d > 0 else math.nan


def spread_findings(pooled, per_run, level: float = 0.99) -> list[dict]:
    out = []
    if len(per_run) < 2:
        return out
    for i, p in enumerate(pooled.params):
        v = np.array([f.values[i] for f in per_run])
        s = np.array([f.std[i] for f in per_run])
        if not np.all(np.isfinite(s)) or np.any(s <= 0):
            continue
        w = 1 / s ** 2
        mean = float(np.sum(w * v) / np.sum(w))
        q = float(np.sum(w * (v - mean) ** 2))
        crit = float(stats.chi2.ppf(level, len(v) - 1))
        if q > crit:
            out.append({"kind": "run_spread", "params": [p], "chi2": q, "critical": crit,
                        "why": f"{p} differs between runs beyond their intervals (per run "
                               f"{', '.join(f'{x:.4g}' for x in v)}; chi-square {q:.1f} > {crit:.1f}): randomize "
                               "it, or an input that changes between runs is missing"})
    return out


def bound_findings(problem, pooled) -> list[dict]:
    """At-bound parameters with the direction the data pull them (the cost's slope there)."""
    out = []
    if not pooled.at_bound:
        return out
    theta = problem.theta_from(pooled)
    lo, hi = problem.bounds()
    c0 = 0.5 * float(np.sum(problem.residuals(theta) ** 2))
    for name in pooled.at_bound:
        i = problem.params.index(name)
        q = problem.spec.quantity("params", name)
        lower = theta[i] <= lo[i] + 1e-9
        step = 0.01 * (hi[i] - lo[i]) * (1 if lower else -1)
        th = theta.copy()
        th[i] += step
        c1 = 0.5 * float(np.sum(problem.residuals(th) ** 2))
        side = "lower" if lower else "upper"
        bound = q.low if lower else q.high
        if c1 > c0:
            pull = (f"the data pull it {'below' if lower else 'above'} the bound (the cost rises by "
                    f"{c1 - c0:.3g} moving 1 % of the range inward)")
        else:
            pull = "the cost is flat or falls moving inward (the optimizer stopped on the bound)"
        out.append({"kind": "at_bound", "params": [name], "side": side, "pull": "outward" if c1 > c0 else "inward",
                    "why": f"{name} stopped at its {side} physical bound {bound:.4g} {q.unit}: {pull}; suspect an "
                           "unmodelled effect or a unit mismatch (its randomization range is not widened away "
                           "from the data)"})
    return out


def unlogged_state_warnings(problem, pooled, threshold_sigma: float = 1.0) -> list[str]:
    """States the model integrates freely (not prescribed, not seen directly by a measured
    output), that move along the runs, and whose excursion, applied at the start, moves the
    fitted outputs by more than `threshold_sigma` noise RMS: declare them ([states.X] in
    the column map) or log them."""
    spec = problem.spec
    module = problem.module
    measured = set().union(*[set(r.measured_outputs(spec)) for r in problem.runs])
    mo = [spec.index("outputs", n) for n in measured]
    theta = problem.theta_from(pooled)
    sims = problem.simulate(theta)
    p = pooled.p_full
    out = []
    y0, y1 = np.zeros(spec.n_outputs), np.zeros(spec.n_outputs)
    for i, q in enumerate(spec.states):
        if any(np.isfinite(r.X_presc[:, i]).any() for r in problem.runs):
            continue
        x = problem.x0_of(theta, 0).copy()
        u = problem.runs[0].U[0]
        module.outputs(x, u, p, y0)
        x2 = x.copy()
        x2[i] += 1e-3 * max(abs(x[i]), q.high - q.low)
        module.outputs(x2, u, p, y1)
        if np.any(np.abs(y1[mo] - y0[mo]) > 1e-12 * (np.abs(y0[mo]) + 1e-12)):
            continue  # seen through a measured output
        exc = max(float(np.nanmax(s[1][:, i]) - np.nanmin(s[1][:, i])) for s in sims)
        if not exc > 0:
            continue
        worst = 0.0
        for r, run in enumerate(problem.runs):
            x0 = problem.x0_of(theta, r).copy()
            x0[i] += exc
            Ysim = problem.sim.run(problem.run_at(theta, r), p, x0)[0]
            d = (Ysim[:, problem.o_idx] - sims[r][0][:, problem.o_idx]) / problem.sigma[problem.o_idx]
            d = d[np.isfinite(d)]
            if d.size:
                worst = max(worst, float(np.sqrt(np.mean(d ** 2))))
        if worst > threshold_sigma:
            span = [float(np.nanmin(s[1][:, i])) for s in sims], [float(np.nanmax(s[1][:, i])) for s in sims]
            out.append(f"state {q.name!r} is neither logged nor declared: the model moves it from "
                       f"{min(span[0]):.4g} to {max(span[1]):.4g} {q.unit} on its own, and an offset of that size "
                       f"moves the fitted outputs by {worst:.1f} noise RMS; if the unit holds it (a controller), "
                       f"declare it in the column map ([states.{q.name}] value = ... or profile = ...), or log it")
    return out
