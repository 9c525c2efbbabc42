"""Newton-Raphson power flow against pandapower's and PYPOWER's solutions."""

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from plants.grid.case import PQ, PV, REF, case_from_ppc, read_matpower
from plants.grid.newton import CONVERGED, DIVERGED, MAX_ITER, SINGULAR, NewtonWorkspace, bus_flags
from plants.grid.sparse_lu import block_structure, lu_factor, lu_solve, minimum_degree_order
from plants.grid.ybus import make_sbus, make_ybus

from .conftest import GRIDS


def _start(case):
    vm = np.ones(case.n_bus)
    va = np.radians(np.where(case.bus_type == REF, case.va_deg, 0.0))
    on = case.gen_status > 0
    vm[case.gen_bus[on]] = case.vg_pu[on]
    return vm, va


def _types(case):
    return (np.flatnonzero(case.bus_type == REF), np.flatnonzero(case.bus_type == PV),
            np.flatnonzero(case.bus_type == PQ))


def test_reference_case118_vm_va(ref118):
    """On the reference Ybus/Sbus: |dVm| <= 1e-6 pu and |dVa| <= 1e-6 rad (stated goal); we get ~1e-13."""
    n = len(ref118["vm_pu"])
    ws = NewtonWorkspace.for_pattern(ref118["ybus_indptr"], ref118["ybus_indices"])
    free_va, free_vm = bus_flags(n, ref118["ref"], ref118["pv"], ref118["pq"])
    vm = np.ones(n)
    va = np.zeros(n)
    gen = ref118["ppc_gen"]
    vm[gen[:, 0].astype(int)] = gen[:, 5]
    va[ref118["ref"]] = np.radians(ref118["ppc_bus"][ref118["ref"], 8])
    status = ws.solve(ref118["ybus_data"], ref118["sbus_pu"], vm, va, free_va, free_vm, tol=1e-10)
    assert status == CONVERGED and ws.stats[1] < 1e-10
    assert np.array_equal(ref118["bus_index"], np.arange(n))  # result tables are in internal order
    assert np.abs(vm - ref118["vm_pu"]).max() < 1e-6
    assert np.abs(va - np.radians(ref118["va_degree"])).max() < 1e-6
    assert np.abs(vm * np.exp(1j * va) - ref118["V_internal"]).max() < 1e-10


def test_shipped_case118_file_matches_pypower(ref118):
    """Reader + Ybus + NR on configs/grids/case118.m against PYPOWER's runpf of the same MATPOWER case."""
    case = read_matpower(GRIDS / "case118.m")
    pattern, ydata, _ = make_ybus(case)
    ws = NewtonWorkspace.for_pattern(pattern.indptr, pattern.indices)
    free_va, free_vm = bus_flags(case.n_bus, *_types(case))
    vm, va = _start(case)
    assert ws.solve(ydata, make_sbus(case), vm, va, free_va, free_vm, tol=1e-10) == CONVERGED
    assert np.abs(vm - ref118["pypower_vm"]).max() < 1e-6
    assert np.abs(va - np.radians(ref118["pypower_va_deg"])).max() < 1e-6


def test_warm_start_converges_in_fewer_iterations(ref118):
    n = len(ref118["vm_pu"])
    ws = NewtonWorkspace.for_pattern(ref118["ybus_indptr"], ref118["ybus_indices"])
    free_va, free_vm = bus_flags(n, ref118["ref"], ref118["pv"], ref118["pq"])
    vm, va = ref118["vm_pu"].copy(), np.radians(ref118["va_degree"])
    assert ws.solve(ref118["ybus_data"], ref118["sbus_pu"] * 1.01, vm, va, free_va, free_vm) == CONVERGED
    assert ws.stats[0] <= 3


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pandapower on its own bundled cases
@pytest.mark.parametrize("name", ["case14", "case118", "case300"])
def test_pandapower_cases(name):
    """pandapower's own conversion of its caseN (ppc arrays) solved by us vs its runpp result."""
    pp = pytest.importorskip("pandapower")
    import pandapower.networks as pn

    net = getattr(pn, name)()
    pp.runpp(net, tolerance_mva=1e-10)
    ppc = net._ppc
    internal = ppc["internal"]
    case = case_from_ppc(ppc["baseMVA"], ppc["bus"], ppc["gen"], ppc["branch"])
    pattern, ydata, _ = make_ybus(case)
    ours = sp.csr_matrix((ydata, pattern.indices, pattern.indptr), shape=(case.n_bus,) * 2)
    assert abs(ours - internal["Ybus"]).max() < 1e-9
    ws = NewtonWorkspace.for_pattern(pattern.indptr, pattern.indices)
    free_va, free_vm = bus_flags(case.n_bus, internal["ref"], internal["pv"], internal["pq"])
    V = internal["V"]
    vm = np.ones(case.n_bus)
    vm[np.r_[internal["ref"], internal["pv"]]] = np.abs(V[np.r_[internal["ref"], internal["pv"]]])
    va = np.zeros(case.n_bus)
    va[internal["ref"]] = np.angle(V[internal["ref"]])
    assert ws.solve(ydata, internal["Sbus"], vm, va, free_va, free_vm, tol=1e-10, max_iter=20) == CONVERGED
    assert np.abs(vm - np.abs(V)).max() < 1e-6
    assert np.abs(va - np.angle(V)).max() < 1e-6


def test_sparse_lu_matches_scipy_on_a_jacobian(ref118):
    """The scalar fixed-pattern LU (sensitivity.py's) solves J x = b like SuperLU does (J from a real
    iterate, 236 x 236, in the scalar pattern of the same bus order as the Newton workspace)."""
    n = len(ref118["vm_pu"])
    ws = NewtonWorkspace.for_pattern(ref118["ybus_indptr"], ref118["ybus_indices"])
    free_va, free_vm = bus_flags(n, ref118["ref"], ref118["pv"], ref118["pq"])
    vm, va = np.ones(n), np.zeros(n)
    ws.solve(ref118["ybus_data"], ref118["sbus_pu"], vm, va, free_va, free_vm, max_iter=1)   # a real iterate
    from plants.grid.newton import _injections_e, _jacobian_blocks
    _injections_e(ws.indptr, ws.indices, ref118["ybus_data"], vm, va, ws.E, ws.V, ws.I)
    _jacobian_blocks(ws.indptr, ws.indices, ref118["ybus_data"], vm, free_va, free_vm, free_va.astype(float),
                     free_vm.astype(float), ws.rank, ws.jblk, ws.zero_blocks, ws.b_diag, ws.b_values, ws.E, ws.V, ws.I)
    A = sp.bsr_matrix((ws.b_values.reshape(-1, 2, 2).copy(), ws.b_indices, ws.b_indptr), shape=(2 * n, 2 * n)).tocsr()
    indptr, indices = ref118["ybus_indptr"].astype(np.int64), ref118["ybus_indices"].astype(np.int64)
    neighbours = [set(indices[indptr[i]:indptr[i + 1]].tolist()) | {i} for i in range(n)]
    for i in range(n):
        for j in list(neighbours[i]):
            neighbours[j].add(i)
    order, filled = minimum_degree_order(n, neighbours)
    lu, rank = block_structure(n, filled, order, 2)
    assert np.array_equal(rank, ws.rank)
    rows = np.repeat(np.arange(2 * n), np.diff(lu.indptr))
    values = np.asarray(A[rows, lu.indices]).ravel()
    assert np.isclose(np.abs(values).sum(), np.abs(A.data).sum())   # the pattern holds every entry of J
    b = np.random.default_rng(1).normal(size=2 * n)
    x = b.copy()
    work = np.zeros(2 * n)
    assert lu_factor(lu.indptr, lu.indices, lu.diag, values, work) == 0
    lu_solve(lu.indptr, lu.indices, lu.diag, values, x)
    assert np.abs(x - spla.spsolve(A.tocsc(), b)).max() < 1e-9
    assert not work.any()  # the scatter buffer is left clean for the next factorization


def test_overloaded_network_reports_non_convergence_without_nan(ref118):
    n = len(ref118["vm_pu"])
    ws = NewtonWorkspace.for_pattern(ref118["ybus_indptr"], ref118["ybus_indices"])
    free_va, free_vm = bus_flags(n, ref118["ref"], ref118["pv"], ref118["pq"])
    vm, va = ref118["vm_pu"].copy(), np.radians(ref118["va_degree"])
    status = ws.solve(ref118["ybus_data"], ref118["sbus_pu"] * 8.0, vm, va, free_va, free_vm, max_iter=15)
    # 8x the load has no solution: reported as a status (the caller restores its warm start), no exception.
    assert status in (MAX_ITER, SINGULAR, DIVERGED)
    assert not ws.stats[1] < 1e-8 and 0 < ws.stats[0] <= 15


def test_q_limits_match_pandapower_enforce_q_lims():
    """PV -> PQ switching (GridParams.enforce_q_limits) vs pandapower runpp(enforce_q_lims=True)."""
    import warnings

    pp = pytest.importorskip("pandapower")
    import pandapower.networks as pn

    from plants.grid.network import GridModel, GridParams

    net = pn.case14()
    net.gen.loc[net.gen.bus == 7, "max_q_mvar"] = 10.0
    net.gen.loc[net.gen.bus == 2, "max_q_mvar"] = 15.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pp.runpp(net, tolerance_mva=1e-10)              # ppc taken before any switching
        ppc = net._ppc
        case = case_from_ppc(ppc["baseMVA"], ppc["bus"], ppc["gen"], ppc["branch"])
        pp.runpp(net, tolerance_mva=1e-10, enforce_q_lims=True)
    model = GridModel(case, GridParams(enforce_q_limits=True, max_share_rounds=0))
    model.step(1.0)
    out = model.out
    # pandapower switches buses 2 and 7 (0-based) and then bus 1, whose unit reaches its 50 MVAr.
    assert sorted(np.flatnonzero(out["q_limited"]).tolist()) == [1, 2, 7]
    assert np.abs(out["vm_pu"] - net.res_bus.vm_pu.values).max() < 1e-6
    assert np.abs(np.radians(out["va_deg"] - net.res_bus.va_degree.values)).max() < 1e-6
    q_at = {int(b): q for b, q in zip(case.gen_bus, out["q_gen_mvar"])}
    assert q_at[1] == pytest.approx(50.0) and q_at[2] == pytest.approx(15.0) and q_at[7] == pytest.approx(10.0)
    # Without enforcement the same units exceed their limits.
    free = GridModel(case, GridParams(max_share_rounds=0))
    free.step(1.0)
    assert not free.out["q_limited"].any()
    assert {int(b): q for b, q in zip(case.gen_bus, free.out["q_gen_mvar"])}[7] > 17.0
