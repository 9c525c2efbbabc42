"""The 2x2 block LU (plants/grid/block_lu.py) and the block Newton path against SuperLU and a textbook
reduced-Jacobian Newton (MATPOWER's newtonpf in NumPy/SciPy)."""

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from plants.grid.block_lu import block_lu_factor, block_lu_solve, update_targets
from plants.grid.newton import MAX_ITER, NewtonWorkspace, _injections_e, _jacobian_blocks, bus_flags


def _workspace_at(ref118, vm, va):
    """A case118 workspace with the block Jacobian assembled at (vm, va); returns (ws, scalar J in block order)."""
    n = len(ref118["vm_pu"])
    ws = NewtonWorkspace.for_pattern(ref118["ybus_indptr"], ref118["ybus_indices"])
    free_va, free_vm = bus_flags(n, ref118["ref"], ref118["pv"], ref118["pq"])
    ws.ma[:] = free_va
    ws.mm[:] = free_vm
    ws.b_values[:] = np.nan  # every block must be written (fill blocks zeroed)
    _injections_e(ws.indptr, ws.indices, ref118["ybus_data"], vm, va, ws.E, ws.V, ws.I)
    _jacobian_blocks(ws.indptr, ws.indices, ref118["ybus_data"], vm, free_va, free_vm, ws.ma, ws.mm, ws.rank,
                     ws.jblk, ws.zero_blocks, ws.b_diag, ws.b_values, ws.E, ws.V, ws.I)
    J = sp.bsr_matrix((ws.b_values.reshape(-1, 2, 2).copy(), ws.b_indices, ws.b_indptr), shape=(2 * n, 2 * n))
    return ws, J.tocsc()


def _flat(ref118):
    n = len(ref118["vm_pu"])
    vm, va = np.ones(n), np.zeros(n)
    gen = ref118["ppc_gen"]
    vm[gen[:, 0].astype(int)] = gen[:, 5]
    va[ref118["ref"]] = np.radians(ref118["ppc_bus"][ref118["ref"], 8])
    return vm, va


def test_block_jacobian_is_matpowers_with_identity_rows(ref118):
    """The assembled blocks equal MATPOWER's dS/dVa, dS/dVm (SciPy) on free rows/columns, identity on fixed ones."""
    n = len(ref118["vm_pu"])
    vm, va = ref118["vm_pu"] * 0.98, np.radians(ref118["va_degree"]) * 0.9  # a non-solution iterate
    ws, J = _workspace_at(ref118, vm, va)
    Y = sp.csr_matrix((ref118["ybus_data"], ref118["ybus_indices"], ref118["ybus_indptr"]), shape=(n, n))
    V = vm * np.exp(1j * va)
    I = Y @ V
    dS_dVa = 1j * sp.diags(V) @ np.conj(sp.diags(I) - Y @ sp.diags(V))
    dS_dVm = sp.diags(V) @ np.conj(Y @ sp.diags(V / abs(V))) + np.conj(sp.diags(I)) @ sp.diags(V / abs(V))
    free_va, free_vm = bus_flags(n, ref118["ref"], ref118["pv"], ref118["pq"])
    # the same matrix in bus order: row/col 2 i + c of bus i's component c
    want = sp.bmat([[dS_dVa.real, dS_dVm.real], [dS_dVa.imag, dS_dVm.imag]]).toarray()
    perm = np.empty(2 * n, dtype=np.int64)
    perm[0::2], perm[1::2] = np.arange(n), n + np.arange(n)
    want = want[np.ix_(perm, perm)]
    free = np.empty(2 * n, dtype=bool)
    free[0::2], free[1::2] = free_va, free_vm
    want[~free, :] = 0.0
    want[:, ~free] = 0.0
    want[~free, ~free] = 1.0
    order = np.empty(2 * n, dtype=np.int64)           # block order -> bus order
    order[0::2], order[1::2] = 2 * np.argsort(ws.rank), 2 * np.argsort(ws.rank) + 1
    got = J.toarray()[np.ix_(np.argsort(order), np.argsort(order))]
    assert np.abs(got - want).max() < 1e-12 * np.abs(want).max()   # same formulas, round-off only


def test_block_lu_solves_like_superlu(ref118):
    """Factor + solve on a real Jacobian (236 x 236) equals SciPy's SuperLU solve to 1e-9 (relative)."""
    vm, va = _flat(ref118)
    ws, J = _workspace_at(ref118, vm, va)
    b = np.random.default_rng(3).normal(size=J.shape[0])
    x = b.copy()
    assert block_lu_factor(ws.b_indptr, ws.b_indices, ws.b_diag, ws.b_tptr, ws.b_tgt, ws.b_values, ws.b_dinv) == 0
    block_lu_solve(ws.b_indptr, ws.b_indices, ws.b_diag, ws.b_values, ws.b_dinv, x)
    ref = spla.spsolve(J, b)
    assert np.abs(x - ref).max() < 1e-9 * np.abs(ref).max()
    assert np.abs(J @ x - b).max() < 1e-9


def _pattern(rows):
    indptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
    indices = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows])
    diag = np.array([indptr[i] + list(r).index(i) for i, r in enumerate(rows)], dtype=np.int64)
    return indptr, indices, diag


def test_update_targets_rejects_a_pattern_without_its_fill():
    # row 2 has (2, 0) and row 0 has (0, 1): eliminating 0 from row 2 fills (2, 1), absent here
    with pytest.raises(ValueError, match="not closed under elimination"):
        update_targets(*_pattern([[0, 1], [1], [0, 2]]))
    tptr, tgt = update_targets(*_pattern([[0, 1], [1], [0, 1, 2]]))
    assert tptr.tolist() == [0, 0, 0, 0, 1, 1, 1] and tgt.tolist() == [4]   # (2, 0) updates (2, 1) at position 4


def test_dense_three_block_matrix_and_pivot_failures():
    """A dense 6 x 6 in 3 blocks vs numpy.linalg.solve; a singular diagonal block is reported (-1), not NaN."""
    indptr, indices, diag = _pattern([[0, 1, 2]] * 3)
    tptr, tgt = update_targets(indptr, indices, diag)
    rng = np.random.default_rng(5)
    A = rng.normal(size=(6, 6)) + 6 * np.eye(6)
    values = np.array([A[2 * r:2 * r + 2, 2 * c:2 * c + 2].ravel() for r in range(3) for c in range(3)])
    dinv = np.zeros((3, 4))
    assert block_lu_factor(indptr, indices, diag, tptr, tgt, values, dinv) == 0
    b = rng.normal(size=6)
    x = b.copy()
    block_lu_solve(indptr, indices, diag, values, dinv, x)
    assert np.abs(x - np.linalg.solve(A, b)).max() < 1e-12
    for bad in ([0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]):   # first pivot zero; second pivot (Schur) zero
        values = np.zeros((9, 4))
        values[diag] = [1.0, 0.0, 0.0, 1.0]
        values[diag[1]] = bad
        assert block_lu_factor(indptr, indices, diag, tptr, tgt, values, np.zeros((3, 4))) == -1


def _reduced_newton(Y, S, vm, va, ref, pv, pq, n_iter):
    """MATPOWER newtonpf, textbook: the reduced Jacobian (PV: no Q row / Vm column; slack: none), SuperLU."""
    vm, va = vm.copy(), va.copy()
    pvpq = np.r_[pv, pq]
    out = []
    for _ in range(n_iter):
        V = vm * np.exp(1j * va)
        I = Y @ V
        dS_dVa = 1j * sp.diags(V) @ np.conj(sp.diags(I) - Y @ sp.diags(V))
        dS_dVm = sp.diags(V) @ np.conj(Y @ sp.diags(V / abs(V))) + np.conj(sp.diags(I)) @ sp.diags(V / abs(V))
        J = sp.bmat([[dS_dVa[pvpq][:, pvpq].real, dS_dVm[pvpq][:, pq].real],
                     [dS_dVa[pq][:, pvpq].imag, dS_dVm[pq][:, pq].imag]]).tocsc()
        mis = V * np.conj(I) - S
        dx = -spla.spsolve(J, np.r_[mis[pvpq].real, mis[pq].imag])
        va[pvpq] += dx[:len(pvpq)]
        vm[pq] += dx[len(pvpq):]
        out.append((vm.copy(), va.copy()))
    return out


@pytest.mark.parametrize("load", [1.0, 1.3])
def test_full_block_newton_iterates_equal_the_reduced_jacobians(ref118, load):
    """Every Newton iterate of the block path (full 2n system, identity rows for fixed unknowns) equals the
    reduced-Jacobian Newton's to 1e-10 (the two linear systems have the same solution on free unknowns)."""
    n = len(ref118["vm_pu"])
    Y = sp.csr_matrix((ref118["ybus_data"], ref118["ybus_indices"], ref118["ybus_indptr"]), shape=(n, n))
    S = ref118["sbus_pu"] * load
    vm0, va0 = _flat(ref118)
    want = _reduced_newton(Y, S, vm0, va0, ref118["ref"], ref118["pv"], ref118["pq"], 5)
    ws = NewtonWorkspace.for_pattern(ref118["ybus_indptr"], ref118["ybus_indices"])
    free_va, free_vm = bus_flags(n, ref118["ref"], ref118["pv"], ref118["pq"])
    for k, (vm_k, va_k) in enumerate(want, start=1):
        vm, va = vm0.copy(), va0.copy()
        status = ws.solve(ref118["ybus_data"], S, vm, va, free_va, free_vm, tol=0.0, max_iter=k)
        assert status == MAX_ITER and ws.stats[0] == k
        assert np.abs(vm - vm_k).max() < 1e-10 and np.abs(va - va_k).max() < 1e-10
    assert ws.stats[1] < 1e-9   # the fifth iterate is converged (the comparison covers the whole path)


def test_bus_types_change_on_one_workspace(ref118):
    """A PV bus turned PQ (a Q limit) on the same workspace: the next solve uses the new flags (pattern fixed)."""
    n = len(ref118["vm_pu"])
    Y = sp.csr_matrix((ref118["ybus_data"], ref118["ybus_indices"], ref118["ybus_indptr"]), shape=(n, n))
    ws = NewtonWorkspace.for_pattern(ref118["ybus_indptr"], ref118["ybus_indices"])
    vm0, va0 = _flat(ref118)
    pv, pq = ref118["pv"][3:], np.sort(np.r_[ref118["pq"], ref118["pv"][:3]])
    S = ref118["sbus_pu"].copy()
    free_va, free_vm = bus_flags(n, ref118["ref"], ref118["pv"], ref118["pq"])
    vm, va = vm0.copy(), va0.copy()
    ws.solve(ref118["ybus_data"], S, vm, va, free_va, free_vm, tol=1e-10)
    V = vm * np.exp(1j * va)
    S[ref118["pv"][:3]] = (V * np.conj(Y @ V))[ref118["pv"][:3]] - 0.05j  # their units held 0.05 pu below that Q
    want = _reduced_newton(Y, S, vm, va, ref118["ref"], pv, pq, 3)
    free_va, free_vm = bus_flags(n, ref118["ref"], pv, pq)
    status = ws.solve(ref118["ybus_data"], S, vm, va, free_va, free_vm, tol=0.0, max_iter=3)
    assert status == MAX_ITER
    assert np.abs(vm - want[-1][0]).max() < 1e-10 and np.abs(va - want[-1][1]).max() < 1e-10
