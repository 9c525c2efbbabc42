"""Lateness histogram: log-linear buckets (HdrHistogram style), constant memory.

Values are integer nanoseconds >= 0. Values below 128 ns have their own bucket; above, each
power of two is split into 64 buckets, so a reported percentile is within 1/64 (1.6 %) of
the true sample. Memory is fixed (about 2 300 buckets up to 2^40 ns), so a 24 h run at
1 kHz costs the same as a 10 s one. The maximum and the count are exact.
"""

from __future__ import annotations

import numpy as np
from numba import njit

SUB_BITS = 6
SUB = 1 << SUB_BITS  # 64 buckets per octave
N_BUCKETS = 2 * SUB + 40 * SUB  # up to 2^46 ns (~19 h): beyond is clamped to the last bucket


@njit(cache=True, nogil=True)
def bucket_of(v: int) -> int:
    """Bucket index of a value in ns (negative values count as 0)."""
    if v < 2 * SUB:
        return v if v > 0 else 0
    msb = 0
    x = v
    while x > 1:
        x >>= 1
        msb += 1
    shift = msb - SUB_BITS
    sub = v >> shift  # in [SUB, 2*SUB)
    idx = 2 * SUB + (shift - 1) * SUB + (sub - SUB)
    return idx if idx < N_BUCKETS else N_BUCKETS - 1


@njit(cache=True, nogil=True)
def _record(counts, v):
    counts[bucket_of(v)] += 1


def bucket_low(idx: np.ndarray) -> np.ndarray:
    """Lowest value (ns) of each bucket index."""
    idx = np.asarray(idx, dtype=np.int64)
    out = idx.astype(np.float64)
    big = idx >= 2 * SUB
    shift = (idx[big] - 2 * SUB) // SUB + 1
    sub = (idx[big] - 2 * SUB) % SUB + SUB
    out[big] = sub.astype(np.float64) * np.power(2.0, shift)
    return out


def bucket_mid(idx: np.ndarray) -> np.ndarray:
    """Representative value (ns) of each bucket: the middle of its range."""
    lo = bucket_low(idx)
    hi = bucket_low(np.asarray(idx) + 1)
    return np.where(np.asarray(idx) < 2 * SUB, lo, 0.5 * (lo + hi))


class LatencyHistogram:
    """Counts of lateness samples in ns, with exact count and max."""

    def __init__(self) -> None:
        self.counts = np.zeros(N_BUCKETS, dtype=np.int64)
        _record(self.counts, 0)  # load the kernel now, not at the first timed step
        self.counts[0] = 0
        self.n = 0
        self.max_ns = 0
        self.sum_ns = 0

    def record(self, v_ns: int) -> None:
        _record(self.counts, v_ns)
        self.n += 1
        self.sum_ns += v_ns
        if v_ns > self.max_ns:
            self.max_ns = v_ns

    def merge(self, other: "LatencyHistogram") -> None:
        self.counts += other.counts
        self.n += other.n
        self.sum_ns += other.sum_ns
        self.max_ns = max(self.max_ns, other.max_ns)

    def percentile_ns(self, q: float) -> float:
        """q in [0, 100]; the bucket midpoint holding the q-th percentile sample (0 if empty)."""
        if self.n == 0:
            return 0.0
        rank = max(1, int(np.ceil(q / 100.0 * self.n)))
        idx = int(np.searchsorted(np.cumsum(self.counts), rank))
        return float(min(bucket_mid(np.array([idx]))[0], self.max_ns))

    def count_above(self, threshold_ns: int) -> int:
        """Samples in buckets that lie entirely above threshold_ns (exact at bucket edges)."""
        return int(self.counts[bucket_of(threshold_ns) + 1 :].sum())

    def summary_us(self) -> dict[str, float]:
        """p50, p99, p99.9 (key p999), max and mean in microseconds."""
        to_us = 1e-3
        return {
            "p50": round(self.percentile_ns(50) * to_us, 3),
            "p99": round(self.percentile_ns(99) * to_us, 3),
            "p999": round(self.percentile_ns(99.9) * to_us, 3),
            "max": round(self.max_ns * to_us, 3),
            "mean": round((self.sum_ns / self.n if self.n else 0.0) * to_us, 3),
            "n": self.n,
        }
