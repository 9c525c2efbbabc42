"""Latency gap kernel: time-based delay lines with random delays and causal delivery.

One delay line serves one direction (observation: measured outputs -> image; actuation:
commands -> actuator gap). Its signals are grouped in channels; a channel draws one delay
d_k (s, simulated) per call k for all of its signals (a group read or written in one request).
Signals in no channel pass through undelayed.

Call k at time t_k pushes the current values with arrival time a_k = t_k + d_k into a ring of
M >= ceil(D / step_s) + 2 slots (a power of two, sized once; every d_k is clipped to [min_s, max_s] with
max_s <= max_delay_s, so no undelivered sample is ever overwritten), then outputs, per channel,
the newest *delivered* sample. Delivery rule (both keep the delivered sample index monotone, so a
sample is never delivered after a newer one):

    fifo   (default; TCP-like, no overtaking): e_k = max(a_k, e_{k-1}); sample j is delivered
           at time t when e_j <= t; a late sample holds back the newer ones queued behind it.
    latest (UDP-like, sequence-numbered): the output is the sample j with the largest j among
           those with a_j <= t; samples overtaken by a newer delivered one are never shown.

D is the largest delay any channel of the line can draw (`channel_bound_s`: max_delay_s, or
less where the distribution is bounded, e.g. a constant 120 s delay under max_delay_s = 300 s
needs 128 slots, not 512): less memory per instance (the vector env keeps N copies; issue 18),
though a step reads the same few ring lines either way. The delivered values do not depend on
M (any M >= ceil(D / step_s) + 2 gives the same outputs).

Times compare with a tolerance of 1e-6 * step_s (float round-off of t_k), so a constant delay
of m * step_s delivers, at t_k, exactly the value pushed at t_{k-m}. Before the first delivery
the output is the first pushed value (the signal is taken as constant before the first call).

Delay distributions (`dist` in config): constant, uniform, normal, lognormal, empirical samples
(uniform with replacement) and measured profiles (samples replayed in recorded order from a
random start, or drawn uniformly; histograms drawn bin ~ counts, uniform inside the bin; a
histogram has no order, so replay = "sequence" draws as "random"). Then + U(-jitter_s, jitter_s),
then clip to [min_s, max_s]. Each channel draws from its own SplitMix64 stream.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from hil.gaps.rng import normal, uniform

D_CONST, D_UNIFORM, D_NORMAL, D_LOGNORMAL, D_SAMPLES, D_SEQUENCE, D_HIST = range(7)
(L_DIST, L_P1, L_P2, L_JIT, L_MIN, L_MAX, L_FIFO, L_OFF, L_N, L_DMIN, L_EPS) = range(11)
N_PARAMS = 11
I_NPUSH, I_DELIV, I_SEQ = range(3)
N_ISTATE = 3
TIME_TOL = 1e-6  # times compare within TIME_TOL * step_s
MAX_SLOTS = 1 << 20


@njit(cache=True, nogil=True)
def draw_delay(L, c, I, R, prof):
    """One delay (s) of channel c: distribution, + jitter, clipped to [min_s, max_s]."""
    kind = L[c, L_DIST]
    if kind == D_CONST:
        d = L[c, L_P1]
    elif kind == D_UNIFORM:
        d = L[c, L_P1] + (L[c, L_P2] - L[c, L_P1]) * uniform(R, c)
    elif kind == D_NORMAL:
        d = L[c, L_P1] + L[c, L_P2] * normal(R, c)
    elif kind == D_LOGNORMAL:
        d = math.exp(L[c, L_P1] + L[c, L_P2] * normal(R, c))
    else:
        off = int(L[c, L_OFF])
        n = int(L[c, L_N])
        if kind == D_SAMPLES:
            d = prof[off + min(int(uniform(R, c) * n), n - 1)]
        elif kind == D_SEQUENCE:
            j = I[c, I_SEQ]
            d = prof[off + j]
            I[c, I_SEQ] = j + 1 if j + 1 < n else 0
        else:  # histogram: n cumulative fractions, then n + 1 edges
            u = uniform(R, c)
            lo, hi = 0, n - 1
            while lo < hi:  # first bin with cdf >= u
                mid = (lo + hi) // 2
                if prof[off + mid] >= u:
                    hi = mid
                else:
                    lo = mid + 1
            e0 = prof[off + n + lo]
            d = e0 + (prof[off + n + lo + 1] - e0) * uniform(R, c)
    if L[c, L_JIT] > 0.0:
        d += L[c, L_JIT] * (2.0 * uniform(R, c) - 1.0)
    return min(max(d, L[c, L_MIN]), L[c, L_MAX])


@njit(cache=True, nogil=True)
def delay_apply(t, x_in, x_out, L, I, R, T, V, sigch, prof):
    """Push x_in at time t (s) and write the delivered values into x_out (in place).

    L (n_ch, N_PARAMS) channel parameters; I (n_ch, N_ISTATE) int64 counters; R (n_ch,) uint64
    streams; T (n_ch, M, 2) ring of (push time, arrival/effective time); V (M, n_sig) ring of
    values; sigch (n_sig,) int64 channel of each signal or -1; prof: packed samples/histograms.
    """
    n_ch = L.shape[0]
    if n_ch == 0:
        for s in range(x_in.size):
            x_out[s] = x_in[s]
        return
    mask = V.shape[0] - 1  # ring length is a power of two
    k = I[0, I_NPUSH]
    slot = k & mask
    for s in range(x_in.size):
        V[slot, s] = x_in[s]
    for c in range(n_ch):
        a = t + draw_delay(L, c, I, R, prof)
        fifo = L[c, L_FIFO] == 1.0
        if fifo and k > 0:
            prev = T[c, (k - 1) & mask, 1]
            if a < prev:
                a = prev
        T[c, slot, 0] = t
        T[c, slot, 1] = a
        I[c, I_NPUSH] = k + 1
        tl = t + L[c, L_EPS]
        d = I[c, I_DELIV]
        if fifo:
            while d < k and T[c, (d + 1) & mask, 1] <= tl:
                d += 1
        else:  # newest arrived; samples pushed after tl - dmin cannot have arrived yet
            cut = tl - L[c, L_DMIN]
            j = d + 1
            while j <= k and T[c, j & mask, 0] <= cut:
                if T[c, j & mask, 1] <= tl:
                    d = j
                j += 1
        I[c, I_DELIV] = d
    for s in range(x_in.size):
        c = sigch[s]
        if c < 0:
            x_out[s] = x_in[s]
        else:
            d = I[c, I_DELIV]
            x_out[s] = V[d & mask, s] if d >= 0 else V[0, s]


def ring_slots(max_delay_s: float, step_s: float) -> int:
    """Ring length for delays up to max_delay_s at step_s: ceil(max_delay_s / step_s) + 2
    rounded up to a power of two (slot = index & (length - 1)); the limit is MAX_SLOTS."""
    need = int(math.ceil(max_delay_s / step_s - TIME_TOL)) + 2
    return 1 << (need - 1).bit_length()


def channel_bound_s(ch: dict, packed_high_s: float | None, max_delay_s: float,
                    randomized: bool = False) -> float:
    """The largest delay (s) channel `ch` (a LatencyChannel as a dict) can draw: every draw is
    min(max(dist + jitter, min_s), L_MAX) with L_MAX = min(max_s, max_delay_s) (draw_delay), so
    the bound is min(L_MAX, max(dist_max + jitter_s, min_s)) where the distribution is bounded
    (constant: value_s, uniform: high_s, empirical: its largest sample, profile: packed_high_s,
    its largest sample or last histogram edge) and L_MAX where it is not (normal, lognormal).
    randomized: some field of the channel is drawn per episode, so only the clip is a bound
    (L_MAX; max_delay_s when max_s itself is drawn)."""
    l_max = max_delay_s if ch["max_s"] is None else min(ch["max_s"], max_delay_s)
    if randomized:
        return l_max
    dist = ch["dist"]
    if dist == "constant":
        top = ch["value_s"]
    elif dist == "uniform":
        top = ch["high_s"]
    elif dist == "empirical":
        top = max(ch["samples_s"])
    elif dist == "profile" and packed_high_s is not None:
        top = packed_high_s
    else:
        return l_max
    return min(l_max, max(top + ch["jitter_s"], ch["min_s"]))


def channel_row(ch: dict, packed: tuple[int, int, int] | None, max_delay_s: float,
                step_s: float, row: np.ndarray) -> None:
    """Kernel parameters of one channel into `row` (N_PARAMS,).

    ch: a LatencyChannel as a dict (model_dump, possibly with randomized fields);
    packed: (kind, offset, n, low, [high]) of its samples/histogram in the packed profile array, or None;
    kind is D_SAMPLES, D_SEQUENCE or D_HIST. low bound of draws -> L_DMIN (used by 'latest').
    """
    row[:] = 0.0
    dist, jit = ch["dist"], ch["jitter_s"]
    if dist == "constant":
        row[L_DIST], row[L_P1] = D_CONST, ch["value_s"]
        low = ch["value_s"]
    elif dist == "uniform":
        row[L_DIST], row[L_P1], row[L_P2] = D_UNIFORM, ch["low_s"], ch["high_s"]
        low = ch["low_s"]
    elif dist == "normal":
        row[L_DIST], row[L_P1], row[L_P2] = D_NORMAL, ch["mean_s"], ch["std_s"]
        low = 0.0
    elif dist == "lognormal":
        row[L_DIST], row[L_P1], row[L_P2] = D_LOGNORMAL, math.log(ch["median_s"]), ch["sigma"]
        low = 0.0
    else:
        kind, off, n, low = packed[:4]
        row[L_DIST], row[L_OFF], row[L_N] = kind, off, n
    row[L_JIT] = jit
    row[L_MIN] = ch["min_s"]
    row[L_MAX] = max_delay_s if ch["max_s"] is None else min(ch["max_s"], max_delay_s)
    row[L_FIFO] = 1.0 if ch["order"] == "fifo" else 0.0
    row[L_DMIN] = min(max(low - jit, row[L_MIN]), row[L_MAX])
    row[L_EPS] = TIME_TOL * step_s


class DelayLine:
    """Delay channels of one direction (observation or actuation), allocated once.

    channels: list of (channel dict, signal indices, packed-profile tuple or None);
    prof: the packed profile array the tuples point into; bounds_s: the largest delay (s) each
    channel can draw (`channel_bound_s`), or None: max_delay_s for every channel. The ring
    holds ceil(max(bounds_s) / step_s) + 2 slots (a power of two); `set` refuses a channel
    whose delays could exceed that (`bound_s`).
    """

    def __init__(self, channels: list, n_sig: int, step_s: float, max_delay_s: float,
                 prof: np.ndarray | None = None, bounds_s: list[float] | None = None):
        n_ch = len(channels)
        self.step_s, self.max_delay_s = step_s, max_delay_s
        if bounds_s is not None and len(bounds_s) != n_ch:
            raise ValueError(f"bounds_s: {len(bounds_s)} bounds for {n_ch} channels")
        #: the largest delay (s) the ring holds
        self.bound_s = min(max(bounds_s), max_delay_s) if bounds_s else max_delay_s
        self.m = ring_slots(self.bound_s, step_s) if n_ch else 1
        if self.m > MAX_SLOTS:
            raise ValueError(f"max_delay_s = {max_delay_s} s at step {step_s} s needs {self.m} "
                             f"ring slots (limit {MAX_SLOTS})")
        self.L = np.zeros((n_ch, N_PARAMS))
        self.I = np.zeros((n_ch, N_ISTATE), dtype=np.int64)
        self.R = np.zeros(n_ch, dtype=np.uint64)
        self.T = np.zeros((n_ch, self.m, 2))
        self.V = np.zeros((self.m, n_sig))
        self.sigch = np.full(n_sig, -1, dtype=np.int64)
        self.prof = np.zeros(1) if prof is None or prof.size == 0 else prof
        self.packed = []
        for c, (ch, sigs, packed) in enumerate(channels):
            self.sigch[list(sigs)] = c
            self.packed.append(packed)
            self.set(c, ch)

    def set(self, c: int, ch: dict) -> None:
        """Channel c's parameters (a LatencyChannel dict). ValueError if its delays could exceed
        the ring's bound_s (a ring sized for shorter delays would overwrite undelivered samples)."""
        packed = self.packed[c]
        high = packed[4] if packed is not None and len(packed) > 4 else None
        b = channel_bound_s(ch, high, self.max_delay_s)
        if b > self.bound_s:
            raise ValueError(f"latency channel {c}: delays up to {b} s exceed the {self.bound_s} s "
                             f"its ring of {self.m} slots was sized for")
        channel_row(ch, packed, self.max_delay_s, self.step_s, self.L[c])

    @property
    def active(self) -> bool:
        return self.L.shape[0] > 0

    def reset(self, seed_streams_fn) -> None:
        """Empty the ring and restart the streams; sequence replays start at a random index."""
        self.I[:] = 0
        self.I[:, I_DELIV] = -1
        self.T[:] = 0.0
        self.V[:] = 0.0
        seed_streams_fn(self.R)
        for c in range(self.L.shape[0]):
            if self.L[c, L_DIST] == D_SEQUENCE:
                self.I[c, I_SEQ] = int(uniform(self.R, c) * self.L[c, L_N]) % int(self.L[c, L_N])

    def apply(self, t: float, x_in: np.ndarray, x_out: np.ndarray) -> None:
        delay_apply(t, x_in, x_out, self.L, self.I, self.R, self.T, self.V, self.sigch,
                    self.prof)
