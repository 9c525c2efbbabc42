"""Sensor gap parameters fitted from residuals e = y_meas - y_sim (the calibrated model's
prediction), written as a [gaps.sensors.<output>] table (hil/gaps/config.py) so that the
fitted noise profile is what the loop injects.

Per output, over all runs (time t_s from each run's start, plant units):
    bias, drift_per_s   ordinary least squares e = bias + drift * t_s
    quant_step          the grid the measured values sit on (if >= 95 % of the distinct
                        values are integer multiples of the smallest gap between them)
    white + AR(1)       from the detrended residual's autocovariances g0, g1, g2 at the
                        median sample interval dt: phi = g2 / g1, AR variance g1 / phi,
                        white variance g0 - g1 / phi - q^2 / 12; colored_tau_s = -dt / ln(phi)
    sample_period_s     median interval between measurements, when it is longer than the log's
    dropout_*           gaps longer than 1.5 sample periods: rate per s and mean duration;
                        dropout_mode "bad" (the log shows them as missing values)
Model error that is not noise (an unmodelled effect) lands in bias/drift/AR: fit the noise
after the dynamics are calibrated, and read the residual model's verdict with it.
"""

from __future__ import annotations

import math

import numpy as np


def _quant_step(values: np.ndarray) -> float | None:
    u = np.unique(values[np.isfinite(values)])
    if u.size < 5:
        return None
    d = np.diff(u)
    q = float(np.min(d))
    if q <= 0:
        return None
    k = (u - u[0]) / q
    ok = np.abs(k - np.round(k)) < 0.02
    # a quantized sensor leaves most grid points between its extremes empty only if it is
    # coarse; a continuous one fills no grid: require the grid to hold >= 95 % of the values
    return q if ok.mean() >= 0.95 and u.size < 0.9 * np.isfinite(values).sum() else None


def _segments_autocov(parts: list[np.ndarray], lag: int) -> float:
    num, cnt = 0.0, 0
    for e in parts:
        if e.size > lag:
            num += float(e[:-lag] @ e[lag:]) if lag else float(e @ e)
            cnt += e.size - lag
    return num / cnt if cnt else math.nan


def fit_sensor_noise(runs, y_sim: list[np.ndarray], output_index: int) -> dict:
    """Sensor gap fields for one output from the runs and the model's outputs for each run
    (y_sim[r]: (n_r,) simulated output). Returns a dict of SensorGap fields plus `_stats`."""
    ts, es, vals = [], [], []
    dts = []
    gaps_s, total_s, n_meas = [], 0.0, 0
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
        total_s += run.duration_s
        n_meas += int(m.sum())
    if not ts:
        return {}
    t_all, e_all = np.concatenate(ts), np.concatenate(es)
    A = np.stack([np.ones_like(t_all), t_all], axis=1)
    (bias, drift), *_ = np.linalg.lstsq(A, e_all, rcond=None)
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
    q = _quant_step(np.concatenate(vals))
    # noise from the detrended residual, per run (autocovariances do not cross runs)
    parts = [e - (bias + drift * t) for e, t in zip(es, ts)]
    parts = [p - p.mean() for p in parts]
    g0, g1, g2 = (_segments_autocov(parts, k) for k in (0, 1, 2))
    qv = q * q / 12.0 if q else 0.0
    white_var, ar_var, tau = max(g0 - qv, 0.0), 0.0, None
    if g1 > 0 and g2 > 0 and g1 > 0.05 * g0:
        phi = min(g2 / g1, 0.999)
        if phi > 0.05:
            ar_var = min(g1 / phi, g0)
            white_var = max(g0 - ar_var - qv, 0.0)
            tau = -dt_meas / math.log(phi)
    out: dict = {"bias": float(bias), "drift_per_s": float(drift), "noise_std": math.sqrt(white_var)}
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
    out["_stats"] = {"n": n_meas, "residual_std": float(math.sqrt(g0)) if g0 == g0 else math.nan,
                     "dt_s": dt_meas}
    return out


def fit_noise_profiles(runs, sims, spec, outputs) -> dict[str, dict]:
    """{output: SensorGap fields} for the named outputs; sims[r] = (Ysim, Xsim) per run."""
    out = {}
    for name in outputs:
        j = spec.index("outputs", name)
        fields = fit_sensor_noise(runs, [s[0][:, j] for s in sims], j)
        if fields:
            out[name] = fields
    return out
