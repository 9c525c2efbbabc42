"""AC Newton-Raphson power flow in polar coordinates, Numba, fixed sparse structure.

Unknowns and equations are per bus: (Va_i, Vm_i) and (P_i, Q_i). A bus flag says which of its
two unknowns are free: PQ bus both, PV bus Va only, slack and dead buses none. A fixed unknown
keeps an identity row and a zero column in the Jacobian, so the matrix size and pattern never
change when a bus switches type (PV -> PQ on a Q limit, a new slack for an island, a dead island):
the ordering and symbolic LU of ``sparse_lu.py`` are computed once per Ybus pattern.

Equations (MATPOWER's ``newtonpf``; S, Sbus in pu)::

    I = Ybus V,  S = V conj(I),  F = [Re(S - Sbus) at free Va;  Im(S - Sbus) at free Vm]
    dS/dVa = j diag(V) conj(diag(I) - Ybus diag(V))
    dS/dVm = diag(V) conj(Ybus diag(V/|V|)) + conj(diag(I)) diag(V/|V|)
    J = [Re dS/dVa  Re dS/dVm;  Im dS/dVa  Im dS/dVm]   (rows/cols of free unknowns)
    [dVa; dVm] = -J^-1 F,  iterate until max |F| < tol (pu)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from plants.grid.sparse_lu import block_structure, lu_factor, lu_solve, minimum_degree_order

CONVERGED, MAX_ITER, SINGULAR, DIVERGED = 0, 1, 2, 3
STATUS_NAMES = {CONVERGED: "converged", MAX_ITER: "max_iter", SINGULAR: "singular", DIVERGED: "diverged"}
VM_COLLAPSE_PU = 0.3   # a free |V| below this is treated as voltage collapse (diverged)
MISMATCH_DIVERGED_PU = 1e4


@njit(cache=True, nogil=True)
def _injections(indptr, indices, ydata, vm, va, V, I):
    n = vm.shape[0]
    for i in range(n):
        V[i] = vm[i] * complex(np.cos(va[i]), np.sin(va[i]))
    for i in range(n):
        s = 0j
        for k in range(indptr[i], indptr[i + 1]):
            s += ydata[k] * V[indices[k]]
        I[i] = s


@njit(cache=True, nogil=True)
def _mismatch(sbus, free_va, free_vm, rank, V, I, F):
    worst = 0.0
    for i in range(V.shape[0]):
        s = V[i] * I[i].conjugate() - sbus[i]
        p = s.real if free_va[i] else 0.0
        q = s.imag if free_vm[i] else 0.0
        F[2 * rank[i]] = p
        F[2 * rank[i] + 1] = q
        a = max(abs(p), abs(q))
        if not (a <= worst):  # also catches NaN
            worst = a
    return worst


@njit(cache=True, nogil=True)
def _jacobian(indptr, indices, ydata, vm, free_va, free_vm, rank, jpos, lu_diag, values, V, I):
    values[:] = 0.0
    n = vm.shape[0]
    for i in range(n):
        fa, fm = free_va[i], free_vm[i]
        if not fa and not fm:
            continue
        vi = V[i]
        for k in range(indptr[i], indptr[i + 1]):
            j = indices[k]
            ja, jm = free_va[j], free_vm[j]
            if not ja and not jm:
                continue
            yv = (ydata[k] * V[j]).conjugate()
            if ja:
                a = -1j * vi * yv
                if j == i:
                    a += 1j * vi * I[i].conjugate()
                if fa:
                    values[jpos[k, 0]] = a.real
                if fm:
                    values[jpos[k, 2]] = a.imag
            if jm:
                m = vi * yv / vm[j]
                if j == i:
                    m += I[i].conjugate() * vi / vm[i]
                if fa:
                    values[jpos[k, 1]] = m.real
                if fm:
                    values[jpos[k, 3]] = m.imag
    for i in range(n):
        if not free_va[i]:
            values[lu_diag[2 * rank[i]]] = 1.0
        if not free_vm[i]:
            values[lu_diag[2 * rank[i] + 1]] = 1.0


@njit(cache=True, nogil=True)
def newton_pf(indptr, indices, ydata, sbus, vm, va, free_va, free_vm, rank, jpos,
              lu_indptr, lu_indices, lu_diag, lu_values, work, F, V, I, tol, max_iter, stats):
    """Solve the AC power flow in place from the warm start (vm, va) (pu, rad).

    ``free_va``/``free_vm`` (bool, n_bus) select the unknowns; fixed ones keep their values.
    ``stats`` (float64, >= 2) receives [iterations, final max |F| (pu)]. Returns CONVERGED,
    MAX_ITER, SINGULAR or DIVERGED; on anything but CONVERGED, vm/va hold the last iterate
    (finite or not) and the caller must restore its warm start.
    """
    n = vm.shape[0]
    it = 0
    _injections(indptr, indices, ydata, vm, va, V, I)
    worst = _mismatch(sbus, free_va, free_vm, rank, V, I, F)
    status = MAX_ITER
    while True:
        if not np.isfinite(worst) or worst > MISMATCH_DIVERGED_PU:
            status = DIVERGED
            break
        if worst < tol:
            status = CONVERGED
            break
        if it >= max_iter:
            status = MAX_ITER
            break
        _jacobian(indptr, indices, ydata, vm, free_va, free_vm, rank, jpos, lu_diag, lu_values, V, I)
        if lu_factor(lu_indptr, lu_indices, lu_diag, lu_values, work) != 0:
            status = SINGULAR
            break
        lu_solve(lu_indptr, lu_indices, lu_diag, lu_values, F)
        collapsed = False
        for i in range(n):
            if free_va[i]:
                va[i] -= F[2 * rank[i]]
            if free_vm[i]:
                vm[i] -= F[2 * rank[i] + 1]
                if not (vm[i] > VM_COLLAPSE_PU):
                    collapsed = True
        it += 1
        if collapsed:
            status = DIVERGED
            break
        _injections(indptr, indices, ydata, vm, va, V, I)
        worst = _mismatch(sbus, free_va, free_vm, rank, V, I, F)
    stats[0] = it
    stats[1] = worst
    return status


@dataclass
class NewtonWorkspace:
    """Everything ``newton_pf`` needs besides the values: built once per Ybus pattern."""

    indptr: np.ndarray
    indices: np.ndarray
    rank: np.ndarray
    jpos: np.ndarray
    lu_indptr: np.ndarray
    lu_indices: np.ndarray
    lu_diag: np.ndarray
    lu_values: np.ndarray
    work: np.ndarray
    F: np.ndarray
    V: np.ndarray
    I: np.ndarray
    stats: np.ndarray

    @classmethod
    def for_pattern(cls, indptr: np.ndarray, indices: np.ndarray) -> "NewtonWorkspace":
        """Ordering (minimum degree on the bus graph), symbolic LU and Jacobian position map."""
        indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        indices = np.ascontiguousarray(indices, dtype=np.int64)
        n = len(indptr) - 1
        neighbours = [set(indices[indptr[i]:indptr[i + 1]].tolist()) | {i} for i in range(n)]
        for i in range(n):
            for j in list(neighbours[i]):
                neighbours[j].add(i)  # symmetrize (Ybus of a phase shifter is not symmetric in value, is in pattern)
        order, filled = minimum_degree_order(n, neighbours)
        lu, rank = block_structure(n, filled, order, 2)
        # Jacobian entry (bus i, bus j, block (a, b)) -> its position in L+U, for every Ybus entry at
        # once: L+U's (row, col) keys row * N + col ascend (rows in order, columns ascending per row),
        # so one searchsorted finds them all (the per-entry LUStructure.position, vectorized)
        N = 2 * n
        lu_keys = np.repeat(np.arange(N, dtype=np.int64), np.diff(lu.indptr)) * N + lu.indices
        ri = 2 * rank[np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))]
        rj = 2 * rank[indices]
        jpos = np.empty((len(indices), 4), dtype=np.int64)
        for c, (da, db) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
            want = (ri + da) * N + (rj + db)
            k = np.minimum(np.searchsorted(lu_keys, want), len(lu_keys) - 1)
            if not np.array_equal(lu_keys[k], want):
                raise KeyError("Jacobian entry outside the symbolic LU pattern")
            jpos[:, c] = k
        return cls(indptr, indices, rank, jpos, lu.indptr, lu.indices, lu.diag,
                   np.zeros(lu.nnz), np.zeros(2 * n), np.zeros(2 * n),
                   np.zeros(n, dtype=np.complex128), np.zeros(n, dtype=np.complex128), np.zeros(2))

    def solve(self, ydata, sbus, vm, va, free_va, free_vm, tol=1e-8, max_iter=10) -> int:
        """Run ``newton_pf`` on this workspace; returns its status, ``self.stats`` the figures."""
        return newton_pf(self.indptr, self.indices, ydata, sbus, vm, va, free_va, free_vm, self.rank,
                         self.jpos, self.lu_indptr, self.lu_indices, self.lu_diag, self.lu_values,
                         self.work, self.F, self.V, self.I, tol, max_iter, self.stats)


def bus_flags(n_bus: int, ref, pv, pq) -> tuple[np.ndarray, np.ndarray]:
    """(free_va, free_vm) from MATPOWER-style index arrays: pv -> Va free, pq -> Va and Vm free."""
    free_va = np.zeros(n_bus, dtype=np.bool_)
    free_vm = np.zeros(n_bus, dtype=np.bool_)
    free_va[np.asarray(pv, dtype=np.int64)] = True
    free_va[np.asarray(pq, dtype=np.int64)] = True
    free_vm[np.asarray(pq, dtype=np.int64)] = True
    return free_va, free_vm
