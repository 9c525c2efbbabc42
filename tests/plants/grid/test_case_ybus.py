"""MATPOWER reader and Ybus against pandapower's ppc conversion (fixed reference arrays)."""

import numpy as np
import pytest
import scipy.sparse as sp

from plants.grid.case import CaseFormatError, case_from_ppc, parse_matpower, read_matpower
from plants.grid.ybus import make_sbus, make_ybus, ybus_scipy

from .conftest import GRIDS


def test_ybus_matches_pandapower_reference_csr(ref118):
    case = case_from_ppc(ref118["baseMVA"], ref118["ppc_bus"], ref118["ppc_gen"], ref118["ppc_branch"])
    pattern, data, _ = make_ybus(case)
    ours = ybus_scipy(pattern, data)
    theirs = sp.csr_matrix((ref118["ybus_data"], ref118["ybus_indices"], ref118["ybus_indptr"]),
                           shape=tuple(ref118["ybus_shape"]))
    # Same formula, same float64 operations up to summation order: 1e-12 pu of entries up to ~390 pu.
    assert abs(ours - theirs).max() < 1e-12
    # The reference includes transformers (tap 0.935..0.985) and pandapower's magnetizing conductance.
    assert np.count_nonzero(case.tap != 1.0) > 0 and np.count_nonzero(case.g_pu) == 4


def test_sbus_matches_reference_where_power_flow_uses_it(ref118):
    case = case_from_ppc(ref118["baseMVA"], ref118["ppc_bus"], ref118["ppc_gen"], ref118["ppc_branch"])
    s = make_sbus(case)
    pvpq = np.r_[ref118["pv"], ref118["pq"]]
    # ppc_gen's Qg holds solved values, so Q is compared at PQ buses only (what the power flow reads).
    assert np.abs(s.real[pvpq] - ref118["sbus_pu"].real[pvpq]).max() < 1e-12
    assert np.abs(s.imag[ref118["pq"]] - ref118["sbus_pu"].imag[ref118["pq"]]).max() < 1e-12


@pytest.mark.parametrize("name, n_bus, n_gen, n_branch", [("case14", 14, 5, 20), ("case118", 118, 54, 186),
                                                          ("case300", 300, 69, 411)])
def test_shipped_cases_read(name, n_bus, n_gen, n_branch):
    case = read_matpower(GRIDS / f"{name}.m")
    assert (case.n_bus, case.n_gen, case.n_branch) == (n_bus, n_gen, n_branch)
    assert case.base_mva == 100.0
    assert np.all(case.tap > 0)  # MATPOWER's tap 0 (a line) became ratio 1


def test_case14_transformer_and_shunt_fields():
    case = read_matpower(GRIDS / "case14.m")
    i = np.flatnonzero((case.bus_id[case.f_bus] == 4) & (case.bus_id[case.t_bus] == 7))[0]
    assert case.tap[i] == pytest.approx(0.978) and case.r_pu[i] == 0 and case.x_pu[i] == pytest.approx(0.20912)
    assert case.bs_mvar[case.bus_index(9)] == 19.0
    pattern, data, y4 = make_ybus(case)
    # Transformer 4-7: Yft = -ys / tap, Yff = ys / tap^2 (no charging).
    ys = 1 / (1j * 0.20912)
    assert y4[i, 1] == pytest.approx(-ys / 0.978) and y4[i, 0] == pytest.approx(ys / 0.978 ** 2)
    # Bus 9's shunt (19 MVAr at 1 pu) sits on the diagonal.
    k = case.bus_index(9)
    assert ybus_scipy(pattern, data)[k, k].imag == pytest.approx(
        sum(y4[l, 0].imag for l in np.flatnonzero(case.f_bus == k))
        + sum(y4[l, 3].imag for l in np.flatnonzero(case.t_bus == k)) + 0.19)


def test_out_of_service_branch_keeps_pattern_with_zero_values():
    case = read_matpower(GRIDS / "case14.m")
    p1, d1, _ = make_ybus(case)
    status = case.br_status.copy()
    status[0] = 0
    p2, d2, _ = make_ybus(case, status)
    assert np.array_equal(p1.indices, p2.indices) and np.array_equal(p1.indptr, p2.indptr)
    assert d2[p2.pos[0, 1]] == 0 and d1[p1.pos[0, 1]] != 0


@pytest.mark.parametrize("text, reason", [
    ("mpc.baseMVA = 100; mpc.bus = [1 3 0 0 0 0 1 1 0 0 1 1.1 0.9]; mpc.gen = [1 0 0 0 0 1 100 1 10 0];",
     "mpc.branch is missing"),
    ("mpc.baseMVA = 1x0; mpc.bus = [1]; mpc.gen = [1]; mpc.branch = [1];", "mpc.baseMVA"),
    ("mpc.baseMVA = 100; mpc.bus = [1 3 a];", "mpc.bus: cannot read row"),
])
def test_bad_case_text_names_field(text, reason):
    with pytest.raises(CaseFormatError, match=reason):
        parse_matpower(text, "bad.m")


def test_branch_to_unknown_bus_is_named():
    bus = [[1, 3, 0, 0, 0, 0, 1, 1, 0, 100, 1, 1.1, 0.9]]
    gen = [[1, 0, 0, 0, 0, 1, 100, 1, 10, 0]]
    branch = [[1, 7, 0.01, 0.1, 0, 0, 0, 0, 0, 0, 1, -360, 360]]
    with pytest.raises(CaseFormatError, match="refers to bus 7"):
        case_from_ppc(100, bus, gen, branch)


def test_phase_shifter_and_tap_match_pandapower_makeybus():
    """Taps and phase shifts (none in the shipped cases) against pandapower's own makeYbus."""
    pytest.importorskip("pandapower")
    from pandapower.pypower.makeYbus import makeYbus

    text = (GRIDS / "case14.m").read_text()
    data = parse_matpower(text)
    branch = np.zeros((data["branch"].shape[0], 26))
    branch[:, :13] = data["branch"]
    k = int(np.flatnonzero((branch[:, 0] == 4) & (branch[:, 1] == 7))[0])
    branch[k, 9] = -7.5            # phase shift, degrees
    branch[2, 8], branch[2, 9] = 1.03, 4.0   # an off-nominal line-type branch with shift too
    bus = data["bus"].copy()
    case = case_from_ppc(data["baseMVA"], bus, data["gen"], branch)
    pattern, ours, _ = make_ybus(case)
    ppc_bus = bus.copy()
    ppc_bus[:, 0] -= 1
    ppc_branch = branch.copy()
    ppc_branch[:, :2] -= 1
    theirs, _, _ = makeYbus(data["baseMVA"], ppc_bus, ppc_branch)
    assert abs(ybus_scipy(pattern, ours) - theirs).max() < 1e-12
    assert not np.allclose(ybus_scipy(pattern, ours).toarray(), ybus_scipy(pattern, ours).toarray().T)  # shifters
