"""What `hil sysid` writes: the fitted TOML (plant parameters, intervals, identifiability,
randomization ranges and sensor gaps in the scenario's [gaps] format) and residual plots."""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path

import numpy as np

from hil.calibration import tomlw


def fitted_document(problem, pooled, per_run, spread, noise, findings, *, unit: str = "",
                    profile: dict | None = None, residual: dict | None = None,
                    sources: list[str] | None = None, warnings: list[str] | None = None) -> dict:
    """The fitted scenario fragment: merge its [plant] and [gaps] into a scenario; [sysid]
    is the evidence (read by `hil audit`)."""
    spec = problem.spec
    est = {}
    for i, name in enumerate(pooled.params):
        q = spec.quantity("params", name)
        est[name] = {
            "value": float(pooled.values[i]), "std": float(pooled.std[i]),
            "ci95": [float(a) for a in pooled.ci95[i]], "unit": q.unit, "nominal": q.nominal,
            "per_run": [float(f.values[i]) for f in per_run],
            "per_run_std": [float(f.std[i]) for f in per_run],
        }
    sensors, model_error, omitted, refs = {}, {}, {}, {}
    for name, fields in noise.items():
        sensors[name] = {k: v for k, v in fields.items() if not k.startswith("_")}
        me = fields.get("_model_error")
        if me and me.get("structured"):
            model_error[name] = me
        if fields.get("_omitted"):
            omitted[name] = fields["_omitted"]
        if fields.get("_reference"):
            refs[name] = fields["_reference"]
    doc = {
        "sysid": {
            "plant": spec.name, "unit": unit, "runs": pooled.runs, "n_runs": len(pooled.runs),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "outputs": pooled.outputs,
            "sigma": {n: float(pooled.sigma[spec.index("outputs", n)]) for n in pooled.outputs},
            "residual_lag1": {n: float(pooled.rho[spec.index("outputs", n)]) for n in pooled.outputs},
            "cost": pooled.cost, "n_residuals": pooled.n_residuals, "nfev": pooled.nfev,
            "noise_fitted": sorted(noise),
            "files": list(sources or []),
            "sensor_bias_from_reference": refs,
            "sensor_fields_omitted": omitted,
            "model_error": model_error,
            "warnings": list(warnings or []),
            "estimates": est,
            "correlation": {"params": pooled.params,
                            "matrix": [[float(c) for c in row] for row in pooled.corr]},
            "identifiability": {f"finding_{i}": {k: v for k, v in f.items() if k in ("kind", "params", "why")}
                                for i, f in enumerate(findings)},
        },
        "plant": {"parameters": {n: float(v) for n, v in zip(pooled.params, pooled.values)}},
        "gaps": {"sensors": sensors, "randomize": {"plant": spread}},
    }
    offsets = {}
    for n, b in pooled.biases.items():
        offsets.setdefault(n, {}).update(bias=b, bias_ci95=pooled.sensor_ci95.get(f"bias.{n}"))
    for n, d in pooled.drifts.items():
        offsets.setdefault(n, {}).update(drift_per_h=d, drift_per_h_ci95=pooled.sensor_ci95.get(f"drift.{n}"))
    if pooled.lags:  # actuator lags fitted with the parameters (--fit-lag), s
        doc["sysid"]["actuator_lags"] = {n: {"lag_s": v, "lag_s_ci95": pooled.lag_ci95.get(n)}
                                         for n, v in pooled.lags.items()}
    if offsets:  # fitted with the parameters (--bias / --drift), plant units; not a sensor gap
        doc["sysid"]["sensor_offsets_fitted"] = offsets
    if pooled.ref_cv:
        doc["sysid"]["reference_relative_error"] = dict(pooled.ref_cv)
    if pooled.init_states:
        doc["sysid"]["initial_states"] = {
            r: {s: float(v) for s, v in zip(pooled.init_states, vals)}
            for r, vals in zip(pooled.runs, pooled.init_values)}
    if profile:
        doc["sysid"]["profile"] = profile
    if residual:
        doc["sysid"]["residual_model"] = residual
    return doc


def write_fitted(path: str | Path, doc: dict) -> None:
    comments = {
        "sysid": "evidence of the fit (hil audit reads it); not a scenario section",
        "plant.parameters": "pooled estimates over every run, plant units",
        "gaps.randomize.plant": "ranges from the measured run-to-run spread (per-run 95 % intervals)",
        "gaps.sensors": "noise from high-frequency content; bias/drift only against reference columns",
    }
    Path(path).write_text(tomlw.dumps(doc, comments))


def residual_plots(problem, sims, out_dir: str | Path, theta=None) -> list[str]:
    """One PNG per fitted output: measured vs simulated per run, and the residual, one colour
    per run in both panels; with `theta`, the fitted sensor offsets are removed first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = problem.spec
    files = []
    for name in problem.outputs:
        j = spec.index("outputs", name)
        fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
        runs = problem.runs if theta is None else problem.corrected_runs(theta)
        for r, run in enumerate(runs):
            t_h = run.t_s / 3600.0
            ys = sims[r][0][:, j]
            c = f"C{r % 10}"
            a1.plot(t_h, run.Y[:, j], ".", ms=2, alpha=0.4, color=c, label=f"{run.name} measured")
            a1.plot(t_h, ys, "-", lw=1.2, color=c, label=f"{run.name} model")
            a2.plot(t_h, run.Y[:, j] - ys, ".", ms=2, color=c, label=run.name)
        unit = spec.outputs[j].unit
        a1.set_ylabel(f"{name} [{unit}]")
        a2.set_ylabel(f"residual [{unit}]")
        a2.axhline(0.0, color="k", lw=0.5)
        a2.set_xlabel("time since run start [h]")
        a1.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        f = out_dir / f"residual_{name}.png"
        fig.savefig(f, dpi=90)
        plt.close(fig)
        files.append(str(f))
    return files


def print_summary(echo, pooled, per_run, findings, noise, profile=None, warnings=()) -> None:
    echo(f"pooled fit over {len(pooled.runs)} run(s), {pooled.n_residuals} residuals, {pooled.nfev} evaluations")
    echo(f"{'parameter':14s} {'value':>12s} {'95% interval':>27s}   per run")
    for i, n in enumerate(pooled.params):
        pr = ", ".join(f"{f.values[i]:.4g}" for f in per_run)
        echo(f"{n:14s} {pooled.values[i]:12.5g} [{pooled.ci95[i][0]:12.5g}, {pooled.ci95[i][1]:12.5g}]   {pr}")
    if profile:
        a, b = profile["ci95"]
        echo(f"profile likelihood check, {profile['parameter']}: 95% [{a:.5g}, {b:.5g}]"
             + (f" ({profile['why']})" if profile.get("why") else ""))
    for n, b in pooled.biases.items():
        lo, hi = pooled.sensor_ci95.get(f"bias.{n}", [math.nan, math.nan])
        echo(f"sensor bias fitted with the parameters (--bias), {n}: {b:.4g} [{lo:.4g}, {hi:.4g}]")
    for n, d in pooled.drifts.items():
        lo, hi = pooled.sensor_ci95.get(f"drift.{n}", [math.nan, math.nan])
        echo(f"sensor drift fitted with the parameters (--drift), {n}: {d:.4g}/h [{lo:.4g}, {hi:.4g}]")
    for n, v in pooled.lags.items():
        lo, hi = pooled.lag_ci95.get(n, [math.nan, math.nan])
        echo(f"actuator lag fitted with the parameters (--fit-lag), {n}: lag_s = {v:.4g} s [{lo:.4g}, {hi:.4g}]")
    for n, cv in pooled.ref_cv.items():
        echo(f"reference samples of {n} fitted with the outputs: relative error {cv:.3g}")
    for w in warnings:
        echo(f"warning: {w}")
    for f in findings:
        echo(f"finding ({f['kind']}): {f['why']}")
    for n, fields in noise.items():
        shown = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) and math.isfinite(v) else f"{k}={v}"
                          for k, v in fields.items() if not k.startswith("_"))
        echo(f"sensor {n}: {shown}")
        ref = fields.get("_reference")
        if ref:
            echo(f"  bias/drift against {ref['n_reference']} reference samples: bias {ref['bias']:.4g} "
                 f"[{ref['bias_ci95'][0]:.3g}, {ref['bias_ci95'][1]:.3g}], drift {ref['drift_per_s'] * 3600:.4g}/h")
        for k, why in (fields.get("_omitted") or {}).items():
            if k != "drift_per_s":
                echo(f"  {k} not written: {why}")
        me = fields.get("_model_error")
        if me and me.get("structured"):
            shape = "; ".join(f"{r['run']}: {r['start']:+.3g} -> {r['end']:+.3g} (extreme {r['extreme']:+.3g} at "
                              f"{r['extreme_at_h']:.1f} h)" for r in me["per_run"])
            echo(f"  model error, not sensor error (smoothed over {me['window_s'] / 3600:.2g} h, RMS "
                 f"{me['rms']:.3g}): {shape}")


def heldout_rmse(problem, p, x0s, runs, sim, theta=None) -> dict[str, float]:
    """Noise-weighted RMS error per output over `runs` (open-loop from each run's start), the
    fitted sensor offsets of `theta` (if given) applied."""
    spec = problem.spec
    out = {}
    sq = {n: [] for n in problem.outputs}
    for run, x0 in zip(runs, x0s):
        Ysim = sim.run(run, p, x0)[0]
        off = np.zeros((run.t_s.size, len(problem.outputs))) if theta is None else np.broadcast_to(
            problem.offset_of(theta, run), (run.t_s.size, len(problem.outputs)))
        for n in problem.outputs:
            j = spec.index("outputs", n)
            b = off[:, problem.outputs.index(n)]
            d = (Ysim[:, j] + b - run.Y[:, j]) / problem.sigma[j]
            sq[n].append(d[np.isfinite(d)])
    for n, parts in sq.items():
        a = np.concatenate(parts) if parts else np.zeros(0)
        out[n] = float(np.sqrt(np.mean(a ** 2))) if a.size else math.nan
    return out
