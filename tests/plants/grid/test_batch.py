"""plants/grid/batch.py: the compiled series and N-1 loops against independent solves.

References: the series against NewtonWorkspace.solve called step by step from Python (the same
Newton, so agreement to round-off: 1e-12 pu) and against PYPOWER's ``newtonpf`` on the same
Ybus/Sbus (an independent Newton: 1e-9 pu, both at 1e-11 mismatch); each outage against a Ybus
rebuilt from the case with that branch's status set to 0 (make_ybus, not the stamp subtraction)
and solved by a fresh call (1e-9 pu), and the islanded set against scipy's connected components.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from plants.grid.batch import ISLANDED, solve_outages, solve_series
from plants.grid.case import PQ, PV, REF, read_matpower
from plants.grid.newton import CONVERGED, NewtonWorkspace, bus_flags
from plants.grid.ybus import make_sbus, make_ybus

from .conftest import GRIDS

TOL = 1e-11


@pytest.fixture(scope="module")
def net():
    case = read_matpower(GRIDS / "case118.m")
    pattern, ydata, y4 = make_ybus(case)
    ref, pv, pq = (np.flatnonzero(case.bus_type == t) for t in (REF, PV, PQ))
    free_va, free_vm = bus_flags(case.n_bus, ref, pv, pq)
    vm = np.ones(case.n_bus)
    va = np.radians(np.where(case.bus_type == REF, case.va_deg, 0.0))
    on = case.gen_status > 0
    vm[case.gen_bus[on]] = case.vg_pu[on]
    load_bus = np.flatnonzero((case.pd_mw != 0) | (case.qd_mvar != 0))
    sbus_fixed = make_sbus(case, load_scale=0.0)
    return dict(case=case, pattern=pattern, ydata=ydata, y4=y4, ref=ref, pv=pv, pq=pq, free_va=free_va,
                free_vm=free_vm, vm=vm, va=va, load_bus=load_bus, sbus_fixed=sbus_fixed)


def _profile(case, load_bus, steps, seed=3):
    """Loads moving 1-2 % per step (MW, Mvar), per-load noise +-0.5 %."""
    rng = np.random.default_rng(seed)
    common = np.cumprod(1.0 + rng.uniform(0.01, 0.02, steps) * rng.choice((-1.0, 1.0), steps))
    scale = common[:, None] * (1.0 + rng.uniform(-0.005, 0.005, (steps, len(load_bus))))
    return case.pd_mw[load_bus] * scale, case.qd_mvar[load_bus] * scale


def test_series_matches_step_by_step_and_pypower(net):
    case, ws = net["case"], NewtonWorkspace.for_pattern(net["pattern"].indptr, net["pattern"].indices)
    p, q = _profile(case, net["load_bus"], 40)
    vm, va = net["vm"].copy(), net["va"].copy()
    out_vm, out_va, status, iters = solve_series(ws, net["ydata"], net["sbus_fixed"], net["load_bus"], p, q,
                                                 case.base_mva, vm, va, net["free_va"], net["free_vm"], TOL, 20)
    assert (status == CONVERGED).all()
    assert iters[1:].max() >= 2          # every step really moves (1-2 % loads: not a no-op)
    np.testing.assert_array_equal(vm, out_vm[-1])
    ws2 = NewtonWorkspace.for_pattern(net["pattern"].indptr, net["pattern"].indices)
    vm2, va2 = net["vm"].copy(), net["va"].copy()
    newtonpf = pytest.importorskip("pypower.newtonpf").newtonpf
    ppoption = pytest.importorskip("pypower.ppoption").ppoption
    ybus = sp.csr_matrix((net["ydata"], net["pattern"].indices, net["pattern"].indptr))
    opt = ppoption(VERBOSE=0, PF_TOL=TOL, PF_MAX_IT=20)
    for k in range(len(p)):
        sbus = net["sbus_fixed"].copy()
        np.subtract.at(sbus, net["load_bus"], (p[k] + 1j * q[k]) / case.base_mva)
        assert ws2.solve(net["ydata"], sbus, vm2, va2, net["free_va"], net["free_vm"], TOL, 20) == CONVERGED
        assert np.abs(out_vm[k] - vm2).max() < 1e-12 and np.abs(out_va[k] - va2).max() < 1e-12
        if k % 10 == 0:
            V, ok, _ = newtonpf(ybus, sbus, net["vm"] * np.exp(1j * net["va"]), net["ref"], net["pv"], net["pq"], opt)
            assert ok
            assert np.abs(out_vm[k] * np.exp(1j * out_va[k]) - V).max() < 1e-9


def test_series_failed_step_is_reported_and_the_next_restarts_from_the_last_answer(net):
    case, ws = net["case"], NewtonWorkspace.for_pattern(net["pattern"].indptr, net["pattern"].indices)
    p, q = _profile(case, net["load_bus"], 3)
    p[1] *= 8.0                          # no operating point at 8x the load
    q[1] *= 8.0
    vm, va = net["vm"].copy(), net["va"].copy()
    out_vm, out_va, status, _ = solve_series(ws, net["ydata"], net["sbus_fixed"], net["load_bus"], p, q,
                                             case.base_mva, vm, va, net["free_va"], net["free_vm"], TOL, 20)
    assert status[0] == CONVERGED and status[1] != CONVERGED and status[2] == CONVERGED
    # step 2 from step 0's answer, solved alone
    vm2, va2 = out_vm[0].copy(), out_va[0].copy()
    sbus = net["sbus_fixed"].copy()
    np.subtract.at(sbus, net["load_bus"], (p[2] + 1j * q[2]) / case.base_mva)
    ws.solve(net["ydata"], sbus, vm2, va2, net["free_va"], net["free_vm"], TOL, 20)
    assert np.abs(out_vm[2] - vm2).max() < 1e-12 and np.abs(out_va[2] - va2).max() < 1e-12


def test_outages_match_rebuilt_ybus_and_islands_match_graph(net):
    case = net["case"]
    pat = net["pattern"]
    ws = NewtonWorkspace.for_pattern(pat.indptr, pat.indices)
    sbus = make_sbus(case)
    vm0, va0 = net["vm"].copy(), net["va"].copy()
    assert ws.solve(net["ydata"], sbus, vm0, va0, net["free_va"], net["free_vm"], TOL, 20) == CONVERGED
    branches = np.arange(case.n_branch)
    out_vm, out_va, status, _ = solve_outages(ws, net["ydata"], pat.pos, net["y4"], branches, sbus, vm0, va0,
                                              net["free_va"], net["free_vm"], TOL, 20)
    n_islanded = 0
    for b in branches:
        st = case.br_status.copy()
        st[b] = 0
        keep = st > 0
        graph = sp.coo_matrix((np.ones(keep.sum()), (case.f_bus[keep], case.t_bus[keep])), shape=(case.n_bus,) * 2)
        islands = connected_components(graph, directed=False)[0]
        if islands > 1:
            n_islanded += 1
            assert status[b] == ISLANDED and np.isnan(out_vm[b]).all()
            continue
        assert status[b] == CONVERGED, f"branch {b}: status {status[b]}"
        _, ydata_b, _ = make_ybus(case, st)
        vm, va = vm0.copy(), va0.copy()
        ref_ws = NewtonWorkspace.for_pattern(pat.indptr, pat.indices)
        assert ref_ws.solve(ydata_b, sbus, vm, va, net["free_va"], net["free_vm"], TOL, 20) == CONVERGED
        assert np.abs(out_vm[b] * np.exp(1j * out_va[b]) - vm * np.exp(1j * va)).max() < 1e-9, f"branch {b}"
    assert 0 < n_islanded < case.n_branch    # case118 has radial branches: the islanding path is exercised


def test_bad_inputs_name_the_argument(net):
    case, ws = net["case"], NewtonWorkspace.for_pattern(net["pattern"].indptr, net["pattern"].indices)
    p, q = _profile(case, net["load_bus"], 2)
    with pytest.raises(ValueError, match="p_mw/q_mvar"):
        solve_series(ws, net["ydata"], net["sbus_fixed"], net["load_bus"], p[:, :-1], q, case.base_mva,
                     net["vm"].copy(), net["va"].copy(), net["free_va"], net["free_vm"])
    with pytest.raises(ValueError, match="sn_mva"):
        solve_series(ws, net["ydata"], net["sbus_fixed"], net["load_bus"], p, q, 0.0,
                     net["vm"].copy(), net["va"].copy(), net["free_va"], net["free_vm"])
    with pytest.raises(ValueError, match="branches"):
        solve_outages(ws, net["ydata"], net["pattern"].pos, net["y4"], np.array([case.n_branch]), make_sbus(case),
                      net["vm"], net["va"], net["free_va"], net["free_vm"])
