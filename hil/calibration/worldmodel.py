"""A learned world model as a consistency check on the calibrated simulator (never a trainer).

Model: an ensemble of M ridge regressions, each on a bootstrap resample of the training
transitions, of the output increment over one (median) sample interval, (y[k+1] - y[k]) *
dt_med / dt, on quadratic features of the standardized measured outputs and inputs
z = [y[k], u[k]]: [1, z_i, z_i z_j] (z clipped to +/- 6 std so a rollout cannot leave the
polynomial's range). A discrete-time map, so fast modes (faster than a sample) stay
stable. Small, deterministic for a seed, no extra dependency.

Comparison on held-out runs, every error in units of each output's measurement noise sigma
(robust scatter of first differences of the held-out measurements, independent of the fit):
- one step: world model y[k] + dt f(y[k], u[k]) vs the simulator's increment over the same
  sample added to the measurement, y[k] + (y_sim[k+1] - y_sim[k]) (the simulator has no
  state estimator here: its trajectory is re-anchored on the measurement);
- multi step (horizon H samples): the world model rolled out from the measured y[k0] under
  the logged inputs vs the simulator's trajectory re-anchored at k0.
Regions: each varying input and fitted output is cut into terciles of its held-out values;
per region, the RMS multi-step error of both. A region "diverges" when the simulator's error
exceeds DIVERGE_SIGMA and the world model is at least DIVERGE_RATIO times better there with
ensemble members that agree (their spread below the simulator's error): the data show a
regularity the simulator misses. That verdict goes into the fitted file and the audit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DIVERGE_SIGMA = 2.0
DIVERGE_RATIO = 2.0


def _quad(Z: np.ndarray) -> np.ndarray:
    n, d = Z.shape
    cols = [np.ones(n)] + [Z[:, i] for i in range(d)]
    cols += [Z[:, i] * Z[:, j] for i in range(d) for j in range(i, d)]
    return np.stack(cols, axis=1)


@dataclass
class WorldModel:
    outputs: list[int]        # output indices
    inputs: list[int]         # input indices (varying ones)
    mean: np.ndarray
    std: np.ndarray
    step_scale: np.ndarray    # per output, units per median sample
    dt_med_s: float
    coefs: list[np.ndarray]   # per member (n_feat, n_out)

    def increments(self, y: np.ndarray, u: np.ndarray, dt_s) -> np.ndarray:
        """(M, n, n_out) output increments over dt_s (s) for rows of y (n, n_out), u (n, n_in)."""
        Z = np.clip((np.concatenate([y, u], axis=1) - self.mean) / self.std, -6.0, 6.0)
        F = _quad(Z)
        scale = self.step_scale * (np.asarray(dt_s, float).reshape(-1, 1) / self.dt_med_s)
        return np.stack([F @ c for c in self.coefs]) * scale


def _transitions(runs, outputs, inputs):
    Ys, Us, R, DT = [], [], [], []
    for run in runs:
        y = run.Y[:, outputs]
        dt = np.diff(run.t_s)
        ok = np.all(np.isfinite(y[:-1]), axis=1) & np.all(np.isfinite(y[1:]), axis=1)
        Ys.append(y[:-1][ok])
        Us.append(run.U[:-1, inputs][ok])
        R.append(((y[1:] - y[:-1]) / dt[:, None])[ok])
        DT.append(dt[ok])
    return np.concatenate(Ys), np.concatenate(Us), np.concatenate(R), np.concatenate(DT)


def train(runs, spec, outputs: list[str], members: int = 5, ridge: float = 1e-2, seed: int = 0) -> WorldModel:
    o = [spec.index("outputs", n) for n in outputs]
    U_all = np.concatenate([r.U for r in runs])
    i = [j for j in range(spec.n_inputs) if np.ptp(U_all[:, j]) > 0]
    Y, U, R, DT = _transitions(runs, o, i)
    dt_med = float(np.median(DT))
    Z = np.concatenate([Y, U], axis=1)
    mean, std = Z.mean(axis=0), Z.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    D = R * dt_med  # increments per median sample
    step_scale = np.maximum(D.std(axis=0), 1e-300)
    F = _quad((Z - mean) / std)
    T = D / step_scale
    rng = np.random.default_rng(seed)
    coefs = []
    for _ in range(members):
        b = rng.integers(0, F.shape[0], F.shape[0])
        A = F[b]
        coefs.append(np.linalg.solve(A.T @ A + ridge * A.shape[0] * np.eye(A.shape[1]), A.T @ T[b]))
    return WorldModel(o, i, mean, std, step_scale, dt_med, coefs)


def compare(wm: WorldModel, runs, sims, spec, horizon: int = 60) -> dict:
    """World model vs simulator on held-out `runs` (sims[r] = (Ysim, Xsim) of the calibrated
    simulator); returns the report dict (module docstring)."""
    from hil.calibration.sysid import _robust_sigma_from_diffs

    o = wm.outputs
    names = [spec.outputs[j].name for j in o]
    sg = np.array([np.nanmedian([_robust_sigma_from_diffs(r.Y[:, j]) for r in runs]) for j in o])
    sg = np.where(np.isfinite(sg) & (sg > 0), sg, 1.0)
    one_wm, one_sim = [], []
    ms_rows = []  # (error_wm (n_out), error_sim (n_out), spread (n_out), z at start)
    for run, (Ysim, _) in zip(runs, sims):
        y = run.Y[:, o]
        u = run.U[:, wm.inputs]
        ys = Ysim[:, o]
        dt = np.diff(run.t_s)
        ok = np.all(np.isfinite(y[:-1]), axis=1) & np.all(np.isfinite(y[1:]), axis=1)
        pred = y[:-1] + wm.increments(y[:-1], u[:-1], dt).mean(axis=0)
        one_wm.append(((pred - y[1:]) / sg)[ok])
        one_sim.append(((y[:-1] + ys[1:] - ys[:-1] - y[1:]) / sg)[ok])
        for k0 in range(0, run.t_s.size - horizon - 1, max(horizon // 2, 1)):
            if not np.all(np.isfinite(y[k0])):
                continue
            cur = np.repeat(y[k0][None, :], len(wm.coefs), axis=0)
            for k in range(k0, k0 + horizon):
                inc = wm.increments(cur, np.repeat(u[k][None, :], cur.shape[0], axis=0),
                                    run.t_s[k + 1] - run.t_s[k])
                cur = cur + inc[np.arange(cur.shape[0]), np.arange(cur.shape[0])]
            kE = k0 + horizon
            if not np.all(np.isfinite(y[kE])):
                continue
            e_wm = (cur.mean(axis=0) - y[kE]) / sg
            e_sim = (y[k0] + ys[kE] - ys[k0] - y[kE]) / sg
            spread = cur.std(axis=0) / sg
            ms_rows.append((e_wm, e_sim, spread, np.concatenate([y[k0], u[k0]])))
    rms = lambda a: [float(math.sqrt(np.mean(c ** 2))) if c.size else math.nan for c in a.T]  # noqa: E731
    one_wm, one_sim = np.concatenate(one_wm), np.concatenate(one_sim)
    units = {n: spec.outputs[j].unit for n, j in zip(names, o)}
    report = {"outputs": names, "horizon_samples": horizon, "sigma": dict(zip(names, map(float, sg))),
              "unit": units,
              "one_step_rmse_sigma": {"world_model": dict(zip(names, rms(one_wm))),
                                      "simulator": dict(zip(names, rms(one_sim)))}}
    if not ms_rows:
        report["regions"], report["diverging_regions"] = [], []
        return report
    E_wm = np.array([r[0] for r in ms_rows])
    E_sim = np.array([r[1] for r in ms_rows])
    S = np.array([r[2] for r in ms_rows])
    Zs = np.array([r[3] for r in ms_rows])
    report["multi_step_rmse_sigma"] = {"world_model": dict(zip(names, rms(E_wm))),
                                       "simulator": dict(zip(names, rms(E_sim)))}
    var_names = names + [spec.inputs[j].name for j in wm.inputs]
    regions, diverging = [], []
    for v, vname in enumerate(var_names):
        levels = np.unique(Zs[:, v])
        if levels.size <= 3:  # a few-level input (on/off, two set points): one region per level
            bins = [(lv, lv, Zs[:, v] == lv) for lv in levels]
        else:  # terciles, without empty or zero-width bins where values repeat
            edges = np.unique(np.quantile(Zs[:, v], [0, 1 / 3, 2 / 3, 1]))
            bins = [(edges[b], edges[b + 1], (Zs[:, v] >= edges[b]) & (
                (Zs[:, v] <= edges[b + 1]) if b == edges.size - 2 else (Zs[:, v] < edges[b + 1])))
                    for b in range(edges.size - 1)]
        for lo_v, hi_v, sel in bins:
            if sel.sum() < 3:
                continue
            for oi, oname in enumerate(names):
                es = float(np.sqrt(np.mean(E_sim[sel, oi] ** 2)))
                ew = float(np.sqrt(np.mean(E_wm[sel, oi] ** 2)))
                sp = float(np.mean(S[sel, oi]))
                div = es > DIVERGE_SIGMA and es > DIVERGE_RATIO * ew and sp < es
                row = {"variable": vname, "low": float(lo_v), "high": float(hi_v),
                       "output": oname, "n": int(sel.sum()), "sim_rmse_sigma": es,
                       "world_model_rmse_sigma": ew, "ensemble_spread_sigma": sp, "diverges": bool(div)}
                regions.append(row)
                if div:
                    where = f"= {lo_v:.4g}" if lo_v == hi_v else f"in [{lo_v:.4g}, {hi_v:.4g}]"
                    s_raw, u_ = sg[oi], units[oname]
                    diverging.append(f"{oname} where {vname} {where} (simulator {es * s_raw:.3g} {u_}, world model "
                                     f"{ew * s_raw:.3g} {u_}; {es:.1f} and {ew:.1f} noise sigma)")
    report["regions"] = regions
    report["diverging_regions"] = diverging
    return report


def region_table(report: dict, all_rows: bool = False) -> str:
    """The regions where the world model beats the simulator (all regions with all_rows), RMS
    error `horizon` samples ahead in each output's unit, with a title that says so."""
    rows = report.get("regions", [])
    shown = rows if all_rows else [r for r in rows if r["diverges"]]
    sig, unit = report.get("sigma", {}), report.get("unit", {})
    lines = [f"world model vs simulator on the held-out runs: RMS error {report.get('horizon_samples')} samples "
             f"ahead per operating region ({len(shown)} of {len(rows)} regions shown"
             + ("" if all_rows else ": those where the simulator is off and the world model does better") + ")",
             f"{'output':18s} {'region':34s} {'n':>5s} {'simulator':>12s} {'world model':>12s} {'spread':>10s}  unit"]
    for r in shown:
        s = sig.get(r["output"], 1.0)
        reg = f"{r['variable']} [{r['low']:.4g}, {r['high']:.4g}]"
        lines.append(f"{r['output']:18s} {reg:34s} {r['n']:5d} {r['sim_rmse_sigma'] * s:12.4g} "
                     f"{r['world_model_rmse_sigma'] * s:12.4g} {r['ensemble_spread_sigma'] * s:10.4g}  "
                     f"{unit.get(r['output'], '')}")
    return "\n".join(lines)


def region_plot(report: dict, path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report.get("regions", [])
    outs = list(dict.fromkeys(r["output"] for r in rows)) or ["(none)"]
    per = max(1, max(sum(r["output"] == o for r in rows) for o in outs))
    # one panel per output, regions as horizontal bars: ~1300 x 750 px for 4 outputs x 33 regions
    fig, axes = plt.subplots(1, len(outs), figsize=(min(14.0, 3.6 * len(outs)), min(12.0, 1.5 + 0.2 * per)),
                             squeeze=False, sharey=True)
    for ax, o in zip(axes[0], outs):
        rr = [r for r in rows if r["output"] == o]
        s = report.get("sigma", {}).get(o, 1.0)
        y = np.arange(len(rr))
        ax.barh(y - 0.2, [r["sim_rmse_sigma"] * s for r in rr], 0.4, color="tab:red", label="simulator")
        ax.barh(y + 0.2, [r["world_model_rmse_sigma"] * s for r in rr], 0.4, color="tab:blue", label="world model")
        ax.set_yticks(y, [f"{r['variable']} [{r['low']:.3g}, {r['high']:.3g}]" for r in rr], fontsize=6)
        ax.set_title(o, fontsize=8)
        ax.set_xlabel(f"RMS error at {report['horizon_samples']} samples [{report.get('unit', {}).get(o, '')}]",
                      fontsize=7)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)
