"""Sparse LU with a fixed ordering and fill pattern, computed once per network structure.

Why this approach: the power-flow Jacobian has the structure of Ybus expanded into 2x2 blocks
per bus (rows P_i, Q_i; columns Va_i, Vm_i). Its pattern is structurally symmetric and, because
``ybus.py`` keeps every branch in the pattern, it never changes during a run. So the ordering
(minimum degree on the bus graph) and the symbolic factorization (the filled pattern of L+U)
are computed once in Python at load time; each Newton iteration then only refills values and
runs a numeric factorization without any search or allocation.

Pivoting is static (diagonal pivots in the chosen order), which is the KLU/NICSLU practice for
power-flow Jacobians: each 2x2 bus block pairs P_i with Va_i and Q_i with Vm_i, whose entries
(dP_i/dVa_i ~ B_ii |V|^2, dQ_i/dVm_i ~ -B_ii |V|) dominate their rows. A pivot smaller than
``PIVOT_TOL`` times its row's largest entry is reported (return value -1) instead of producing
Inf/NaN; the Newton solver then treats the system as singular (not converged).

Storage: the filled pattern in CSR (``indptr``, ``indices`` sorted per row, ``diag`` position of
each diagonal); L (unit lower, strictly below the diagonal) and U (diagonal and above) share one
``values`` array. Numeric factorization is the row-wise IKJ (Doolittle) variant::

    for each row r:  w = A[r, :]
        for k in row r, k < r, ascending:  w[k] /= U[k, k];  w[k+1:] -= w[k] * U[k, k+1:]
        LU[r, :] = w
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

PIVOT_TOL = 1e-13


def minimum_degree_order(n: int, neighbours: list[set[int]]) -> tuple[np.ndarray, list[set[int]]]:
    """Minimum-degree elimination order of a symmetric graph, and its filled adjacency.

    Ties are broken by the lowest node index, so the order is deterministic. Returns (order,
    filled) where ``filled[v]`` are the neighbours of v in the elimination (chordal) graph.
    """
    adj = [set(s) - {v} for v, s in enumerate(neighbours)]
    filled = [set(s) for s in adj]
    alive = np.ones(n, dtype=bool)
    degree = np.array([len(s) for s in adj], dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    for step in range(n):
        cand = np.flatnonzero(alive)
        v = int(cand[np.argmin(degree[cand])])
        order[step] = v
        alive[v] = False
        nb = adj[v]
        for a in nb:
            adj[a].discard(v)
            new = nb - adj[a] - {a}
            if new:
                adj[a] |= new
                filled[a] |= new
            degree[a] = len(adj[a])
        for a in nb:
            filled[v].add(a)
        adj[v] = set()
    return order, filled


@dataclass
class LUStructure:
    """Fixed pattern of L+U for an n x n matrix in the elimination order (see module doc)."""

    n: int
    indptr: np.ndarray   # int64 (n + 1)
    indices: np.ndarray  # int64 (nnz), ascending per row
    diag: np.ndarray     # int64 (n): position of (r, r)

    @property
    def nnz(self) -> int:
        return len(self.indices)

    def position(self, row: int, col: int) -> int:
        lo, hi = self.indptr[row], self.indptr[row + 1]
        k = lo + int(np.searchsorted(self.indices[lo:hi], col))
        if k >= hi or self.indices[k] != col:
            raise KeyError((row, col))
        return k


def block_structure(n_nodes: int, filled: list[set[int]], order: np.ndarray, block: int) -> tuple[LUStructure, np.ndarray]:
    """LU structure of a matrix of ``block`` x ``block`` node blocks eliminated in ``order``.

    Returns (structure, rank) with ``rank[node]`` the node's position in the order; the scalar
    row/column of (node, component c) is ``block * rank[node] + c``. The filled node graph is
    symmetric, so the block pattern is closed under IKJ elimination (no further fill).
    """
    rank = np.empty(n_nodes, dtype=np.int64)
    rank[order] = np.arange(n_nodes)
    n = block * n_nodes
    indptr = np.zeros(n + 1, dtype=np.int64)
    cols: list[int] = []
    for q in range(n_nodes):
        v = int(order[q])
        ranks = sorted([rank[a] for a in filled[v]] + [q])
        row_cols = [block * r + c for r in ranks for c in range(block)]
        for c in range(block):
            cols.extend(row_cols)
            indptr[block * q + c + 1] = len(cols)
    indices = np.asarray(cols, dtype=np.int64)
    diag = np.empty(n, dtype=np.int64)
    for r in range(n):
        lo, hi = indptr[r], indptr[r + 1]
        diag[r] = lo + int(np.searchsorted(indices[lo:hi], r))
    return LUStructure(n, indptr, indices, diag), rank


@njit(cache=True, nogil=True)
def lu_factor(indptr, indices, diag, values, work):
    """Factor in place (values: A on entry, L\\U on exit). ``work``: float64 (n) of zeros, left zeroed.

    Returns 0, or -1 if a pivot is below PIVOT_TOL times its row's largest entry (values then
    invalid, work re-zeroed)."""
    n = indptr.shape[0] - 1
    for r in range(n):
        lo, hi, d = indptr[r], indptr[r + 1], diag[r]
        rowmax = 0.0
        for p in range(lo, hi):
            v = values[p]
            work[indices[p]] = v
            if abs(v) > rowmax:
                rowmax = abs(v)
        for p in range(lo, d):
            k = indices[p]
            lk = work[k] / values[diag[k]]
            work[k] = lk
            if lk != 0.0:
                for q in range(diag[k] + 1, indptr[k + 1]):
                    work[indices[q]] -= lk * values[q]
        for p in range(lo, hi):
            c = indices[p]
            values[p] = work[c]
            work[c] = 0.0
        piv = values[d]
        if not (abs(piv) > PIVOT_TOL * rowmax) or not np.isfinite(piv):
            return -1
    return 0


@njit(cache=True, nogil=True)
def lu_solve(indptr, indices, diag, values, x):
    """Solve (L U) x = b in place (x holds b on entry)."""
    n = indptr.shape[0] - 1
    for r in range(n):
        s = x[r]
        for p in range(indptr[r], diag[r]):
            s -= values[p] * x[indices[p]]
        x[r] = s
    for r in range(n - 1, -1, -1):
        s = x[r]
        for p in range(diag[r] + 1, indptr[r + 1]):
            s -= values[p] * x[indices[p]]
        x[r] = s / values[diag[r]]
