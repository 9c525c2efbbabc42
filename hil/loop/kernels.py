"""Allocation-free Numba kernels of the loop's per-step bookkeeping.

Each replaces numpy expressions that made small temporaries every step (fancy-index
copies, boolean masks, `!=` arrays): the loop passes preallocated arrays and int64
counters and gets plain ints back. Pure-Python equivalents are in the docstrings;
tests/hil/test_loop_kernels.py checks each kernel against them.
"""

from __future__ import annotations

import math

from numba import njit


@njit(cache=True, nogil=True)
def take_into(dst, src, idx):
    """dst[idx] = src[idx] without a temporary (`idx` int array)."""
    for j in range(idx.size):
        i = idx[j]
        dst[i] = src[i]


@njit(cache=True, nogil=True)
def clip_inputs(u_cmd, lo, hi, u_prev, out, counts):
    """Commands to physical bounds: out = clip(u_cmd, lo, hi); a non-finite command holds
    u_prev (the previously applied value). counts[0] += clipped, counts[1] += non-finite.

    Python: out = np.clip(u_cmd, lo, hi); bad = ~np.isfinite(u_cmd); out[bad] = u_prev[bad];
    counts += [(out != u_cmd).sum() - bad.sum(), bad.sum()]
    """
    for i in range(u_cmd.size):
        v = u_cmd[i]
        if not math.isfinite(v):
            out[i] = u_prev[i]
            counts[1] += 1
        elif v < lo[i]:
            out[i] = lo[i]
            counts[0] += 1
        elif v > hi[i]:
            out[i] = hi[i]
            counts[0] += 1
        else:
            out[i] = v


@njit(cache=True, nogil=True)
def check_state(x, lo, hi, tol, steps_out):
    """-1 if any state is NaN/inf; else the number of states outside [lo - tol, hi + tol]
    (each such state's steps_out[i] += 1). tol: per-state slack, same units as x."""
    n_out = 0
    for i in range(x.size):
        v = x[i]
        if not math.isfinite(v):
            return -1
        if v < lo[i] - tol[i] or v > hi[i] + tol[i]:
            steps_out[i] += 1
            n_out += 1
    return n_out
