"""Bus admittance matrix (per unit, CSR) with a structure fixed for the whole run.

The CSR pattern holds every bus diagonal and both off-diagonals of EVERY branch of the case,
in or out of service. Opening a breaker or moving a tap only rewrites values (an out-of-service
branch contributes explicit zeros), so the Jacobian pattern, its ordering and its symbolic LU
stay valid across line trips, reconnections and islanding: nothing is re-analysed or allocated
in the step.

The branch model is MATPOWER's / pandapower's ``makeYbus`` (pi model, ideal transformer with
complex ratio ``t = tap * exp(j shift)`` at the from end)::

    ys  = status / (r + j x);   yc = status * (g + j b)      # series, total shunt (pu)
    Yff = (ys + yc/2) / |t|^2;  Yft = -ys / conj(t)
    Ytf = -ys / t;              Ytt = ys + yc/2
    Ybus = Cf' [Yff Yft] + Ct' [Ytf Ytt] + diag((Gs + j Bs) / baseMVA)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from plants.grid.case import Case


@dataclass
class YbusPattern:
    """CSR structure of Ybus and where each branch / bus writes into ``data``.

    ``pos[l] = (ff, ft, tf, tt)`` data positions of branch l; ``diag[i]`` position of (i, i).
    Parallel branches share positions (their values add).
    """

    indptr: np.ndarray   # int64 (n_bus + 1)
    indices: np.ndarray  # int64 (nnz), sorted within each row
    pos: np.ndarray      # int64 (n_branch, 4)
    diag: np.ndarray     # int64 (n_bus)

    @property
    def nnz(self) -> int:
        return len(self.indices)


def build_pattern(n_bus: int, f_bus: np.ndarray, t_bus: np.ndarray) -> YbusPattern:
    """Ybus structure for all branches (in service or not) plus every diagonal."""
    rows = [set([i]) for i in range(n_bus)]
    for f, t in zip(f_bus.tolist(), t_bus.tolist()):
        rows[f].add(t)
        rows[t].add(f)
    indptr = np.zeros(n_bus + 1, dtype=np.int64)
    cols: list[int] = []
    where: dict[tuple[int, int], int] = {}
    for i, row in enumerate(rows):
        for j in sorted(row):
            where[(i, j)] = len(cols)
            cols.append(j)
        indptr[i + 1] = len(cols)
    pos = np.array([[where[(f, f)], where[(f, t)], where[(t, f)], where[(t, t)]]
                    for f, t in zip(f_bus.tolist(), t_bus.tolist())], dtype=np.int64).reshape(-1, 4)
    diag = np.array([where[(i, i)] for i in range(n_bus)], dtype=np.int64)
    return YbusPattern(indptr, np.asarray(cols, dtype=np.int64), pos, diag)


@njit(cache=True, nogil=True)
def branch_admittances(r, x, b, g, tap, shift_deg, status, y4):
    """Per-branch pi-model admittances (pu) into ``y4[l] = (Yff, Yft, Ytf, Ytt)`` (complex128)."""
    for l in range(r.shape[0]):
        if status[l] == 0:
            y4[l, 0] = y4[l, 1] = y4[l, 2] = y4[l, 3] = 0j
            continue
        ys = 1.0 / complex(r[l], x[l])
        yc = complex(g[l], b[l])
        ang = shift_deg[l] * np.pi / 180.0
        t = tap[l] * complex(np.cos(ang), np.sin(ang))
        ytt = ys + 0.5 * yc
        y4[l, 0] = ytt / (tap[l] * tap[l])
        y4[l, 1] = -ys / t.conjugate()
        y4[l, 2] = -ys / t
        y4[l, 3] = ytt


@njit(cache=True, nogil=True)
def fill_ybus(data, pos, diag, y4, ysh):
    """Rewrite Ybus values in place: zero, add each branch's four entries, add bus shunts ``ysh`` (pu)."""
    data[:] = 0j
    for l in range(pos.shape[0]):
        data[pos[l, 0]] += y4[l, 0]
        data[pos[l, 1]] += y4[l, 1]
        data[pos[l, 2]] += y4[l, 2]
        data[pos[l, 3]] += y4[l, 3]
    for i in range(diag.shape[0]):
        data[diag[i]] += ysh[i]


def bus_shunts_pu(case: Case) -> np.ndarray:
    """Bus shunt admittance at V = 1 pu, per unit: (Gs + j Bs) / baseMVA."""
    return (case.gs_mw + 1j * case.bs_mvar) / case.base_mva


def make_ybus(case: Case, status: np.ndarray | None = None):
    """(pattern, data, y4): Ybus of ``case`` with branch ``status`` (default: the case's)."""
    pattern = build_pattern(case.n_bus, case.f_bus, case.t_bus)
    y4 = np.zeros((case.n_branch, 4), dtype=np.complex128)
    status = case.br_status if status is None else status
    branch_admittances(case.r_pu, case.x_pu, case.b_pu, case.g_pu, case.tap, case.shift_deg,
                       status.astype(np.int8), y4)
    data = np.zeros(pattern.nnz, dtype=np.complex128)
    fill_ybus(data, pattern.pos, pattern.diag, y4, bus_shunts_pu(case))
    return pattern, data, y4


def ybus_scipy(pattern: YbusPattern, data: np.ndarray):
    """Ybus as a scipy.sparse CSR matrix (for tests and references; not used in the step)."""
    import scipy.sparse as sp
    n = len(pattern.indptr) - 1
    return sp.csr_matrix((data.copy(), pattern.indices.copy(), pattern.indptr.copy()), shape=(n, n))


def make_sbus(case: Case, gen_p_mw=None, load_scale=None) -> np.ndarray:
    """Complex bus injection (pu): in-service generation minus load, as MATPOWER's makeSbus."""
    pg = case.pg_mw if gen_p_mw is None else gen_p_mw
    on = case.gen_status > 0
    s = np.zeros(case.n_bus, dtype=np.complex128)
    np.add.at(s, case.gen_bus[on], pg[on] + 1j * case.qg_mvar[on])
    scale = 1.0 if load_scale is None else load_scale
    s -= scale * (case.pd_mw + 1j * case.qd_mvar)
    return s / case.base_mva
