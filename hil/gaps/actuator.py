"""Actuator gap kernel: commanded (delivered) input -> applied input, per input signal.

Per input i and call k at time t_k (s, simulated; dt = t_k - t_{k-1}, step_s at the first call),
the command c passes, in this order:

    gain/offset   c = gain * c + offset
    quantize      as the sensor ADC (dac_bits over dac_range, step (hi-lo)/2**bits, codes
                  0..2**bits-1) or a plain quant_step; round half up
    deadband      h_k = c if |c - h_{k-1}| > deadband else h_{k-1}   (update deadband)
    breakaway     c = rest if |c - rest| < breakaway                  (does not move)
    saturation    c = clip(c, sat_lo, sat_hi)
    rate limit    r_k = r_{k-1} + clip(c_{k-1} - r_{k-1}, -R dt, +R dt)
    first-order   l_k = l_{k-1} + (1 - exp(-dt / tau)) * (r_{k-1} - l_{k-1})
    lag
    backlash      b_k = clip(b_{k-1}, l_k - w/2, l_k + w/2)            (play of total width w)
    bounds        applied = clip(b_k, low, high)                       (the input's physical bounds)

Rate limit and lag are the exact sampled solutions of the continuous elements (y' = clip(K(c-y),
+-R) with K -> inf, and tau y' = c - y) driven by the command held since the previous call
(zero-order hold): the value applied over [t_k, t_{k+1}) is their state at t_k, e.g. a unit
step of the command at t_0 gives l(t_0 + k dt) = 1 - exp(-k dt / tau) exactly. Their input
c_{k-1} is one call old by construction (a physical actuator cannot move within zero time).

At the first call after reset every dynamic element starts at rest at its input (no start-up
transient): h, r, l and b are initialized from the first command.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from hil.gaps.config import ActuatorGap
from hil.gaps.sensor import quantize, set_quantizer

(A_ON, A_GAIN, A_OFFSET, A_Q_MODE, A_Q_LO, A_Q_STEP, A_Q_NMAX, A_DEADBAND, A_BREAK, A_REST,
 A_SAT_LO, A_SAT_HI, A_RATE, A_TAU, A_BACKLASH, A_LOW, A_HIGH, A_FIRST_DT) = range(18)
N_PARAMS = 18
S_STARTED, S_LAST_T, S_DB, S_RATE_Y, S_RATE_IN, S_LAG_Y, S_LAG_IN, S_BL, S_DT, S_ALPHA = range(10)
N_STATE = 10  # S_DT, S_ALPHA: lag coefficient 1 - exp(-dt/tau) cached for interval S_DT


@njit(cache=True, nogil=True)
def actuator_apply(t, u_cmd, u_app, P, S):
    """Applied inputs into u_app (in place) at time t (s). P (n, N_PARAMS), S (n, N_STATE)."""
    for i in range(u_cmd.size):
        if P[i, A_ON] == 0.0:
            u_app[i] = u_cmd[i]
            continue
        c = P[i, A_GAIN] * u_cmd[i] + P[i, A_OFFSET]
        c = quantize(c, P[i, A_Q_MODE], P[i, A_Q_LO], P[i, A_Q_STEP], P[i, A_Q_NMAX])
        first = S[i, S_STARTED] == 0.0
        if first:
            dt = P[i, A_FIRST_DT]
            S[i, S_DB] = c
        else:
            dt = t - S[i, S_LAST_T]
            if abs(c - S[i, S_DB]) > P[i, A_DEADBAND]:
                S[i, S_DB] = c
        S[i, S_LAST_T] = t
        c = S[i, S_DB]
        if abs(c - P[i, A_REST]) < P[i, A_BREAK]:
            c = P[i, A_REST]
        c = min(max(c, P[i, A_SAT_LO]), P[i, A_SAT_HI])
        if P[i, A_RATE] > 0.0:
            if first:
                S[i, S_RATE_Y] = c
            else:
                lim = P[i, A_RATE] * dt
                S[i, S_RATE_Y] += min(max(S[i, S_RATE_IN] - S[i, S_RATE_Y], -lim), lim)
            S[i, S_RATE_IN] = c
            c = S[i, S_RATE_Y]
        if P[i, A_TAU] > 0.0:
            if first:
                S[i, S_LAG_Y] = c
            else:
                if dt != S[i, S_DT]:
                    S[i, S_DT] = dt
                    S[i, S_ALPHA] = -math.expm1(-dt / P[i, A_TAU])
                S[i, S_LAG_Y] += S[i, S_ALPHA] * (S[i, S_LAG_IN] - S[i, S_LAG_Y])
            S[i, S_LAG_IN] = c
            c = S[i, S_LAG_Y]
        if P[i, A_BACKLASH] > 0.0:
            h = 0.5 * P[i, A_BACKLASH]
            if first:
                S[i, S_BL] = c
            else:
                S[i, S_BL] = min(max(S[i, S_BL], c - h), c + h)
            c = S[i, S_BL]
        S[i, S_STARTED] = 1.0
        u_app[i] = min(max(c, P[i, A_LOW]), P[i, A_HIGH])


def default_rest(low: float, high: float) -> float:
    """Breakaway rest position when not given: 0 if inside the bounds, else the low bound."""
    return 0.0 if low <= 0.0 <= high else low


def actuator_row(gap: ActuatorGap | dict | None, low: float, high: float, step_s: float,
                 row: np.ndarray) -> None:
    """Write the kernel parameters of one input into `row` (N_PARAMS,). gap None -> off."""
    row[:] = 0.0
    if gap is None:
        return
    g = gap if isinstance(gap, dict) else gap.model_dump()
    row[A_ON] = 1.0
    row[A_GAIN] = g["gain"]
    row[A_OFFSET] = g["offset"]
    set_quantizer(row, A_Q_MODE, g["dac_bits"], g["dac_range"], g["quant_step"], low, high)
    row[A_DEADBAND] = g["deadband"]
    row[A_BREAK] = g["breakaway"]
    rest = g["breakaway_rest"]
    row[A_REST] = default_rest(low, high) if rest is None else rest
    sat = g["saturation"]
    row[A_SAT_LO], row[A_SAT_HI] = (-math.inf, math.inf) if sat is None else sat
    row[A_RATE] = 0.0 if g["rate_limit_per_s"] is None else g["rate_limit_per_s"]
    row[A_TAU] = g["lag_tau_s"]
    row[A_BACKLASH] = g["backlash"]
    row[A_LOW], row[A_HIGH] = low, high
    row[A_FIRST_DT] = step_s


class ActuatorBank:
    """Actuator gaps of all inputs of a plant: parameters and state, allocated once."""

    def __init__(self, gaps: list, lows, highs, step_s: float):
        n = len(gaps)
        self.P = np.zeros((n, N_PARAMS))
        self.S = np.zeros((n, N_STATE))
        self.lows, self.highs, self.step_s = list(lows), list(highs), step_s
        for i, g in enumerate(gaps):
            self.set(i, g)

    def set(self, i: int, gap) -> None:
        actuator_row(gap, self.lows[i], self.highs[i], self.step_s, self.P[i])
        self.S[i, S_DT] = math.nan  # cached lag coefficient is stale

    @property
    def active(self) -> bool:
        return bool(self.P[:, A_ON].any())

    def reset(self) -> None:
        self.S[:] = 0.0
        self.S[:, S_DT] = math.nan

    def apply(self, t: float, u_cmd: np.ndarray, u_app: np.ndarray) -> None:
        actuator_apply(t, u_cmd, u_app, self.P, self.S)
