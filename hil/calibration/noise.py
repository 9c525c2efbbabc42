"""Sensor gap parameters, written as a [gaps.sensors.<output>] table (hil/gaps/config.py)
so that the fitted noise profile is what the loop injects, and the model error that is NOT
sensor error, reported apart (never written into [gaps.sensors]).

Per output, over all runs (time t_s from each run's start, plant units):
    bias, drift_per_s   only against an independent reference of the output (a column with
                        role = "reference", e.g. lab assays): least squares of
                        y_sensor(t_ref) - y_ref = bias + drift * t_s weighted for a relative
                        assay error (1 / reference level), model-free. Without a
                        reference they are undetermined (reported, not written): a residual
                        against the model cannot tell a sensor offset from a model defect.
    noise_std           from the high-frequency content: robust scatter of the residual's
                        first differences (MAD / sqrt 2), which a slow model error hardly moves
    model error         the residual smoothed over `window_s` (default: 1/10 of the median
                        run, at least 10 samples): when its RMS exceeds 3 noise standard errors
                        of the smoothing it is structured, reported with its shape (start / end
                        / extreme of the smoothed misfit, trend per hour, per run)
    colored_std/_tau_s  AR(1) of the high-passed residual (residual minus its smoothed part),
                        only when the lag-1/lag-2 autocovariances give a time constant well
                        below the smoothing window (tau < window / 3); otherwise omitted, with
                        the reason
    quant_step          the grid the measured values sit on, only when coarser than the log's
                        print precision (10x the finest decimal the values are written with)
    sample_period_s     median interval between measurements, when it is longer than the log's
    dropout_*           gaps longer than 1.5 sample periods: rate per s and mean duration;
                        dropout_mode "bad" (the log shows them as missing values)
"""

from __future__ import annotations

import math

import numpy as np


def _print_precision(values: np.ndarray) -> float:
    """The finest decimal the values are written with (1e-d for the smallest d <= 9 that
    writes them all exactly, to float rounding)."""
    v = values[np.isfinite(values)][:5000]
    if v.size == 0:
        return 0.0
    for d in range(10):
        x = v * 10.0 ** d
        if np.all(np.abs(x - np.round(x)) < 1e-6 + 1e-12 * np.abs(x)):
            return 10.0 ** -d
    return 1e-10


def _quant_step(values: np.ndarray, noise_std: float) -> tuple[float | None, str]:
    """(grid step, "") when the values sit on a grid that matters against the noise (step >=
    0.1 noise_std: a finer grid adds < 0.1 % of the variance and cannot be told from the log's
    print rounding), else (None, reason)."""
    u = np.unique(values[np.isfinite(values)])
    if u.size < 5:
        return None, "fewer than 5 distinct values"
    d = np.diff(u)
    q = float(np.min(d))
    if q <= 0:
        return None, "no grid"
    k = (u - u[0]) / q
    ok = np.abs(k - np.round(k)) < 0.02
    # a quantized sensor leaves most grid points between its extremes empty only if it is
    # coarse; a continuous one fills no grid: require the grid to hold >= 95 % of the values
    if not (ok.mean() >= 0.95 and u.size < 0.9 * np.isfinite(values).sum()):
        return None, "the values sit on no common grid"
    prec = _print_precision(u)
    if math.isfinite(noise_std) and q < 0.1 * noise_std:
        why = (f"the grid {q:.3g} is below 10 % of the noise ({noise_std:.3g}): not identifiable, and "
               f"no sensor resolution")
        if q <= 1.01 * prec:
            why += f" (it is the log's print precision {prec:.3g})"
        return None, why
    return q, ""


def _segments_autocov(parts: list[np.ndarray], lag: int) -> float:
    num, cnt = 0.0, 0
    for e in parts:
        if e.size > lag:
            num += float(e[:-lag] @ e[lag:]) if lag else float(e @ e)
            cnt += e.size - lag
    return num / cnt if cnt else math.nan


def _smooth(e: np.ndarray, w: int) -> np.ndarray:
    """Centred moving average over w samples (shorter windows at the ends)."""
    c = np.concatenate([[0.0], np.cumsum(e)])
    n = e.size
    i = np.arange(n)
    a = np.clip(i - w // 2, 0, n)
    b = np.clip(i + w - w // 2, 0, n)
    return (c[b] - c[a]) / (b - a)


def _highpass_acf(phi: float, w: int, k: int) -> float:
    """Autocovariance at lag k of e - MA_w(e) for a unit-variance AR(1) with lag-1 correlation
    phi (interior samples, the centred window of `_smooth`)."""
    o = np.arange(-(w // 2), w - w // 2)
    d = np.arange(-(w - 1), w)
    rho = lambda lag: phi ** np.abs(lag)  # noqa: E731
    return float(rho(k) - np.mean(rho(k + o)) - np.mean(rho(k - o))
                 + np.sum((w - np.abs(d)) * rho(k + d)) / (w * w))


def _ar1_through_highpass(g0: float, g1: float, g2: float, w: int):
    """(phi, AR variance) of an AR(1) + white noise whose high-passed autocovariances are
    g0, g1, g2 (lags >= 1 carry no white noise): phi solves h(2)/h(1) = g2/g1."""
    from scipy.optimize import brentq

    target = g2 / g1
    f = lambda ph: _highpass_acf(ph, w, 2) / _highpass_acf(ph, w, 1) - target  # noqa: E731
    lo, hi = 0.05, 0.995
    if f(lo) * f(hi) > 0:
        return None
    phi = brentq(f, lo, hi, xtol=1e-6)
    return phi, g1 / _highpass_acf(phi, w, 1)


def reference_bias(runs, output: str, output_index: int) -> dict | None:
    """Sensor bias and drift of one output against its independent reference columns
    (run.refs[output]): OLS of y_sensor - y_ref on [1, t_s], with 95 % intervals; None when
    no run has >= 3 reference samples paired with a sensor sample."""
    ts, es, rs = [], [], []
    for run in runs:
        ref = run.refs.get(output) if getattr(run, "refs", None) else None
        if ref is None:
            continue
        y = run.Y[:, output_index]
        m = np.isfinite(ref) & np.isfinite(y)
        ts.append(run.t_s[m])
        es.append(y[m] - ref[m])
        rs.append(ref[m])
    if not ts or sum(t.size for t in ts) < 3:
        return None
    t, e, ref = np.concatenate(ts), np.concatenate(es), np.concatenate(rs)
    A = np.stack([np.ones_like(t), t], axis=1)
    # lab assays have a relative error (a CV): weight by 1 / reference level, floored at a
    # tenth of the median level so that near-zero references do not dominate
    lvl = np.maximum(np.abs(ref), 0.1 * max(float(np.median(np.abs(ref))), 1e-12))
    wt = 1.0 / lvl
    coef, *_ = np.linalg.lstsq(A * wt[:, None], e * wt, rcond=None)
    r = (e - A @ coef) * wt
    dof = max(t.size - 2, 1)
    s2 = float(r @ r) / dof
    cov = s2 * np.linalg.pinv((A * wt[:, None]).T @ (A * wt[:, None]))
    sd = np.sqrt(np.clip(np.diag(cov), 0, None))
    return {"bias": float(coef[0]), "drift_per_s": float(coef[1]),
            "bias_ci95": [float(coef[0] - 1.96 * sd[0]), float(coef[0] + 1.96 * sd[0])],
            "drift_per_s_ci95": [float(coef[1] - 1.96 * sd[1]), float(coef[1] + 1.96 * sd[1])],
            "n_reference": int(t.size)}


def correct_with_references(runs, spec, outputs=None) -> dict[str, dict]:
    """Fit each output's sensor bias/drift against its references and remove it from the
    measured values in place (before the dynamics are fitted). Returns {output: reference_bias}."""
    out = {}
    for name in spec.names("outputs") if outputs is None else outputs:
        j = spec.index("outputs", name)
        rb = reference_bias(runs, name, j)
        if rb is None:
            continue
        for run in runs:
            run.Y[:, j] = run.Y[:, j] - (rb["bias"] + rb["drift_per_s"] * run.t_s)
        out[name] = rb
    return out


def fit_sensor_noise(runs, y_sim: list[np.ndarray], output_index: int, output: str = "",
                     ref_bias: dict | None = None, window_s: float | None = None) -> dict:
    """Sensor gap fields for one output from the runs and the model's outputs for each run
    (y_sim[r]: (n_r,) simulated output). Returns a dict of SensorGap fields plus `_stats`,
    `_omitted` (field -> reason) and `_model_error` (the structured misfit, not sensor error)."""
    ts, es, vals, names = [], [], [], []
    dts = []
    total_s, n_meas = 0.0, 0
    for run, ys in zip(runs, y_sim):
        y = run.Y[:, output_index]
        m = np.isfinite(y) & np.isfinite(ys)
        if m.sum() < 3:
            continue
        t = run.t_s[m]
        ts.append(t)
        es.append(y[m] - ys[m])
        vals.append(y[m])
        dts.append(np.diff(t))
        names.append(run.name)
        total_s += run.duration_s
        n_meas += int(m.sum())
    if not ts:
        return {}
    omitted: dict[str, str] = {}
    dt_meas = float(np.median(np.concatenate(dts)))
    base_dt = float(np.median(np.concatenate([np.diff(r.t_s) for r in runs])))
    period = dt_meas if dt_meas > 1.5 * base_dt else 0.0
    # dropouts: gaps between measurements longer than 1.5 sample intervals
    n_drop, drop_s = 0, 0.0
    for t in ts:
        g = np.diff(t)
        long = g > 1.5 * dt_meas
        n_drop += int(long.sum())
        drop_s += float((g[long] - dt_meas).sum())
    # high-frequency noise: first differences (robust), corrected for quantization
    d = np.concatenate([np.diff(e) for e in es])
    sd_diff = float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2.0)) if d.size >= 3 else math.nan
    q, q_why = _quant_step(np.concatenate(vals), sd_diff)
    if q is None:
        omitted["quant_step"] = q_why
    qv = q * q / 12.0 if q else 0.0
    # structured misfit: the residual smoothed over the window
    med_dur = float(np.median([t[-1] - t[0] for t in ts]))
    if window_s is None:
        window_s = max(med_dur / 10.0, 10 * dt_meas)
    w = max(3, int(round(window_s / dt_meas)))
    smooth = [_smooth(e, w) for e in es]
    hp = [e - s_ for e, s_ in zip(es, smooth)]
    slow_rms = float(np.sqrt(np.mean(np.concatenate(smooth) ** 2)))
    g0 = _segments_autocov([h - h.mean() for h in hp], 0)
    white_var = max((sd_diff ** 2 if math.isfinite(sd_diff) else g0) - qv, 0.0)
    ar_var, tau = 0.0, None
    g1, g2 = (_segments_autocov([h - h.mean() for h in hp], k) for k in (1, 2))
    if g1 > 0 and g2 > 0 and g1 > 0.05 * g0:
        sol = _ar1_through_highpass(g0, g1, g2, w)
        phi = sol[0] if sol else g2 / g1
        tau_c = -dt_meas / math.log(phi) if 0 < phi < 1 else math.inf
        if sol and 0.05 < phi < 0.99 and tau_c < window_s / 3.0:
            tau = tau_c
            ar_var = min(sol[1], g0 / _highpass_acf(phi, w, 0))
            white_var = max((g0 - ar_var * _highpass_acf(phi, w, 0)) / (1.0 - 1.0 / w) - qv, 0.0)
        else:
            omitted["colored_tau_s"] = (f"correlation time {tau_c:.3g} s (lag-1 correlation {phi:.3g}) is not "
                                        f"separable from the slow model error (smoothing window {window_s:.3g} s)")
    out: dict = {"noise_std": math.sqrt(white_var)}
    if ref_bias is not None:
        out["bias"] = ref_bias["bias"]
        out["drift_per_s"] = ref_bias["drift_per_s"]
    else:
        omitted["bias"] = omitted["drift_per_s"] = (
            "undetermined: no independent reference (role = \"reference\") for this output; a residual "
            "against the model cannot tell a sensor offset from a model defect")
    if tau is not None and ar_var > 0:
        out["colored_std"] = math.sqrt(ar_var)
        out["colored_tau_s"] = float(tau)
    if q:
        out["quant_step"] = float(q)
    if period:
        out["sample_period_s"] = period
    if n_drop and total_s > 0:
        out["dropout_rate_per_s"] = n_drop / total_s
        out["dropout_duration_s"] = drop_s / n_drop
        out["dropout_mode"] = "bad"
    # model error: the smoothed misfit is significant when far above what white noise of
    # that size leaves after averaging w samples
    # what the fitted noise alone leaves after the smoothing: white / w + AR * (1 - kept by the high-pass)
    if tau is not None:
        phi_ = math.exp(-dt_meas / tau)
        left = white_var / w + ar_var * max(1.0 - _highpass_acf(phi_, w, 0), 0.0)
    else:
        left = white_var / w
    noise_se = math.sqrt(left)
    shape = []
    for name, t, s_ in zip(names, ts, smooth):
        k = int(np.argmax(np.abs(s_)))
        A = np.stack([np.ones_like(t), t / 3600.0], axis=1)
        (c0, c1), *_ = np.linalg.lstsq(A, s_, rcond=None)
        shape.append({"run": name, "start": float(s_[0]), "end": float(s_[-1]), "extreme": float(s_[k]),
                      "extreme_at_h": float(t[k] / 3600.0), "trend_per_h": float(c1)})
    structured = slow_rms > 3.0 * noise_se
    out["_model_error"] = {"structured": bool(structured), "rms": slow_rms, "window_s": float(window_s),
                           "per_run": shape}
    out["_omitted"] = omitted
    out["_stats"] = {"n": n_meas, "residual_std": float(math.sqrt(g0)) if g0 == g0 else math.nan,
                     "dt_s": dt_meas, "slow_rms": slow_rms}
    if ref_bias is not None:
        out["_reference"] = ref_bias
    return out


def fit_noise_profiles(runs, sims, spec, outputs, ref_biases: dict | None = None) -> dict[str, dict]:
    """{output: SensorGap fields (+ _model_error, _omitted)} for the named outputs;
    sims[r] = (Ysim, Xsim) per run; ref_biases: {output: reference_bias} already removed
    from the runs (written as the sensor's bias/drift)."""
    out = {}
    for name in outputs:
        j = spec.index("outputs", name)
        fields = fit_sensor_noise(runs, [s[0][:, j] for s in sims], j, name,
                                  (ref_biases or {}).get(name))
        if fields:
            out[name] = fields
    return out


def reference_offsets(problem, pooled, outputs) -> tuple[list, dict[str, dict]]:
    """Sensor bias/drift of each output that has an independent reference: the offsets
    fitted with the parameters (--bias/--drift) when the fit had the references, else the
    model-free reference_bias. Returns (runs with these offsets removed from the measured
    values (copies), {output: reference_bias-like dict}). Outputs without a reference get
    nothing: their bias and drift stay undetermined."""
    import dataclasses

    spec = problem.spec
    out = {}
    for name in outputs:
        j = spec.index("outputs", name)
        n_ref = sum(int(np.isfinite(r.refs[name]).sum()) for r in problem.runs if name in r.refs)
        if n_ref == 0:
            continue
        if name in problem.ref_outputs and (name in pooled.biases or name in pooled.drifts):
            b, d_h = pooled.biases.get(name, 0.0), pooled.drifts.get(name, 0.0)
            bci = pooled.sensor_ci95.get(f"bias.{name}", [b, b])
            dci = pooled.sensor_ci95.get(f"drift.{name}", [d_h, d_h])
            out[name] = {"bias": b, "drift_per_s": d_h / 3600.0, "bias_ci95": list(bci),
                         "drift_per_s_ci95": [x / 3600.0 for x in dci], "n_reference": n_ref,
                         "method": "fitted with the parameters against the references"}
        else:
            rb = reference_bias(problem.runs, name, j)
            if rb is not None:
                out[name] = {**rb, "method": "sensor minus reference at the reference samples (model-free)"}
    runs = []
    for run in problem.runs:
        Y = run.Y.copy()
        for name, rb in out.items():
            j = spec.index("outputs", name)
            Y[:, j] -= rb["bias"] + rb["drift_per_s"] * (run.t_s + run.t_origin_s)
        runs.append(dataclasses.replace(run, Y=Y))
    return runs, out
