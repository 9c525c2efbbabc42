"""Fit a ResidualModel (hil/calibration/residual.py) to runs, on top of calibrated parameters.

The W entries of the chosen states x features are fitted by the same noise-weighted
trajectory least squares as the parameters (the correction is applied inside the simulated
plant step, exactly as in the loop), ridge-regularized (`ridge` per entry, dimensionless
features) so that a feature the data do not excite stays near zero. Features are scaled by
the runs' own range: lo = mean, scale = std of the simulated states / logged inputs.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares

from hil.calibration.report import heldout_rmse
from hil.calibration.residual import SINCE, ResidualModel, event_series, is_extra, parse_extra
from hil.calibration.simulate import RunSimulator


def fit_residual(problem, pooled, states, features=None, ridge: float = 1.0, max_nfev: int = 40,
                 heldout=None, heldout_x0=None):
    """Returns (model, report) where report holds the held-out (or training, if none held
    out) noise-weighted RMS error per output without and with the correction."""
    spec = problem.spec
    theta = _theta(problem, pooled)
    sims = problem.simulate(theta)
    X = np.concatenate([s[1] for s in sims])
    U = np.concatenate([r.U for r in problem.runs])
    Z = np.concatenate([X, U], axis=1)
    Z = Z[np.all(np.isfinite(Z), axis=1)]
    lo = Z.mean(axis=0)
    sc = Z.std(axis=0)
    if features is None:  # every state/input that moves in the data
        features = [f"x.{n}" for i, n in enumerate(spec.names("states")) if sc[i] > 1e-12 * max(abs(lo[i]), 1)]
        features += [f"u.{n}" for j, n in enumerate(spec.names("inputs"))
                     if sc[spec.n_states + j] > 1e-12 * max(abs(lo[spec.n_states + j]), 1)]
    tu = float(getattr(problem.module, "TIME_UNIT_S", 1.0))
    extras = [f for f in features if is_extra(f)]
    if extras:
        E = np.concatenate([extra_feature_series(spec, run, extras, tu) for run in problem.runs])
        lo = np.concatenate([lo, E.mean(axis=0)])
        sc = np.concatenate([sc, E.std(axis=0)])
    sc = np.where(sc > 0, sc, 1.0)
    model = ResidualModel.zeros(spec, states, features, lo, sc, time_unit_s=tu)
    nr = len(states)
    cols = model.feature_columns(spec)
    sim = RunSimulator(problem.module, model)  # holds model.W by reference

    # W scale per corrected state: its spread times the faster of (a) its own relaxation rate
    # |df_i/dx_i| (a quasi-steady state such as DO answers a derivative correction d with an
    # offset d / rate: theta ~ 1 moves it by ~ its spread) and (b) 1 / run length (a slow state
    # integrates d over the run: theta ~ 1 moves it by ~ its spread at the end)
    xs = np.array([max(np.nanstd(X[:, i]), 1e-9) for i in model.idx[:nr]])
    span = max(r.duration_s for r in problem.runs) / tu
    rate = relaxation_rates(problem.module, pooled.p_full, sims, problem.runs, model.idx[:nr])
    w_scale = np.repeat(xs * np.maximum(rate, 1.0 / span), len(cols))
    p = pooled.p_full
    x0s = pooled.x0

    def res(w):
        model.W[:, cols] = (w * w_scale).reshape(nr, len(cols))
        parts = []
        for r, run in enumerate(problem.runs):
            Ysim = sim.run(problem.run_at(theta, r), p, x0s[r])[0]
            parts.append(problem._run_residuals(r, Ysim, problem.offset_of(theta, run)))
        parts.append(np.sqrt(ridge) * w)
        return np.concatenate(parts)

    sol = least_squares(res, np.zeros(nr * len(cols)), method="trf", x_scale="jac", max_nfev=max_nfev)
    model.W[:, cols] = (sol.x * w_scale).reshape(nr, len(cols))
    runs = heldout if heldout else problem.runs
    x0h = heldout_x0 if heldout else x0s
    base = RunSimulator(problem.module)
    before = heldout_rmse(problem, p, x0h, runs, base, theta)
    after = heldout_rmse(problem, p, x0h, runs, sim, theta)
    sig = {n: float(problem.sigma[spec.index("outputs", n)]) for n in before}
    report = {"states": list(states), "features": list(features),
              "loop_applicable": not model.loop_blockers(), "loop_blockers": model.loop_blockers(),
              "evaluated_on": "held-out runs" if heldout else "training runs",
              "rmse_without": before, "rmse_with": after,
              "rmse_without_raw": {n: before[n] * sig[n] for n in before},
              "rmse_with_raw": {n: after[n] * sig[n] for n in after},
              "unit": {n: spec.quantity("outputs", n).unit for n in before},
              "w_scale_rate_per_time_unit": {s_: float(r_) for s_, r_ in zip(states, np.maximum(rate, 1.0 / span))},
              "improvement": {n: (1 - after[n] / before[n]) if before[n] > 0 else 0.0 for n in before}}
    return model, report


def check_extra_features(spec, runs, features) -> None:
    """ValueError naming the feature unless each extra feature parses and reads a plant input
    or an extra column every run has (called before the fit)."""
    ins = spec.names("inputs")
    for f in features:
        if not is_extra(f):
            continue
        ef = parse_extra(f)
        if ef.source in ins:
            continue
        for run in runs:
            if ef.source not in run.extras:
                raise ValueError(f"feature {f!r}: {ef.source!r} is neither an input of {spec.name} nor an extra "
                                 f"column of run {run.name!r} (extras: {', '.join(sorted(run.extras)) or 'none'})")


def extra_feature_series(spec, run, features, time_unit_s: float) -> np.ndarray:
    """(n, len(features)) what the kernel reads for each extra feature at each sample of
    `run` (time since an event in the plant time unit, as the kernel counts it)."""
    cols = []
    ins = spec.names("inputs")
    for f in features:
        ef = parse_extra(f)
        v = run.U[:, ins.index(ef.source)] if ef.source in ins else run.extras[ef.source]
        e = event_series(v, run.t_s, ef.kind, ef.tau_s)
        cols.append(e / time_unit_s if ef.kind == SINCE else e)
    return np.column_stack(cols) if cols else np.zeros((run.t_s.size, 0))


def relaxation_rates(module, p, sims, runs, idx, n_points: int = 50) -> np.ndarray:
    """Median |df_i/dx_i| (1 / plant time unit) of each state in idx over up to n_points
    simulated samples of the runs (central differences of the plant's derivatives); 0 for a
    plant without a `derivatives(t, x, u, p, dxdt)` kernel (then the 1 / run-length scale)."""
    spec = module.SPEC
    if not callable(getattr(module, "derivatives", None)):
        return np.zeros(len(idx))
    pts = []
    for (Ysim, Xsim), run in zip(sims, runs):
        ok = np.flatnonzero(np.all(np.isfinite(Xsim), axis=1))
        for k in ok[np.linspace(0, ok.size - 1, min(ok.size, max(1, n_points // len(runs)))).astype(int)]:
            pts.append((Xsim[k], run.U[k]))
    d0, d1 = np.zeros(spec.n_states), np.zeros(spec.n_states)
    out = np.zeros(len(idx))
    for a, i in enumerate(idx):
        rates = []
        for x, u in pts:
            h = 1e-6 * max(abs(x[i]), spec.states[i].high - spec.states[i].low)
            xp, xm = x.copy(), x.copy()
            xp[i] += h
            xm[i] -= h
            module.derivatives(0.0, xp, u, p, d1)
            module.derivatives(0.0, xm, u, p, d0)
            rates.append(abs(d1[i] - d0[i]) / (2 * h))
        out[a] = float(np.median(rates)) if rates else 0.0
    return out


def _theta(problem, pooled):
    """The problem's theta vector of a fit result (parameters, initial states, sensor offsets)."""
    return problem.theta_from(pooled)
