"""Sensor gap kernel: true output -> measured output, per output signal.

Per output i, at each sample instant t (s, simulated) the measured value is built as

    rw      += random_walk_std * sqrt(dt) * N(0,1)         (rw = 0 at the first sample)
    ar       = a * ar + colored_std * sqrt(1 - a**2) * N(0,1),  a = exp(-dt / colored_tau_s)
               (ar drawn from N(0, colored_std**2) at the first sample: stationary from t0)
    v        = gain * y_true + bias + drift_per_s * t + rw + noise_std * N(0,1) + ar
    spike:     with probability 1 - exp(-spike_rate_per_s * dt): v += +/- spike_size (50/50)
    quantize:  code = clip(floor((v - lo) / q + 0.5), 0, 2**bits - 1); v = lo + code * q
               with q = (hi - lo) / 2**bits (ADC over [lo, hi]); or v = q * floor(v / q + 0.5)
               for a plain quant_step q (no clipping). Round half up; NaN stays NaN.
    dropout:   not in one: with probability 1 - exp(-dropout_rate_per_s * dt) one starts and
               lasts dropout_duration_s; while in one v = last value (hold) or dropout_value
               (stuck / bad). Noise, drift and walk states keep evolving during a dropout.

where dt is the time since the previous sample (max(sample_period_s, step_s) for the first).
Sample instants are t0 + k * sample_period_s (t0 = first call after reset, k = 0, 1, ...; a
call at or after an instant, within 1e-9 * period, takes the sample); between them the last
value is held. sample_period_s = 0 samples at every call.

Each feature of each output draws from its own SplitMix64 stream (white, colored, walk,
dropout, spike), so switching one feature on or off
leaves the others' sequences unchanged.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from hil.gaps.config import SECONDS_PER_DAY, SensorGap
from hil.gaps.rng import normal, uniform

# parameter columns
(P_ON, P_GAIN, P_BIAS, P_DRIFT, P_RW, P_WHITE, P_CSTD, P_CTAU, P_SPIKE_RATE, P_SPIKE_SIZE,
 P_Q_MODE, P_Q_LO, P_Q_STEP, P_Q_NMAX, P_TS, P_DROP_RATE, P_DROP_DUR, P_DROP_HOLD, P_DROP_VALUE,
 P_FIRST_DT) = range(20)
N_PARAMS = 20
# state columns (X_DT..X_PDROP: coefficients cached for the last sample interval X_DT,
# NaN = stale)
(X_STARTED, X_T0, X_NSAMP, X_LAST_T, X_RW, X_AR, X_HELD, X_DROP_END, X_DT, X_A, X_B, X_SQDT,
 X_PSPIKE, X_PDROP) = range(14)
N_STATE = 14
# stream columns
R_WHITE, R_COLORED, R_WALK, R_DROP, R_SPIKE = range(5)
N_STREAMS = 5


@njit(cache=True, nogil=True)
def quantize(v, mode, lo, step, nmax):
    """mode 0: off; 1: ADC codes 0..nmax over lo + code*step; 2: plain multiples of step."""
    if mode == 1.0:
        c = math.floor((v - lo) / step + 0.5)
        if c < 0.0:
            c = 0.0
        elif c > nmax:
            c = nmax
        return lo + c * step
    if mode == 2.0:
        return step * math.floor(v / step + 0.5)
    return v


@njit(cache=True, nogil=True)
def sensor_apply(t, y_true, y_meas, P, X, R):
    """Measured outputs into y_meas (in place) at time t (s). P (n, N_PARAMS) parameters,
    X (n, N_STATE) state, R (n * N_STREAMS,) uint64 streams (row-major). Allocates nothing."""
    for i in range(y_true.size):
        r0 = i * N_STREAMS
        if P[i, P_ON] == 0.0:
            y_meas[i] = y_true[i]
            continue
        ts = P[i, P_TS]
        first = X[i, X_STARTED] == 0.0
        if first:
            X[i, X_STARTED] = 1.0
            X[i, X_T0] = t
            X[i, X_NSAMP] = 0.0
            dt = P[i, P_FIRST_DT]
        else:
            if ts > 0.0 and t < X[i, X_T0] + X[i, X_NSAMP] * ts - 1e-9 * ts:
                y_meas[i] = X[i, X_HELD]
                continue
            dt = t - X[i, X_LAST_T]
        if ts > 0.0:  # next instant strictly after t
            X[i, X_NSAMP] = math.floor((t - X[i, X_T0]) / ts + 1e-9) + 1.0
        X[i, X_LAST_T] = t
        if dt != X[i, X_DT]:  # coefficients of this sample interval (constant in lockstep)
            a = math.exp(-dt / P[i, P_CTAU])
            X[i, X_DT] = dt
            X[i, X_A] = a
            X[i, X_B] = math.sqrt(1.0 - a * a)
            X[i, X_SQDT] = math.sqrt(dt)
            X[i, X_PSPIKE] = -math.expm1(-P[i, P_SPIKE_RATE] * dt)
            X[i, X_PDROP] = -math.expm1(-P[i, P_DROP_RATE] * dt)
        if P[i, P_RW] > 0.0 and not first:
            X[i, X_RW] += P[i, P_RW] * X[i, X_SQDT] * normal(R, r0 + R_WALK)
        if P[i, P_CSTD] > 0.0:
            e = normal(R, r0 + R_COLORED)
            if first:
                X[i, X_AR] = P[i, P_CSTD] * e
            else:
                X[i, X_AR] = X[i, X_A] * X[i, X_AR] + P[i, P_CSTD] * X[i, X_B] * e
        v = P[i, P_GAIN] * y_true[i] + P[i, P_BIAS] + P[i, P_DRIFT] * t + X[i, X_RW] + X[i, X_AR]
        if P[i, P_WHITE] > 0.0:
            v += P[i, P_WHITE] * normal(R, r0 + R_WHITE)
        if P[i, P_SPIKE_RATE] > 0.0:
            if uniform(R, r0 + R_SPIKE) <= X[i, X_PSPIKE]:
                if uniform(R, r0 + R_SPIKE) <= 0.5:
                    v -= P[i, P_SPIKE_SIZE]
                else:
                    v += P[i, P_SPIKE_SIZE]
        v = quantize(v, P[i, P_Q_MODE], P[i, P_Q_LO], P[i, P_Q_STEP], P[i, P_Q_NMAX])
        if P[i, P_DROP_RATE] > 0.0:
            out = t < X[i, X_DROP_END]
            if not out and uniform(R, r0 + R_DROP) <= X[i, X_PDROP]:
                X[i, X_DROP_END] = t + P[i, P_DROP_DUR]
                out = True
            if out:
                if P[i, P_DROP_HOLD] == 0.0:
                    v = P[i, P_DROP_VALUE]
                elif not first:  # hold the last value (at the first sample: nothing older)
                    v = X[i, X_HELD]
        X[i, X_HELD] = v
        y_meas[i] = v


def sensor_row(gap: SensorGap | dict | None, low: float, high: float, step_s: float,
               row: np.ndarray) -> None:
    """Write the kernel parameters of one output into `row` (N_PARAMS,). gap None -> off.
    low/high: the output's physical bounds (default ADC range)."""
    row[:] = 0.0
    if gap is None:
        return
    g = gap if isinstance(gap, dict) else gap.model_dump()
    row[P_ON] = 1.0
    row[P_GAIN] = g["gain"]
    row[P_BIAS] = g["bias"]
    row[P_DRIFT] = g["drift_per_s"] + g["drift_per_day"] / SECONDS_PER_DAY
    row[P_RW] = g["random_walk_std"]
    row[P_WHITE] = g["noise_std"]
    row[P_CSTD] = g["colored_std"]
    row[P_CTAU] = g["colored_tau_s"]
    row[P_SPIKE_RATE] = g["spike_rate_per_s"]
    row[P_SPIKE_SIZE] = g["spike_size"]
    set_quantizer(row, P_Q_MODE, g["adc_bits"], g["adc_range"], g["quant_step"], low, high)
    row[P_TS] = g["sample_period_s"]
    row[P_DROP_RATE] = g["dropout_rate_per_s"] if g["dropout_duration_s"] > 0 else 0.0
    row[P_DROP_DUR] = g["dropout_duration_s"]
    row[P_DROP_HOLD] = 1.0 if g["dropout_mode"] == "hold" else 0.0
    row[P_DROP_VALUE] = g["dropout_value"]
    row[P_FIRST_DT] = max(g["sample_period_s"], step_s)


def set_quantizer(row, col, bits, rng, step, low, high) -> None:
    """Columns col..col+3 = (mode, lo, step, nmax) for ADC bits over a range or a plain step."""
    if bits is not None:
        lo, hi = rng if rng is not None else (low, high)
        n = float(2 ** int(bits))
        row[col: col + 4] = (1.0, lo, (hi - lo) / n, n - 1.0)
    elif step is not None:
        row[col: col + 4] = (2.0, 0.0, step, 0.0)
    else:
        row[col: col + 4] = (0.0, 0.0, 0.0, 0.0)


class SensorBank:
    """Sensor gaps of all outputs of a plant: parameters, state and streams, allocated once."""

    def __init__(self, gaps: list, lows, highs, step_s: float):
        n = len(gaps)
        self.P = np.zeros((n, N_PARAMS))
        self.X = np.zeros((n, N_STATE))
        self.R = np.zeros((n, N_STREAMS), dtype=np.uint64)
        self.lows, self.highs, self.step_s = list(lows), list(highs), step_s
        for i, g in enumerate(gaps):
            self.set(i, g)

    def set(self, i: int, gap) -> None:
        sensor_row(gap, self.lows[i], self.highs[i], self.step_s, self.P[i])
        self.X[i, X_DT] = math.nan  # cached coefficients are stale

    @property
    def active(self) -> bool:
        return bool(self.P[:, P_ON].any())

    def reset(self, seed_streams_fn) -> None:
        self.X[:] = 0.0
        self.X[:, X_DT] = math.nan
        seed_streams_fn(self.R)

    def apply(self, t: float, y_true: np.ndarray, y_meas: np.ndarray) -> None:
        sensor_apply(t, y_true, y_meas, self.P, self.X, self.R.reshape(-1))
