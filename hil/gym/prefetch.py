"""Software prefetch of the next instances' gap arenas, for the vector env's batch step.

Why: one instance's gap arenas (hil/gaps/arena.py: parameters, states, streams and the delay
rings of the actuation and observation lines) are ~75 kB for bioreactor_gym (an actuation ring
of 512 slots: its normal coolant delay is bounded only by max_delay_s = 300 s; an observation
ring of 128 slots for its 120 s glucose delay), of which one step reads ~7 kB at a few places:
the front (header, channel parameters, counters, streams), the tail (sigch, profiles,
actuator/sensor parameters and states), and a few ring lines (the slot written this step, the
next slot to deliver per channel). Over 1024 instances that is ~7 MB scattered over 75 MB, so
most of those lines come from L3 or DRAM, one dependent miss after another. While instance i is stepped, these prefetches ask for the
lines instance i + 2 d (front and tail, whose addresses are fixed) and instance i + d (ring
lines, whose addresses depend on the counters fetched d instances earlier) will read.

The fused step now reads the gaps in the shared-parameter layout (hil/gaps/compact.py): the
parameter tables are shared, so only the instance's record is prefetched, its hot part (states,
streams, drawn rows: ~42 lines for bioreactor_gym) as one range (CompactGaps.plans) and its
rings as below; `arena_plan` describes the loop's own arenas (the same ring description).

A prefetch is a hint (x86 `prefetcht0`, no fault on any address): it changes no result, only
when the data arrive. The plans are built from the template arena's header, which every row of
the vector env shares (rows are copies of one GapPipeline's buffers, the layout fixed at build).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from hil.gaps.arena import HDR
from hil.gaps.latency import I_DELIV, I_NPUSH, N_ISTATE

LINE_ITEMS = 8  # float64 items per 64-byte cache line


@intrinsic
def prefetch(typingctx, arr, offset):
    """Prefetch (for reading, keep in all cache levels) the line holding arr's item `offset`."""
    sig = types.void(arr, offset)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        p = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [p, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def prefetch_ranges(row, ranges):
    """Every line of row[lo:hi] for each (lo, hi) in ranges (int64 (n, 2), item offsets)."""
    for r in range(ranges.shape[0]):
        lo, hi = ranges[r, 0], ranges[r, 1]
        for o in range(lo, hi, LINE_ITEMS):
            prefetch(row, o)
        if hi > lo:
            prefetch(row, hi - 1)


@njit(cache=True, nogil=True, inline="always")
def prefetch_ring(row, ring):
    """The ring lines the next step of a delay line reads and writes. ring = (offset of I,
    n_ch, offset of T, slots M, offset of V, n_sig): T (n_ch, M, 2), V (M, n_sig)."""
    n_ch = ring[1]
    if n_ch == 0:
        return
    off_i, off_t, m, off_v, n_sig = ring[0], ring[2], ring[3], ring[4], ring[5]
    counters = row.view(np.int64)
    mask = m - 1
    slot = counters[off_i + I_NPUSH] & mask
    prefetch(row, off_v + slot * n_sig)
    prefetch(row, off_v + slot * n_sig + n_sig - 1)
    for c in range(n_ch):
        nxt = (counters[off_i + N_ISTATE * c + I_DELIV] + 1) & mask
        prefetch(row, off_t + 2 * (c * m + slot))
        prefetch(row, off_t + 2 * (c * m + nxt))
        prefetch(row, off_v + nxt * n_sig)
        prefetch(row, off_v + nxt * n_sig + n_sig - 1)


def arena_plan(buf: np.ndarray, n_slots: int, slot_i: int, slot_t: int, slot_v: int) -> tuple[np.ndarray, np.ndarray]:
    """(ranges, ring) of an arena buffer (hil/gaps/arena.py) whose delay line has its counters,
    times and values in slots slot_i, slot_t, slot_v: ranges = the header and every slot but
    T and V (item offsets, (n, 2) int64); ring = the description `prefetch_ring` reads."""
    head = buf.view(np.int64)
    rows = [(0, HDR * n_slots)]
    for k in range(n_slots):
        off, d0, d1, d2 = (int(v) for v in head[HDR * k: HDR * k + 4])
        if k not in (slot_t, slot_v):
            rows.append((off, off + d0 * d1 * d2))
    ranges = np.array(rows, dtype=np.int64)
    off_i, n_ch = int(head[HDR * slot_i]), int(head[HDR * slot_i + 1])
    off_t, m = int(head[HDR * slot_t]), int(head[HDR * slot_t + 2])
    off_v, n_sig = int(head[HDR * slot_v]), int(head[HDR * slot_v + 2])
    if n_ch and (m & (m - 1) or head[HDR * slot_t + 1] != n_ch or head[HDR * slot_i + 2] != N_ISTATE):
        raise ValueError("arena_plan: the delay line's slots do not have the layout of hil/gaps/latency.py")
    return ranges, np.array([off_i, n_ch, off_t, m, off_v, n_sig], dtype=np.int64)


@intrinsic
def item_ptr(typingctx, arr, offset):
    """Pointer to arr's item `offset` (counted from its first item, C order), typed as arr's dtype."""
    sig = types.CPointer(arr.dtype)(arr, offset)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.gep(ary.data, [args[1]])

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def row_of(a, i):
    """Row i of a C-contiguous 2-D array as a 1-D view without a reference to its owner (no
    atomic reference counting per view: valid while `a` is, as inside one kernel call)."""
    return carray(item_ptr(a, i * a.shape[1]), (a.shape[1],))


@njit(cache=True, nogil=True, inline="always")
def block_of(a, i):
    """Item i of a C-contiguous 3-D array as a 2-D view without a reference (see row_of)."""
    return carray(item_ptr(a, i * a.shape[1] * a.shape[2]), (a.shape[1], a.shape[2]))


@njit(cache=True, nogil=True, inline="always")
def items_of(a, i, n):
    """a[i:i + n] of a 1-D array as a view without a reference (see row_of)."""
    return carray(item_ptr(a, i), (n,))


@njit(cache=True, nogil=True, inline="always")
def prefetch_row_at(a, i):
    """Every line of row i of a C-contiguous 2-D array (no view taken): some twenty per-instance
    arrays are read row by row, more streams than the hardware prefetcher follows."""
    n = a.shape[1]
    base = i * n
    for o in range(0, n, LINE_ITEMS):
        prefetch(a, base + o)
    if n:
        prefetch(a, base + n - 1)
