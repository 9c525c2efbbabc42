"""Sparse LU in dense 2x2 blocks (one block per bus pair), fixed ordering and fill, static pivots.

Why: the power-flow Jacobian is Ybus expanded into 2x2 blocks (rows P_i, Q_i; columns Va_i, Vm_i),
and the two scalar rows of a bus have the same pattern. ``sparse_lu.py`` factors it scalar by
scalar: four index loads, four scattered updates and a zero test per block. Here the same
elimination (same bus order, same fill) runs on whole blocks: one index load per block and a 2x2
product in registers, which is what supernodal codes gain on wider supernodes. The pattern is the
filled bus graph of ``sparse_lu.minimum_degree_order`` (``block_structure(..., block=1)``): one
block per entry.

Storage: block CSR (``indptr``, ``indices`` ascending per block row, ``diag`` position of each
diagonal block); ``values`` float64 (nnzb, 4), a block row-major ``[a00, a01, a10, a11]``. After
factorization the strictly lower blocks hold L (unit block lower: L_rk = W_rk D_k^-1), the upper
blocks U, and ``dinv`` (nb, 4) the inverse of each diagonal block D_k. Row-wise block IKJ::

    for each block row r:                        (in place: row r holds A[r, :] until its turn)
        for k in row r, k < r, ascending:  L[r, k] = A[r, k] D_k^-1;  A[r, k+1:] -= L[r, k] U[k, k+1:]
        D_r = A[r, r]

The pattern is fixed, so where each update lands is computed once (``update_targets``: the
position in row r of every (r, j) that U[k, j] touches); the numeric factorization then runs
through that list without a scatter buffer or any search (the static-pattern refactorization of
KLU's ``klu_refactor`` / NICSLU, in blocks).

Pivots: each diagonal block is factored with diagonal pivots (p0 = D[0,0], p1 = D[1,1] -
D[1,0] D[0,1] / p0), the two scalar pivots ``sparse_lu.lu_factor`` meets in the same order;
a pivot at or below ``PIVOT_TOL`` times its scalar row's largest input entry is reported (-1),
as there.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from plants.grid.sparse_lu import PIVOT_TOL


@njit(cache=True)
def update_targets(indptr, indices, diag):
    """The elimination program of the pattern: for every strictly lower block p = (r, k), the
    positions in row r of the blocks (r, j) that the U blocks (k, j > k) of row k update, in U's order.

    Returns (tptr, tgt): the targets of block p are ``tgt[tptr[p]:tptr[p + 1]]``, updated by the U
    blocks ``diag[k] + 1, diag[k] + 2, ...``. Raises ValueError if the pattern is not closed under
    elimination (a target missing from row r: the structure is not a filled pattern).
    """
    nb = indptr.shape[0] - 1
    nnz = indptr[nb]
    tptr = np.zeros(nnz + 1, dtype=np.int64)
    for r in range(nb):
        for p in range(indptr[r], indptr[r + 1]):
            cnt = 0
            if p < diag[r]:
                k = indices[p]
                cnt = indptr[k + 1] - diag[k] - 1
            tptr[p + 1] = tptr[p] + cnt
    tgt = np.empty(tptr[nnz], dtype=np.int64)
    pos = np.full(nb, -1, dtype=np.int64)
    for r in range(nb):
        for p in range(indptr[r], indptr[r + 1]):
            pos[indices[p]] = p
        for p in range(indptr[r], diag[r]):
            k = indices[p]
            t = tptr[p]
            for q in range(diag[k] + 1, indptr[k + 1]):
                d = pos[indices[q]]
                if d < 0:
                    raise ValueError("block pattern is not closed under elimination (missing fill)")
                tgt[t] = d
                t += 1
        for p in range(indptr[r], indptr[r + 1]):
            pos[indices[p]] = -1
    return tptr, tgt


@njit(cache=True, nogil=True)
def block_lu_factor(indptr, indices, diag, tptr, tgt, values, dinv):
    """Factor in place (values: A on entry, L\\U on exit; dinv: D_k^-1), following the elimination
    program (tptr, tgt) of ``update_targets``: no scatter buffer, every update lands in row r.

    Row r is untouched until its turn, so its input values give the pivot test's row maxima.
    Returns 0, or -1 on a pivot below PIVOT_TOL times its scalar row's largest input entry (then
    the values are invalid)."""
    nb = indptr.shape[0] - 1
    for r in range(nb):
        lo, hi, d = indptr[r], indptr[r + 1], diag[r]
        max0 = 0.0
        max1 = 0.0
        for p in range(lo, hi):
            max0 = max(max0, abs(values[p, 0]), abs(values[p, 1]))
            max1 = max(max1, abs(values[p, 2]), abs(values[p, 3]))
        for p in range(lo, d):
            k = indices[p]
            w0, w1, w2, w3 = values[p, 0], values[p, 1], values[p, 2], values[p, 3]
            i0, i1, i2, i3 = dinv[k, 0], dinv[k, 1], dinv[k, 2], dinv[k, 3]
            l0 = w0 * i0 + w1 * i2
            l1 = w0 * i1 + w1 * i3
            l2 = w2 * i0 + w3 * i2
            l3 = w2 * i1 + w3 * i3
            values[p, 0] = l0
            values[p, 1] = l1
            values[p, 2] = l2
            values[p, 3] = l3
            q = diag[k] + 1
            for t in range(tptr[p], tptr[p + 1]):
                j = tgt[t]
                u0, u1, u2, u3 = values[q, 0], values[q, 1], values[q, 2], values[q, 3]
                values[j, 0] -= l0 * u0 + l1 * u2
                values[j, 1] -= l0 * u1 + l1 * u3
                values[j, 2] -= l2 * u0 + l3 * u2
                values[j, 3] -= l2 * u1 + l3 * u3
                q += 1
        a, b, c, e = values[d, 0], values[d, 1], values[d, 2], values[d, 3]
        if not (abs(a) > PIVOT_TOL * max0) or not np.isfinite(a):
            return -1
        p1 = e - c * b / a
        if not (abs(p1) > PIVOT_TOL * max1) or not np.isfinite(p1):
            return -1
        det = a * p1            # = a e - b c
        dinv[r, 0] = e / det
        dinv[r, 1] = -b / det
        dinv[r, 2] = -c / det
        dinv[r, 3] = a / det
    return 0


@njit(cache=True, nogil=True)
def block_lu_solve(indptr, indices, diag, values, dinv, x):
    """Solve (L U) x = b in place; x (2 nb) holds b on entry, scalar 2r + c is block r's component c."""
    nb = indptr.shape[0] - 1
    for r in range(nb):
        s0 = x[2 * r]
        s1 = x[2 * r + 1]
        for p in range(indptr[r], diag[r]):
            k = indices[p]
            y0 = x[2 * k]
            y1 = x[2 * k + 1]
            s0 -= values[p, 0] * y0 + values[p, 1] * y1
            s1 -= values[p, 2] * y0 + values[p, 3] * y1
        x[2 * r] = s0
        x[2 * r + 1] = s1
    for r in range(nb - 1, -1, -1):
        s0 = x[2 * r]
        s1 = x[2 * r + 1]
        for p in range(diag[r] + 1, indptr[r + 1]):
            j = indices[p]
            y0 = x[2 * j]
            y1 = x[2 * j + 1]
            s0 -= values[p, 0] * y0 + values[p, 1] * y1
            s1 -= values[p, 2] * y0 + values[p, 3] * y1
        x[2 * r] = dinv[r, 0] * s0 + dinv[r, 1] * s1
        x[2 * r + 1] = dinv[r, 2] * s0 + dinv[r, 3] * s1
