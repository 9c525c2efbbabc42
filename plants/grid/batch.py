"""Batches of AC power flows in one compiled call: a load time series and the N-1 outages.

Both loops call ``newton.newton_pf`` on one ``NewtonWorkspace`` (bus ordering, block LU pattern
and elimination program built once per Ybus pattern); no Python runs per step or per outage.

Time series (``solve_series``): step k sets the bus injections from the loads of that step and
solves warm-started from step k-1's answer (step 0 from the caller's (vm, va))::

    Sbus_k = sbus_fixed - sum over loads l at bus i of (p_mw[k, l] + j q_mvar[k, l]) / sn_mva   (pu)

where ``sbus_fixed`` is the case's Sbus with its loads taken out.

N-1 (``solve_outages``): outage c removes branch b = branches[c] from Ybus by subtracting its pi
stamp (``y4[b] = (Yff, Yft, Ytf, Ytt)`` pu, at Ybus positions ``pos[b] = (ff, ft, tf, tt)``); the
pattern is kept (the entry is left at 0, or at a parallel branch's value), so the same symbolic
factorization serves every outage. Each outage starts from the base case's answer. An outage that
separates a bus from every root (a bridge of the closed network; found by a breadth-first search
over the Ybus entries left nonzero) is not solved: status ``ISLANDED``, its voltages set to NaN.
Roots are the buses with no free unknown: the slack buses, and dead buses the caller has fixed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from plants.grid.newton import NewtonWorkspace, newton_pf

ISLANDED = 4   # an extra status next to newton's CONVERGED, MAX_ITER, SINGULAR, DIVERGED


@njit(cache=True, nogil=True)
def _series_kernel(indptr, indices, ydata, sbus_fixed, load_bus, p_mw, q_mvar, inv_sn, vm, va, free_va, free_vm,
                   ma, mm, rank, jblk, zero_blocks, b_indptr, b_indices, b_diag, b_tptr, b_tgt, b_values, b_dinv,
                   F, E, V, I, sbus, last_vm, last_va, tol, max_iter, stats, out_vm, out_va, out_status, out_iter):
    steps = p_mw.shape[0]
    n = vm.shape[0]
    failed = 0
    for i in range(n):
        last_vm[i] = vm[i]
        last_va[i] = va[i]
    for k in range(steps):
        for i in range(n):
            sbus[i] = sbus_fixed[i]
        for ld in range(load_bus.shape[0]):
            b = load_bus[ld]
            sbus[b] -= complex(p_mw[k, ld] * inv_sn, q_mvar[k, ld] * inv_sn)
        status = newton_pf(indptr, indices, ydata, sbus, vm, va, free_va, free_vm, ma, mm, rank, jblk, zero_blocks,
                           b_indptr, b_indices, b_diag, b_tptr, b_tgt, b_values, b_dinv, F, E, V, I, tol, max_iter,
                           stats)
        out_status[k] = status
        out_iter[k] = int(stats[0])
        for i in range(n):
            out_vm[k, i] = vm[i]
            out_va[k, i] = va[i]
        if status != 0:                # the next step restarts from the last converged answer
            failed += 1
            for i in range(n):
                vm[i] = last_vm[i]
                va[i] = last_va[i]
        else:
            for i in range(n):
                last_vm[i] = vm[i]
                last_va[i] = va[i]
    return failed


def solve_series(ws: NewtonWorkspace, ydata, sbus_fixed, load_bus, p_mw, q_mvar, sn_mva: float, vm, va, free_va,
                 free_vm, tol: float = 1e-8, max_iter: int = 20):
    """Solve T power flows warm-started step after step (module doc).

    ydata (complex, nnz of ws's pattern), sbus_fixed (complex, n_bus, pu, loads taken out),
    load_bus (int, n_load: the bus index of each load), p_mw / q_mvar ((T, n_load) MW, Mvar),
    sn_mva (MVA base). vm, va (pu, rad; n_bus) hold the start and end at the last converged answer
    (a step that fails is reported in ``status`` and the next one restarts from that answer).
    Returns (vm (T, n_bus) pu, va (T, n_bus) rad, status (T,) int, iterations (T,) int).
    """
    p_mw = np.ascontiguousarray(p_mw, dtype=np.float64)
    q_mvar = np.ascontiguousarray(q_mvar, dtype=np.float64)
    load_bus = np.ascontiguousarray(load_bus, dtype=np.int64)
    n = len(vm)
    if p_mw.ndim != 2 or p_mw.shape != q_mvar.shape or p_mw.shape[1] != len(load_bus):
        raise ValueError(f"p_mw/q_mvar: shapes {p_mw.shape}, {q_mvar.shape} must both be (T, {len(load_bus)} loads)")
    if len(load_bus) and (load_bus.min() < 0 or load_bus.max() >= n):
        raise ValueError(f"load_bus: indices must lie in 0..{n - 1}")
    if not sn_mva > 0:
        raise ValueError(f"sn_mva: {sn_mva} must be > 0")
    steps = p_mw.shape[0]
    out_vm, out_va = np.empty((steps, n)), np.empty((steps, n))
    out_status, out_iter = np.empty(steps, dtype=np.int64), np.empty(steps, dtype=np.int64)
    _series_kernel(ws.indptr, ws.indices, ydata, np.ascontiguousarray(sbus_fixed, dtype=np.complex128), load_bus,
                   p_mw, q_mvar, 1.0 / sn_mva, vm, va, free_va, free_vm, ws.ma, ws.mm, ws.rank, ws.jblk,
                   ws.zero_blocks, ws.b_indptr, ws.b_indices, ws.b_diag, ws.b_tptr, ws.b_tgt, ws.b_values, ws.b_dinv,
                   ws.F, ws.E, ws.V, ws.I, np.zeros(n, dtype=np.complex128), np.empty(n), np.empty(n), tol, max_iter, ws.stats, out_vm, out_va,
                   out_status, out_iter)
    return out_vm, out_va, out_status, out_iter


@njit(cache=True, nogil=True)
def _connected_without(indptr, indices, ydata, pos, y4, out_branch, fixed_root, seen, queue):
    """True when every bus reaches a slack (``fixed_root``) through Ybus entries still nonzero after
    removing ``out_branch``'s stamp (an entry of a parallel branch stays nonzero)."""
    n = indptr.shape[0] - 1
    for i in range(n):
        seen[i] = False
    head = 0
    tail = 0
    for i in range(n):
        if fixed_root[i]:
            seen[i] = True
            queue[tail] = i
            tail += 1
    p_ft = pos[out_branch, 1]
    p_tf = pos[out_branch, 2]
    while head < tail:
        i = queue[head]
        head += 1
        for k in range(indptr[i], indptr[i + 1]):
            j = indices[k]
            if seen[j] or j == i:
                continue
            y = ydata[k]
            if k == p_ft:
                y = y - y4[out_branch, 1]
            elif k == p_tf:
                y = y - y4[out_branch, 2]
            if abs(y) > 1e-12 * (1.0 + abs(ydata[k])):
                seen[j] = True
                queue[tail] = j
                tail += 1
    return tail == n


@njit(cache=True, nogil=True)
def _outages_kernel(indptr, indices, ybase, ywork, pos, y4, branches, sbus, vm0, va0, vm, va, free_va, free_vm,
                    fixed_root, seen, queue, ma, mm, rank, jblk, zero_blocks, b_indptr, b_indices, b_diag, b_tptr,
                    b_tgt, b_values, b_dinv, F, E, V, I, tol, max_iter, stats, out_vm, out_va, out_status, out_iter):
    n = vm.shape[0]
    for k in range(ybase.shape[0]):
        ywork[k] = ybase[k]
    for c in range(branches.shape[0]):
        br = branches[c]
        if not _connected_without(indptr, indices, ybase, pos, y4, br, fixed_root, seen, queue):
            out_status[c] = 4
            out_iter[c] = 0
            for i in range(n):
                out_vm[c, i] = np.nan
                out_va[c, i] = np.nan
            continue
        for s in range(4):
            ywork[pos[br, s]] -= y4[br, s]
        for i in range(n):
            vm[i] = vm0[i]
            va[i] = va0[i]
        status = newton_pf(indptr, indices, ywork, sbus, vm, va, free_va, free_vm, ma, mm, rank, jblk, zero_blocks,
                           b_indptr, b_indices, b_diag, b_tptr, b_tgt, b_values, b_dinv, F, E, V, I, tol, max_iter,
                           stats)
        for s in range(4):             # put the base values back exactly (no round-off drift)
            ywork[pos[br, s]] = ybase[pos[br, s]]
        out_status[c] = status
        out_iter[c] = int(stats[0])
        for i in range(n):
            out_vm[c, i] = vm[i]
            out_va[c, i] = va[i]


def solve_outages(ws: NewtonWorkspace, ydata, pos, y4, branches, sbus, vm0, va0, free_va, free_vm,
                  tol: float = 1e-8, max_iter: int = 20):
    """AC power flow of every single-branch outage in ``branches`` from the base answer (vm0, va0).

    ydata (complex, nnz): the base Ybus values on ws's pattern; pos (int, (n_branch, 4)): Ybus data
    positions (ff, ft, tf, tt) of each branch; y4 (complex, (n_branch, 4)): its stamp (Yff, Yft, Ytf,
    Ytt) pu; sbus (complex, n_bus) pu. Returns (vm (C, n_bus) pu, va (C, n_bus) rad, status (C,),
    iterations (C,)); status ``ISLANDED`` (voltages NaN) where the outage leaves a bus without a slack.
    """
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    y4 = np.ascontiguousarray(y4, dtype=np.complex128)
    branches = np.ascontiguousarray(branches, dtype=np.int64)
    n = len(vm0)
    if pos.ndim != 2 or pos.shape[1] != 4 or y4.shape != pos.shape:
        raise ValueError(f"pos/y4: shapes {pos.shape}, {y4.shape} must both be (n_branch, 4)")
    if len(branches) and (branches.min() < 0 or branches.max() >= len(pos)):
        raise ValueError(f"branches: indices must lie in 0..{len(pos) - 1}")
    if pos.size and (pos.min() < 0 or pos.max() >= len(ydata)):
        raise ValueError(f"pos: Ybus positions must lie in 0..{len(ydata) - 1}")
    C = len(branches)
    out_vm, out_va = np.empty((C, n)), np.empty((C, n))
    out_status, out_iter = np.empty(C, dtype=np.int64), np.empty(C, dtype=np.int64)
    fixed_root = ~np.asarray(free_va, dtype=np.bool_) & ~np.asarray(free_vm, dtype=np.bool_)  # slack buses
    _outages_kernel(ws.indptr, ws.indices, np.ascontiguousarray(ydata, dtype=np.complex128),
                    np.empty(len(ydata), dtype=np.complex128), pos, y4, branches,
                    np.ascontiguousarray(sbus, dtype=np.complex128), np.asarray(vm0, dtype=np.float64),
                    np.asarray(va0, dtype=np.float64), np.empty(n), np.empty(n), free_va, free_vm, fixed_root,
                    np.zeros(n, dtype=np.bool_), np.empty(n, dtype=np.int64), ws.ma, ws.mm, ws.rank, ws.jblk,
                    ws.zero_blocks, ws.b_indptr, ws.b_indices, ws.b_diag, ws.b_tptr, ws.b_tgt, ws.b_values, ws.b_dinv,
                    ws.F, ws.E, ws.V, ws.I, tol, max_iter, ws.stats, out_vm, out_va, out_status, out_iter)
    return out_vm, out_va, out_status, out_iter
