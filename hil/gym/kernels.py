"""The vector env's step: every instance's clip, actuation gaps, plant, sensor gaps in one
Numba `prange` call (all cores, no GIL, no allocation).

Per instance i (row i of every array), exactly the single loop's sequence (hil/runtime.py):

    t = K[i] * step_s                                   # simulated s at the step's start
    clip_inputs(Ucmd[i] -> Uclip[i])                    # physical bounds; non-finite holds Uapp[i]
    _actuate(Aact[i], t, Uclip[i], Uapp[i])             # actuation delay + actuator gap
    Tp[i] = plant_step(Tp[i], X[i], Uapp[i], P[i], dt, n_sub, W[i])   # plant time unit
    status[i] = -1 non-finite state | number of states outside [xlo - xtol, xhi + xtol]
    plant_outputs(X[i], Uapp[i], P[i], Y[i])            # true outputs
    _sense(Asen[i], t + step_s, Y[i], Ymeas[i])         # sensor gap + observation delay
    K[i] += 1

Aact / Asen rows are copies of a GapPipeline's arena buffers (hil/gaps/arena.py: the header
holds offsets relative to the row, so a row is a complete, independent pipeline state).
Rows with run[i] == False are left untouched (instances being reset). `batch_step` spreads the
rows over the cores; `batch_step_serial` (same row kernel) runs them on the calling thread.
"""

from __future__ import annotations

import math

from numba import njit, prange

from hil.gaps.pipeline import _actuate, _sense
from hil.loop_kernels import clip_inputs


@njit(cache=True, nogil=True)
def _state_status(x, lo, hi, tol):
    n_out = 0
    for j in range(x.size):
        v = x[j]
        if not math.isfinite(v):
            return -1
        if v < lo[j] - tol[j] or v > hi[j] + tol[j]:
            n_out += 1
    return n_out


@njit(cache=True, nogil=True)
def row_step(plant_step, plant_outputs, i, K, Tp, X, P, Ucmd, Uclip, Uapp, Y, Ymeas, Aact, Asen, W, counts, status,
             u_lo, u_hi, x_lo, x_hi, x_tol, step_s, dt, n_sub):
    """One loop step of instance i (see the module docstring)."""
    t = K[i] * step_s
    clip_inputs(Ucmd[i], u_lo, u_hi, Uapp[i], Uclip[i], counts[i])
    _actuate(Aact[i], t, Uclip[i], Uapp[i])
    Tp[i] = plant_step(Tp[i], X[i], Uapp[i], P[i], dt, n_sub, W[i])
    status[i] = _state_status(X[i], x_lo, x_hi, x_tol)
    plant_outputs(X[i], Uapp[i], P[i], Y[i])
    _sense(Asen[i], t + step_s, Y[i], Ymeas[i])
    K[i] += 1


@njit(cache=True, nogil=True, parallel=True)
def batch_step(plant_step, plant_outputs, run, K, Tp, X, P, Ucmd, Uclip, Uapp, Y, Ymeas, Aact, Asen, W,
               counts, status, u_lo, u_hi, x_lo, x_hi, x_tol, step_s, dt, n_sub):
    """One loop step of every instance with run[i], spread over the cores (prange)."""
    for i in prange(X.shape[0]):
        if run[i]:
            row_step(plant_step, plant_outputs, i, K, Tp, X, P, Ucmd, Uclip, Uapp, Y, Ymeas, Aact, Asen, W,
                     counts, status, u_lo, u_hi, x_lo, x_hi, x_tol, step_s, dt, n_sub)


@njit(cache=True, nogil=True)
def batch_step_serial(plant_step, plant_outputs, run, K, Tp, X, P, Ucmd, Uclip, Uapp, Y, Ymeas, Aact, Asen, W,
                      counts, status, u_lo, u_hi, x_lo, x_hi, x_tol, step_s, dt, n_sub):
    """batch_step on the calling thread: for a few instances, where a parallel region's
    barrier costs more than the work (on a loaded machine, up to milliseconds)."""
    for i in range(X.shape[0]):
        if run[i]:
            row_step(plant_step, plant_outputs, i, K, Tp, X, P, Ucmd, Uclip, Uapp, Y, Ymeas, Aact, Asen, W,
                     counts, status, u_lo, u_hi, x_lo, x_hi, x_tol, step_s, dt, n_sub)
