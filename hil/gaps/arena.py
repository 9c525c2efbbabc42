"""One contiguous buffer for all of a kernel's arrays, so a step is one cheap call.

A Numba call pays ~40-50 ns per array argument to type-check and unbox it; the gap kernels
would need a dozen. `Arena` packs every array (float64, int64, uint64: all 8-byte items) into
one float64 buffer B; the Python-side objects keep views into it (same memory), and the kernel
rebuilds typed views of each slot with `header` and `f1/f2/f3/i1/i2/u1`.

Header (int64 view of B): slot k occupies H[4k : 4k+4] = (offset in B, d0, d1, d2).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.core.extending import intrinsic

HDR = 4


class Arena:
    def __init__(self):
        self._items: list[np.ndarray] = []

    def put(self, arr: np.ndarray) -> int:
        """Register an array (float64, int64 or uint64, up to 3-d); returns its slot."""
        if arr.dtype not in (np.float64, np.int64, np.uint64) or arr.ndim > 3:
            raise TypeError(f"cannot pack {arr.dtype} array of ndim {arr.ndim}")
        self._items.append(arr)
        return len(self._items) - 1

    def pack(self):
        """(B, views): the buffer, and one view per slot holding the array's data."""
        offsets, size = [], HDR * len(self._items)
        for a in self._items:
            offsets.append(size)
            size += a.size
        B = np.zeros(max(size, 1))
        H = B.view(np.int64)
        views = []
        for k, (a, o) in enumerate(zip(self._items, offsets)):
            shape = a.shape + (1,) * (3 - a.ndim)
            H[HDR * k: HDR * k + 4] = (o, *shape)
            v = B.view(a.dtype)[o: o + a.size].reshape(a.shape)
            v[...] = a
            views.append(v)
        return B, views


def _pointer(nbtype):
    """intrinsic ptr(arr, offset): arr's data pointer + offset items, as a pointer to nbtype
    (a bitcast: every arena item is 8 bytes). No reference counting, no shape checks."""

    @intrinsic
    def ptr(typingctx, arr, offset):
        sig = types.CPointer(nbtype)(arr, offset)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            p = builder.gep(ary.data, [args[1]])
            return builder.bitcast(p, context.get_value_type(types.CPointer(nbtype)))

        return sig, codegen

    return ptr


ptr_f64 = _pointer(types.float64)
ptr_i64 = _pointer(types.int64)
ptr_u64 = _pointer(types.uint64)

# Views of slot k of buffer B with header H = header(B). carray over a raw pointer costs
# ~1 ns where slicing + reshape costs ~17 ns per view; they are valid while B is alive (the
# kernel's argument).


@njit(cache=True, nogil=True, inline="always")
def header(B):
    return carray(ptr_i64(B, 0), (B.size,))


@njit(cache=True, nogil=True, inline="always")
def f1(B, H, k):
    return carray(ptr_f64(B, H[HDR * k]), (H[HDR * k + 1],))


@njit(cache=True, nogil=True, inline="always")
def f2(B, H, k):
    return carray(ptr_f64(B, H[HDR * k]), (H[HDR * k + 1], H[HDR * k + 2]))


@njit(cache=True, nogil=True, inline="always")
def f3(B, H, k):
    return carray(ptr_f64(B, H[HDR * k]), (H[HDR * k + 1], H[HDR * k + 2], H[HDR * k + 3]))


@njit(cache=True, nogil=True, inline="always")
def i1(B, H, k):
    return carray(ptr_i64(B, H[HDR * k]), (H[HDR * k + 1],))


@njit(cache=True, nogil=True, inline="always")
def i2(B, H, k):
    return carray(ptr_i64(B, H[HDR * k]), (H[HDR * k + 1], H[HDR * k + 2]))


@njit(cache=True, nogil=True, inline="always")
def u1(B, H, k):
    """uint64 view of slot k, flattened (d0 * d1 items)."""
    return carray(ptr_u64(B, H[HDR * k]), (H[HDR * k + 1] * H[HDR * k + 2],))
