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
Dense numpy: 300 buses take well under 10 ms; recompute only when the topology changes.
"""

from __future__ import annotations

import numpy as np

from plants.grid.case import Case

BRIDGE_TOL = 1e-9


def ptdf(case: Case, br_status: np.ndarray, slack_of_bus: np.ndarray, live: np.ndarray | None = None) -> np.ndarray:
    """PTDF (n_branch x n_bus) for closed branches ``br_status``; ``slack_of_bus[i]`` is the slack of i's island.

    ``live`` (bool, n_bus): buses in energized islands (default: all). Rows of open branches are 0.
    """
    n, nl = case.n_bus, case.n_branch
    live = np.ones(n, dtype=bool) if live is None else np.asarray(live, dtype=bool)
    b = np.where(br_status > 0, 1.0 / (case.x_pu * case.tap), 0.0)
    A = np.zeros((nl, n))
    A[np.arange(nl), case.f_bus] = 1.0
    A[np.arange(nl), case.t_bus] = -1.0
    Bf = b[:, None] * A
    Bbus = A.T @ Bf
    slacks = np.unique(slack_of_bus[live])
    keep = np.flatnonzero(live & ~np.isin(np.arange(n), slacks))
    out = np.zeros((nl, n))
    if len(keep):
        out[:, keep] = np.linalg.solve(Bbus[np.ix_(keep, keep)], Bf[:, keep].T).T
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
    """Reference DC power flow (MW per branch) by solving B theta = P directly, one island at a time."""
    n = case.n_bus
    b = np.where(br_status > 0, 1.0 / (case.x_pu * case.tap), 0.0)
    A = np.zeros((case.n_branch, n))
    A[np.arange(case.n_branch), case.f_bus] = 1.0
    A[np.arange(case.n_branch), case.t_bus] = -1.0
    Bbus = A.T @ (b[:, None] * A)
    theta = np.zeros(n)
    keep = np.flatnonzero(~np.isin(np.arange(n), np.unique(slack_of_bus)))
    theta[keep] = np.linalg.solve(Bbus[np.ix_(keep, keep)], p_inj_mw[keep] / case.base_mva)
    return b * (A @ theta) * case.base_mva
