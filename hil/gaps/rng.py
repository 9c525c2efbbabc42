"""Counter-free SplitMix64 streams for the gap kernels: explicit state, bit-for-bit reproducible.

Every random stream of a gap (one per signal and feature, one per latency channel) is a single
uint64 word in a preallocated array; drawing advances it in place. SplitMix64 (Steele, Lea,
Flood 2014; the seeding generator of xoshiro) has period 2**64 and passes BigCrush; streams are
started from a hash of (seed, episode, stream id), so two streams overlap only if their start
points fall within a run length of each other on the 2**64 cycle (probability ~ n_draws / 2**64).

Kernels draw with `uniform(state, i)` in (0, 1] and `normal(state, i)` (ziggurat: exact, no
transcendental function for ~99 % of draws; a draw consumes a variable number of outputs,
deterministic for the stream).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_ONE = np.uint64(1)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53
_MASK = (1 << 64) - 1


@njit(cache=True, nogil=True)
def next_u64(state, i):
    """Advance stream i of `state` (uint64 array) and return its next 64-bit output."""
    z = state[i] + _GOLDEN
    state[i] = z
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(cache=True, nogil=True)
def uniform(state, i):
    """Uniform float64 in (0, 1] with 53 random bits (never 0, so log() is safe)."""
    return (float(next_u64(state, i) >> _S11) + 1.0) * _INV53


def _ziggurat_tables(n: int = 128, r: float = 3.442619855899, v: float = 9.91256303526217e-3):
    """Layer edges X (n + 1) and ratios X[i+1]/X[i] (n) of Doornik's ZIGNOR ziggurat."""
    x = np.zeros(n + 1)
    f = math.exp(-0.5 * r * r)
    x[0] = v / f
    x[1] = r
    for i in range(2, n):
        x[i] = math.sqrt(-2.0 * math.log(v / x[i - 1] + f))
        f = math.exp(-0.5 * x[i] * x[i])
    return x, x[1:] / x[:-1]


_ZX, _ZR = _ziggurat_tables()
_ZIG_R = 3.442619855899
_LOW7 = np.uint64(0x7F)


@njit(cache=True, nogil=True)
def normal(state, i):
    """Standard normal by the ziggurat method (Marsaglia & Tsang 2000, in Doornik's 2005
    ZIGNOR form, 128 layers): exact, ~99 % of draws take one 64-bit output (53 bits for the
    abscissa, the 7 low bits for the layer) and no transcendental function."""
    while True:
        z = next_u64(state, i)
        u = 2.0 * (float(z >> _S11) * _INV53) - 1.0
        j = int(z & _LOW7)
        if abs(u) < _ZR[j]:
            return u * _ZX[j]
        if j == 0:  # the tail beyond R (Marsaglia 1964)
            while True:
                x = math.log(uniform(state, i)) / _ZIG_R
                y = math.log(uniform(state, i))
                if -2.0 * y >= x * x:
                    return x - _ZIG_R if u < 0.0 else _ZIG_R - x
        x = u * _ZX[j]
        f0 = math.exp(-0.5 * (_ZX[j] * _ZX[j] - x * x))
        f1 = math.exp(-0.5 * (_ZX[j + 1] * _ZX[j + 1] - x * x))
        if f1 + uniform(state, i) * (f0 - f1) < 1.0:
            return x


def _mix64(z: int) -> int:
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK
    return z ^ (z >> 31)


def stream_seed(seed: int, episode: int, stream: int) -> int:
    """Start state of one stream: a SplitMix hash chain of (seed, episode, stream id)."""
    z = _mix64((int(seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK)
    z = _mix64((z + (int(episode) + 1) * 0xD1B54A32D192ED03) & _MASK)
    return _mix64((z + (int(stream) + 1) * 0x8CB92BA72F3D8DD7) & _MASK)


def seed_streams(state: np.ndarray, seed: int, episode: int, base: int) -> None:
    """Fill `state` (uint64, any shape) in place with streams base, base+1, ... for the episode."""
    flat = state.reshape(-1)
    # stream_seed for every k at once: the first two links of the chain do not depend on the
    # stream; the last one in uint64 arithmetic (wraps mod 2^64, as the & _MASK above). A
    # 2869-bus grid seeds ~2e5 streams: one Python hash chain each took seconds at start-up.
    z = _mix64((int(seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK)
    z = _mix64((z + (int(episode) + 1) * 0xD1B54A32D192ED03) & _MASK)
    k = np.arange(int(base) + 1, int(base) + 1 + flat.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        w = np.uint64(z) + k * np.uint64(0x8CB92BA72F3D8DD7)
        w = (w ^ (w >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        w = (w ^ (w >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        flat[:] = w ^ (w >> np.uint64(31))
