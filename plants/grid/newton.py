"""AC Newton-Raphson power flow in polar coordinates, Numba, fixed sparse structure.

Unknowns and equations are per bus: (Va_i, Vm_i) and (P_i, Q_i). A bus flag says which of its
two unknowns are free: PQ bus both, PV bus Va only, slack and dead buses none. A fixed unknown
keeps an identity row and a zero column in the Jacobian, so the matrix size and pattern never
change when a bus switches type (PV -> PQ on a Q limit, a new slack for an island, a dead island):
the ordering (``sparse_lu.minimum_degree_order``), the block pattern and its elimination program
(``block_lu.py``) are computed once per Ybus pattern. Each iteration then makes one pass over Ybus
for I and F, one for the Jacobian written straight into the block LU's 2x2 value blocks, one
numeric refactorization along the precomputed program and one block solve; nothing is searched or
allocated. The identity rows cost little: the iterates equal those of MATPOWER's reduced Jacobian
(PV: no Q row and no |V| column; slack: none) to round-off (tests/plants/grid/test_block_lu.py).

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

from plants.grid.block_lu import block_lu_factor, block_lu_solve, update_targets
from plants.grid.sparse_lu import block_structure, minimum_degree_order

CONVERGED, MAX_ITER, SINGULAR, DIVERGED = 0, 1, 2, 3
ROTATE_MAX_RAD = 1e-2  # an angle step below this updates exp(j Va) by a series rotation, not cos/sin
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
def _injections_e(indptr, indices, ydata, vm, va, E, V, I):
    """``_injections`` that also keeps E_i = exp(j va_i) (V_i = vm_i E_i) for the block Jacobian."""
    n = vm.shape[0]
    for i in range(n):
        e = complex(np.cos(va[i]), np.sin(va[i]))
        E[i] = e
        V[i] = vm[i] * e
    for i in range(n):
        c = 0j
        for k in range(indptr[i], indptr[i + 1]):
            c += ydata[k] * V[indices[k]]
        I[i] = c


@njit(cache=True, nogil=True)
def _injections_mismatch(indptr, indices, ydata, sbus, vm, free_va, free_vm, rank, E, V, I, F):
    """V = vm E, I = Ybus V and the mismatch F in one pass over Ybus (E_i = exp(j va_i) kept by the
    caller). Returns max |F| (pu; a NaN makes it NaN)."""
    n = vm.shape[0]
    for i in range(n):
        V[i] = vm[i] * E[i]
    worst = 0.0
    for i in range(n):
        c = 0j
        for k in range(indptr[i], indptr[i + 1]):
            c += ydata[k] * V[indices[k]]
        I[i] = c
        s = V[i] * c.conjugate() - sbus[i]
        p = s.real if free_va[i] else 0.0
        q = s.imag if free_vm[i] else 0.0
        F[2 * rank[i]] = p
        F[2 * rank[i] + 1] = q
        a = max(abs(p), abs(q))
        if not (a <= worst):  # also catches NaN
            worst = a
    return worst


@njit(cache=True, nogil=True)
def _rotate(e, x):
    """e exp(j x) for |x| <= ROTATE_MAX_RAD by the Taylor series of cos and sin to x^7 (the first
    omitted terms, x^8/8! and x^9/9!, are below 3e-21 there: exact in float64)."""
    x2 = x * x
    c = 1.0 - x2 * (0.5 - x2 * (1.0 / 24.0 - x2 * (1.0 / 720.0)))
    s = x * (1.0 - x2 * (1.0 / 6.0 - x2 * (1.0 / 120.0 - x2 * (1.0 / 5040.0))))
    return e * complex(c, s)


@njit(cache=True, nogil=True)
def _jacobian_blocks(indptr, indices, ydata, vm, free_va, free_vm, ma, mm, rank, jblk, zero_blocks, bdiag, values,
                     E, V, I):
    """The Jacobian straight into the 2x2 block LU's value array (``block_lu.py``), one pass over Ybus.

    Block of Ybus entry k = (i, j): ``[[dP_i/dVa_j, dP_i/dVm_j], [dQ_i/dVa_j, dQ_i/dVm_j]]`` with rows
    of fixed equations and columns of fixed unknowns zero (``ma``/``mm``: 1.0 where Va/Vm is free,
    else 0.0); a fixed unknown gets 1 on its diagonal. With m = V_i conj(Y_ij E_j) (= dS_i/dVm_j off
    the diagonal): dS_i/dVa_j = -j |V_j| m; the diagonal adds j V_i conj(I_i) to dS_i/dVa_i and
    conj(I_i) E_i to dS_i/dVm_i (module doc). Blocks no Ybus entry fills (fill-in, a missing Ybus
    diagonal) are zeroed first.
    """
    for t in range(zero_blocks.shape[0]):
        b = zero_blocks[t]
        values[b, 0] = 0.0
        values[b, 1] = 0.0
        values[b, 2] = 0.0
        values[b, 3] = 0.0
    n = vm.shape[0]
    for i in range(n):
        fa = ma[i]
        fm = mm[i]
        vi = V[i]
        for k in range(indptr[i], indptr[i + 1]):
            j = indices[k]
            ja = ma[j]
            jm = mm[j]
            vj = vm[j]
            m = vi * (ydata[k] * E[j]).conjugate()
            b = jblk[k]
            values[b, 0] = fa * ja * vj * m.imag
            values[b, 1] = fa * jm * m.real
            values[b, 2] = -fm * ja * vj * m.real
            values[b, 3] = fm * jm * m.imag
        b = bdiag[rank[i]]      # the diagonal block: written above (or zeroed if Ybus has no (i, i))
        c = vi * I[i].conjugate()
        g = I[i].conjugate() * E[i]
        if free_va[i]:
            values[b, 0] -= c.imag
            if free_vm[i]:
                values[b, 1] += g.real
                values[b, 2] += c.real
        else:
            values[b, 0] = 1.0
        if free_vm[i]:
            values[b, 3] += g.imag
        else:
            values[b, 3] = 1.0


@njit(cache=True, nogil=True)
def newton_pf(indptr, indices, ydata, sbus, vm, va, free_va, free_vm, ma, mm, rank, jblk, zero_blocks,
              b_indptr, b_indices, b_diag, b_tptr, b_tgt, b_values, b_dinv, F, E, V, I, tol, max_iter, stats):
    """Solve the AC power flow in place from the warm start (vm, va) (pu, rad).

    ``free_va``/``free_vm`` (bool, n_bus) select the unknowns; fixed ones keep their values.
    The Jacobian is assembled into and factored by the 2x2 block LU of ``block_lu.py``.
    ``stats`` (float64, >= 2) receives [iterations, final max |F| (pu)]. Returns CONVERGED,
    MAX_ITER, SINGULAR or DIVERGED; on anything but CONVERGED, vm/va hold the last iterate
    (finite or not) and the caller must restore its warm start.
    """
    n = vm.shape[0]
    for i in range(n):
        ma[i] = 1.0 if free_va[i] else 0.0
        mm[i] = 1.0 if free_vm[i] else 0.0
    for i in range(n):
        E[i] = complex(np.cos(va[i]), np.sin(va[i]))
    it = 0
    worst = _injections_mismatch(indptr, indices, ydata, sbus, vm, free_va, free_vm, rank, E, V, I, F)
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
        _jacobian_blocks(indptr, indices, ydata, vm, free_va, free_vm, ma, mm, rank, jblk, zero_blocks, b_diag,
                         b_values, E, V, I)
        if block_lu_factor(b_indptr, b_indices, b_diag, b_tptr, b_tgt, b_values, b_dinv) != 0:
            status = SINGULAR
            break
        block_lu_solve(b_indptr, b_indices, b_diag, b_values, b_dinv, F)
        collapsed = False
        for i in range(n):
            if free_va[i]:
                d = F[2 * rank[i]]
                va[i] -= d
                if abs(d) <= ROTATE_MAX_RAD:   # late iterations: no cos/sin (E = exp(j va) to ~1e-16)
                    E[i] = _rotate(E[i], -d)
                else:
                    E[i] = complex(np.cos(va[i]), np.sin(va[i]))
            if free_vm[i]:
                vm[i] -= F[2 * rank[i] + 1]
                if not (vm[i] > VM_COLLAPSE_PU):
                    collapsed = True
        it += 1
        if collapsed:
            status = DIVERGED
            break
        worst = _injections_mismatch(indptr, indices, ydata, sbus, vm, free_va, free_vm, rank, E, V, I, F)
    stats[0] = it
    stats[1] = worst
    return status


@dataclass
class NewtonWorkspace:
    """Everything ``newton_pf`` needs besides the values: built once per Ybus pattern.

    The bus order (minimum degree), the 2x2 block LU pattern with its elimination program
    (``b_*``), the block of every Ybus entry (``jblk``) and the fill blocks (``zero_blocks``);
    ``distributed_slack.py`` shares the factorization. ``ma``/``mm`` (free-unknown masks), ``F``,
    ``E``, ``V``, ``I`` are work; ``stats`` the last solve's [iterations, max |F| (pu)].
    """

    indptr: np.ndarray
    indices: np.ndarray
    rank: np.ndarray
    jblk: np.ndarray
    zero_blocks: np.ndarray
    b_indptr: np.ndarray
    b_indices: np.ndarray
    b_diag: np.ndarray
    b_tptr: np.ndarray
    b_tgt: np.ndarray
    b_values: np.ndarray
    b_dinv: np.ndarray
    F: np.ndarray
    ma: np.ndarray
    mm: np.ndarray
    E: np.ndarray
    V: np.ndarray
    I: np.ndarray
    stats: np.ndarray

    @classmethod
    def for_pattern(cls, indptr: np.ndarray, indices: np.ndarray) -> "NewtonWorkspace":
        """Ordering (minimum degree on the bus graph), symbolic block LU and the Jacobian's block positions."""
        indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        indices = np.ascontiguousarray(indices, dtype=np.int64)
        n = len(indptr) - 1
        neighbours = [set(indices[indptr[i]:indptr[i + 1]].tolist()) | {i} for i in range(n)]
        for i in range(n):
            for j in list(neighbours[i]):
                neighbours[j].add(i)  # symmetrize (Ybus of a phase shifter is not symmetric in value, is in pattern)
        order, filled = minimum_degree_order(n, neighbours)
        blk, rank = block_structure(n, filled, order, 1)
        # Ybus entry (i, j) -> its block (rank i, rank j) in L+U: the (row, col) keys row * n + col of
        # L+U ascend, so one searchsorted finds every entry (LUStructure.position, vectorized)
        row_rank = rank[np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))]
        jblk = _positions(blk, n, row_rank * n + rank[indices])
        zero_blocks = np.setdiff1d(np.arange(blk.nnz, dtype=np.int64), jblk)
        tptr, tgt = update_targets(blk.indptr, blk.indices, blk.diag)
        cplx = lambda: np.zeros(n, dtype=np.complex128)  # noqa: E731
        return cls(indptr, indices, rank, jblk, zero_blocks, blk.indptr, blk.indices, blk.diag, tptr, tgt,
                   np.zeros((blk.nnz, 4)), np.zeros((n, 4)), np.zeros(2 * n), np.zeros(n), np.zeros(n), cplx(), cplx(),
                   cplx(), np.zeros(2))

    def solve(self, ydata, sbus, vm, va, free_va, free_vm, tol=1e-8, max_iter=10) -> int:
        """Run ``newton_pf`` on this workspace; returns its status, ``self.stats`` the figures."""
        return newton_pf(self.indptr, self.indices, ydata, sbus, vm, va, free_va, free_vm, self.ma, self.mm,
                         self.rank, self.jblk, self.zero_blocks, self.b_indptr, self.b_indices, self.b_diag,
                         self.b_tptr, self.b_tgt, self.b_values, self.b_dinv, self.F, self.E, self.V, self.I, tol,
                         max_iter, self.stats)


def _positions(lu, N: int, want: np.ndarray) -> np.ndarray:
    """Positions in ``lu`` (an LUStructure of N x N) of the (row * N + col) keys ``want`` (KeyError if absent)."""
    keys = np.repeat(np.arange(N, dtype=np.int64), np.diff(lu.indptr)) * N + lu.indices
    k = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    if not np.array_equal(keys[k], want):
        raise KeyError("Jacobian entry outside the symbolic LU pattern")
    return k


def bus_flags(n_bus: int, ref, pv, pq) -> tuple[np.ndarray, np.ndarray]:
    """(free_va, free_vm) from MATPOWER-style index arrays: pv -> Va free, pq -> Va and Vm free."""
    free_va = np.zeros(n_bus, dtype=np.bool_)
    free_vm = np.zeros(n_bus, dtype=np.bool_)
    free_va[np.asarray(pv, dtype=np.int64)] = True
    free_va[np.asarray(pq, dtype=np.int64)] = True
    free_vm[np.asarray(pq, dtype=np.int64)] = True
    return free_va, free_vm
