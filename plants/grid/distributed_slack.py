"""Distributed-slack AC power flow (Numba): each island's imbalance shared by participation.

The standard distributed-slack formulation (e.g. pandapower's ``runpp(distributed_slack=True)``,
MATPOWER-style): one extra unknown per island r, the slack scalar lambda_r (pu of baseMVA),
and the slack bus's P equation joins the system::

    P_i(V) - (Psched_i + alpha_i lambda_r) = 0    every live bus i of island r with Va free, and r's slack bus
    Q_i(V) - Qsched_i = 0                         PQ buses
    sum_{i in r} alpha_i = 1                      alpha_i: bus i's share of the island's participation

The slack bus keeps its angle as the island's reference. The Jacobian is bordered::

    [ J    c ] [dx ]   [F    ]     J: the single-slack Jacobian (fixed pattern, newton.py)
    [ r^T  d ] [dl ] = [F_ref]     c = dF/dlambda = -alpha (P rows), d = -alpha_slack,
                                   r^T = dP_slack/dx (the slack bus's row, its neighbours only)

and solved by block elimination with the one LU of J: ``J y = F``, ``J z = c``, then
``dl = (F_ref - r^T y) / (d - r^T z)`` and ``dx = y - z dl``. Islands are decoupled in J, so one
solve with the sum of every island's ``c`` gives each island's ``z`` on its own buses. The pattern
of J never changes, so the block LU of ``newton.py``'s workspace (``block_lu.py``) serves both solvers.

Participation (``participation``): a unit's weight is its governor gain Mbase_g / R_g (droop R_g
> 0 and Pmax > Pmin, as in the frequency model); an island without any governed unit shares by
Mbase_g. Unit limits are not enforced inside the solve (as in pandapower's distributed slack).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from plants.grid.block_lu import block_lu_factor, block_lu_solve
from plants.grid.newton import (CONVERGED, DIVERGED, MAX_ITER, MISMATCH_DIVERGED_PU, SINGULAR, VM_COLLAPSE_PU,
                                _injections_e, _jacobian_blocks)
from plants.grid.topology import DEAD


@njit(cache=True, nogil=True)
def participation(island, role, gen_bus, gen_on, mbase_mva, droop_pu, pmin_mw, pmax_mw, w_gen, alpha_bus, w_sum):
    """Normalized unit weights ``w_gen`` (sum 1 per island) and bus shares ``alpha_bus`` (see module doc).

    ``w_sum`` (n_bus) is work. Units out of service or on dead buses get 0."""
    n = island.shape[0]
    ng = gen_bus.shape[0]
    for i in range(n):
        w_sum[i] = 0.0
        alpha_bus[i] = 0.0
    for g in range(ng):
        w_gen[g] = 0.0
        b = gen_bus[g]
        if gen_on[g] != 0 and role[b] != DEAD and droop_pu[g] > 0.0 and pmax_mw[g] > pmin_mw[g]:
            w_gen[g] = mbase_mva[g] / droop_pu[g]
            w_sum[island[b]] += w_gen[g]
    for g in range(ng):   # islands without a governed unit: share by rating
        b = gen_bus[g]
        if gen_on[g] != 0 and role[b] != DEAD and w_sum[island[b]] <= 0.0:
            w_gen[g] = -max(mbase_mva[g], 1e-6)   # negative marks "fallback" until the sums are known
    for g in range(ng):
        b = gen_bus[g]
        if w_gen[g] < 0.0:
            w_sum[island[b]] -= w_gen[g]
    for g in range(ng):
        if w_gen[g] < 0.0:
            w_gen[g] = -w_gen[g]
    for g in range(ng):
        b = gen_bus[g]
        if w_gen[g] > 0.0:
            w_gen[g] /= w_sum[island[b]]
            alpha_bus[b] += w_gen[g]


@njit(cache=True, nogil=True)
def fold_lambda(island, gen_bus, w_gen, lam_pu, base_mva, p_share_mw):
    """Move each island's solved slack scalar into the units' shares: p_share_g += w_g lambda_r (MW)."""
    for g in range(gen_bus.shape[0]):
        if w_gen[g] > 0.0:
            p_share_mw[g] += w_gen[g] * lam_pu[island[gen_bus[g]]] * base_mva


@njit(cache=True, nogil=True)
def _mismatch_ds(sbus, scale, free_va, free_vm, island, slack_of_root, ds_root, alpha, lam, rank, V, I, F, f_ref):
    worst = 0.0
    n = V.shape[0]
    for i in range(n):
        s = V[i] * I[i].conjugate() - scale * sbus[i]
        p = s.real
        if ds_root[island[i]]:
            p -= alpha[i] * lam[island[i]]
        p = p if free_va[i] else 0.0
        q = s.imag if free_vm[i] else 0.0
        F[2 * rank[i]] = p
        F[2 * rank[i] + 1] = q
        a = max(abs(p), abs(q))
        if not (a <= worst):
            worst = a
    for r in range(n):
        f_ref[r] = 0.0
        if not ds_root[r]:
            continue
        b = slack_of_root[r]
        p = (V[b] * I[b].conjugate()).real - scale * sbus[b].real - alpha[b] * lam[r]
        f_ref[r] = p
        if not (abs(p) <= worst):
            worst = abs(p)
    return worst


@njit(cache=True, nogil=True)
def newton_pf_ds(indptr, indices, ydata, sbus, scale, vm, va, lam, free_va, free_vm, island, slack_of_root, ds_root,
                 alpha, ma, mm, rank, jblk, zero_blocks, b_indptr, b_indices, b_diag, b_tptr, b_tgt, b_values, b_dinv,
                 F, Z, E, V, I, f_ref, num, den, tol, max_iter, stats):
    """Distributed-slack Newton in place from the warm start (vm, va, lam) (pu, rad, pu).

    Solves for injections ``scale * sbus`` (``scale`` < 1: a continuation step). ``ds_root`` (bool,
    per root bus) selects the islands with a distributed slack (the others, if any bus of theirs is
    free, keep their single slack); ``alpha`` (per bus, sums to 1 per island) from ``participation``;
    ``lam`` (per root, pu) is the slack scalar, updated. ``Z``, ``f_ref``, ``num``, ``den`` are work; the
    others are a ``NewtonWorkspace``'s (its block LU, masks and voltage work arrays).
    ``stats`` receives [iterations, final max |F| (pu)]. Returns newton.py's status codes.
    """
    n = vm.shape[0]
    for i in range(n):
        ma[i] = 1.0 if free_va[i] else 0.0
        mm[i] = 1.0 if free_vm[i] else 0.0
    it = 0
    _injections_e(indptr, indices, ydata, vm, va, E, V, I)
    worst = _mismatch_ds(sbus, scale, free_va, free_vm, island, slack_of_root, ds_root, alpha, lam, rank, V, I, F,
                         f_ref)
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
        for k in range(2 * n):
            Z[k] = 0.0
        for i in range(n):
            if free_va[i] and ds_root[island[i]]:
                Z[2 * rank[i]] = -alpha[i]
        block_lu_solve(b_indptr, b_indices, b_diag, b_values, b_dinv, Z)
        singular = False
        for r in range(n):
            num[r] = 0.0
            if not ds_root[r]:
                continue
            b = slack_of_root[r]
            nr = f_ref[r]
            dr = -alpha[b]
            vb = V[b]
            for k in range(indptr[b], indptr[b + 1]):
                j = indices[k]
                if j == b or not (free_va[j] or free_vm[j]):
                    continue
                yv = (ydata[k] * V[j]).conjugate()
                if free_va[j]:
                    a = (-1j * vb * yv).real
                    nr -= a * F[2 * rank[j]]
                    dr -= a * Z[2 * rank[j]]
                if free_vm[j]:
                    m = (vb * yv / vm[j]).real
                    nr -= m * F[2 * rank[j] + 1]
                    dr -= m * Z[2 * rank[j] + 1]
            if not (abs(dr) > 1e-12):
                singular = True
                break
            num[r] = nr / dr
            den[r] = dr
        if singular:
            status = SINGULAR
            break
        collapsed = False
        for i in range(n):
            dl = num[island[i]]
            if free_va[i]:
                va[i] -= F[2 * rank[i]] - Z[2 * rank[i]] * dl
            if free_vm[i]:
                vm[i] -= F[2 * rank[i] + 1] - Z[2 * rank[i] + 1] * dl
                if not (vm[i] > VM_COLLAPSE_PU):
                    collapsed = True
        for r in range(n):
            if ds_root[r]:
                lam[r] -= num[r]
        it += 1
        if collapsed:
            status = DIVERGED
            break
        _injections_e(indptr, indices, ydata, vm, va, E, V, I)
        worst = _mismatch_ds(sbus, scale, free_va, free_vm, island, slack_of_root, ds_root, alpha, lam, rank, V, I,
                             F, f_ref)
    stats[0] = it
    stats[1] = worst
    return status


class DistributedSlackWorkspace:
    """Work arrays of ``newton_pf_ds`` beside a :class:`~plants.grid.newton.NewtonWorkspace` (shares its LU)."""

    def __init__(self, n_bus: int, n_gen: int):
        self.Z = np.zeros(2 * n_bus)
        self.f_ref = np.zeros(n_bus)
        self.num = np.zeros(n_bus)
        self.den = np.zeros(n_bus)
        self.lam = np.zeros(n_bus)
        self.alpha = np.zeros(n_bus)
        self.w_sum = np.zeros(n_bus)
        self.w_gen = np.zeros(n_gen)
        self.ds_root = np.zeros(n_bus, dtype=np.bool_)

    def solve(self, ws, ydata, sbus, vm, va, free_va, free_vm, island, slack_of_root, tol, max_iter,
              scale: float = 1.0) -> int:
        """Run ``newton_pf_ds`` with the LU of ``ws`` (a NewtonWorkspace); ``ws.stats`` the figures."""
        return newton_pf_ds(ws.indptr, ws.indices, ydata, sbus, float(scale), vm, va, self.lam, free_va, free_vm,
                            island, slack_of_root, self.ds_root, self.alpha, ws.ma, ws.mm, ws.rank, ws.jblk,
                            ws.zero_blocks, ws.b_indptr, ws.b_indices, ws.b_diag, ws.b_tptr, ws.b_tgt, ws.b_values,
                            ws.b_dinv, ws.F, self.Z, ws.E, ws.V, ws.I, self.f_ref, self.num, self.den, tol, max_iter,
                            ws.stats)
