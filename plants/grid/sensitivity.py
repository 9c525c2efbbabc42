"""DC sensitivities of the current topology: PTDF and LODF (for state-dependent line limits).

DC model (MATPOWER ``makeBdc``, phase shifts left out: they shift flows, not sensitivities)::

    b_l = status_l / (x_l * tap_l);   Bf = diag(b) (Cf - Ct);   Bbus = (Cf - Ct)' Bf
    PTDF = Bf * [Bbus restricted to non-slack live buses]^-1   (slack and dead columns 0)

``PTDF[l, i]`` is the MW change of the flow on line l (from -> to) per MW injected at bus i and
withdrawn at the slack of i's island. With several islands each island has its own slack (the
one the power flow uses); a bus in a dead island has a zero column.

``LODF[l, k]`` is the change of flow on l per MW that flowed on k before k opens::

    LODF[:, k] = PTDF (e_f(k) - e_t(k)) / (1 - PTDF[k] (e_f(k) - e_t(k))),   LODF[k, k] = -1

An outage that would island the network (denominator ~0: k is a bridge) has no finite LODF;
its column is 0 and ``islanding[k]`` is True, so a caller treats it as a topology change.
PTDF by the fixed-pattern sparse LU of ``sparse_lu.py`` (one factorization, one solve per branch);
LODF by indexing. Recompute only when the topology changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from plants.grid.case import Case
from plants.grid.sparse_lu import block_structure, lu_factor, lu_solve, minimum_degree_order
from plants.grid.ybus import build_pattern

BRIDGE_TOL = 1e-9


@dataclass
class PtdfWorkspace:
    """Ordering and symbolic LU of the DC B matrix for one case (all branches in the pattern)."""

    rank: np.ndarray
    pos: np.ndarray        # (n_branch, 4) LU data positions of (f,f), (f,t), (t,f), (t,t)
    lu_indptr: np.ndarray
    lu_indices: np.ndarray
    lu_diag: np.ndarray
    lu_values: np.ndarray
    work: np.ndarray
    x: np.ndarray

    @classmethod
    def for_case(cls, case: Case) -> "PtdfWorkspace":
        pattern = build_pattern(case.n_bus, case.f_bus, case.t_bus)
        n = case.n_bus
        neighbours = [set(pattern.indices[pattern.indptr[i]:pattern.indptr[i + 1]].tolist()) for i in range(n)]
        order, filled = minimum_degree_order(n, neighbours)
        lu, rank = block_structure(n, filled, order, 1)
        pos = np.array([[lu.position(rank[f], rank[f]), lu.position(rank[f], rank[t]),
                         lu.position(rank[t], rank[f]), lu.position(rank[t], rank[t])]
                        for f, t in zip(case.f_bus.tolist(), case.t_bus.tolist())], dtype=np.int64).reshape(-1, 4)
        return cls(rank, pos, lu.indptr, lu.indices, lu.diag, np.zeros(lu.nnz), np.zeros(n), np.zeros(n))


@njit(cache=True, nogil=True)
def _ptdf_kernel(f_bus, t_bus, b, fixed, rank, pos, lu_indptr, lu_indices, lu_diag, lu_values, work, x, out):
    """PTDF rows b_l (e_f - e_t)' B^-1 with fixed (slack, dead) buses as identity rows/zero columns.

    B is symmetric, so row l of the PTDF is b_l times the solution of B y = e_f - e_t. Returns 0, or
    -1 if B is singular (an island without a fixed bus: a caller error)."""
    lu_values[:] = 0.0
    for l in range(f_bus.shape[0]):
        if b[l] == 0.0:
            continue
        f, t = f_bus[l], t_bus[l]
        if not fixed[f]:
            lu_values[pos[l, 0]] += b[l]
        if not fixed[f] and not fixed[t]:
            lu_values[pos[l, 1]] -= b[l]
            lu_values[pos[l, 2]] -= b[l]
        if not fixed[t]:
            lu_values[pos[l, 3]] += b[l]
    for i in range(fixed.shape[0]):
        if fixed[i]:
            lu_values[lu_diag[rank[i]]] = 1.0
    if lu_factor(lu_indptr, lu_indices, lu_diag, lu_values, work) != 0:
        return -1
    n = fixed.shape[0]
    for l in range(f_bus.shape[0]):
        for i in range(n):
            out[l, i] = 0.0
        if b[l] == 0.0:
            continue
        x[:] = 0.0
        f, t = f_bus[l], t_bus[l]
        if not fixed[f]:
            x[rank[f]] = 1.0
        if not fixed[t]:
            x[rank[t]] -= 1.0
        lu_solve(lu_indptr, lu_indices, lu_diag, lu_values, x)
        for i in range(n):
            if not fixed[i]:
                out[l, i] = b[l] * x[rank[i]]
    return 0


def ptdf(case: Case, br_status: np.ndarray, slack_of_bus: np.ndarray, live: np.ndarray | None = None,
         workspace: PtdfWorkspace | None = None) -> np.ndarray:
    """PTDF (n_branch x n_bus) for closed branches ``br_status``; ``slack_of_bus[i]`` is the slack of i's island.

    ``live`` (bool, n_bus): buses in energized islands (default: all). Rows of open branches are 0.
    Numba, on the fixed-pattern sparse LU of ``sparse_lu.py`` (pass a ``PtdfWorkspace`` to reuse the
    ordering across topologies). No BLAS: multi-threaded BLAS spins against a real-time loop.
    """
    n = case.n_bus
    ws = workspace or PtdfWorkspace.for_case(case)
    live = np.ones(n, dtype=bool) if live is None else np.asarray(live, dtype=bool)
    fixed = ~live
    slacks = np.unique(slack_of_bus[live])
    fixed[slacks[slacks >= 0]] = True
    b = np.where(br_status > 0, 1.0 / (case.x_pu * case.tap), 0.0)
    out = np.zeros((case.n_branch, n))
    if _ptdf_kernel(case.f_bus, case.t_bus, b, fixed, ws.rank, ws.pos, ws.lu_indptr, ws.lu_indices, ws.lu_diag,
                    ws.lu_values, ws.work, ws.x, out) != 0:
        raise ValueError("ptdf: singular B (an island without a slack in slack_of_bus)")
    return out


def lodf(case: Case, br_status: np.ndarray, ptdf_matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(LODF n_branch x n_branch, islanding bool n_branch) from a PTDF of the same topology."""
    nl = case.n_branch
    H = ptdf_matrix[:, case.f_bus] - ptdf_matrix[:, case.t_bus]   # flow on l per MW f(k)->t(k)
    denom = 1.0 - np.diag(H)
    closed = br_status > 0
    islanding = closed & (np.abs(denom) < BRIDGE_TOL)
    ok = closed & ~islanding
    out = np.zeros((nl, nl))
    out[:, ok] = H[:, ok] / denom[ok]
    out[ok, ok] = -1.0
    out[~closed, :] = 0.0
    return out, islanding


def dc_flows(case: Case, br_status: np.ndarray, p_inj_mw: np.ndarray, slack_of_bus: np.ndarray) -> np.ndarray:
    """Reference DC power flow (MW per branch) by solving B theta = P directly (dense numpy, for tests)."""
    n, nl = case.n_bus, case.n_branch
    A = np.zeros((nl, n))
    A[np.arange(nl), case.f_bus] = 1.0
    A[np.arange(nl), case.t_bus] = -1.0
    b = np.where(br_status > 0, 1.0 / (case.x_pu * case.tap), 0.0)
    Bbus = A.T @ (b[:, None] * A)
    theta = np.zeros(n)
    keep = np.flatnonzero(~np.isin(np.arange(n), np.unique(slack_of_bus)))
    theta[keep] = np.linalg.solve(Bbus[np.ix_(keep, keep)], p_inj_mw[keep] / case.base_mva)
    return b * (A @ theta) * case.base_mva
