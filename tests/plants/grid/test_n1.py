"""N-1 screening (plants/grid/n1.py): the DC/LODF screen against the plant's AC power flow, and
one AC contingency against pandapower on the same network."""

import warnings

import numpy as np
import pytest

from plants.grid.n1 import ac_outage, dc_screen, n1_ratings, operating_point, screen, unprotected

from .conftest import ROOT


@pytest.fixture(scope="module")
def stressed():
    """configs/grid118.toml's operating point at t = 0 (protection off), with its plant."""
    from hil.commands.grid import initial_inputs
    from hil.scenario.config import load_scenario

    sc = load_scenario(ROOT / "configs" / "grid118.toml")
    plant = sc.plant.load()
    return unprotected(operating_point(plant, initial_inputs(sc, plant.spec)))


def test_lodf_redistribution_matches_ac_within_five_percent_of_the_outaged_flow(stressed):
    """DC: dP_l = LODF[l, k] P_k. AC: the plant's post-outage flows. The DC model leaves out losses,
    reactive flow and voltage, and the AC model shares the change in losses among the units by
    inertia, so they differ by a few % of the flow that moved; measured 1.4-4.2 % on these
    outages (5 % of P_k is the tolerance; a wrong LODF column is off by tens of %)."""
    m = stressed
    _, lodf, islanding = m.sensitivities()
    p0 = m.out["pf_mw"].copy()
    snap = m.get_state()
    for line in (1, 20, 36, 50, 100, 150):
        k = line - 1
        assert not islanding[k]
        ac_outage(m, snap, k)
        d_ac = m.out["pf_mw"] - p0
        d_dc = lodf[:, k] * p0[k]
        err = np.abs(d_dc - d_ac)
        err[k] = 0.0
        assert err.max() <= 0.05 * abs(p0[k]), (line, err.max(), p0[k])
        assert abs(m.out["pf_mw"][k]) < 1e-9   # the outaged branch carries nothing
    m.set_state(snap)


def test_dc_screen_misses_no_ac_overload_and_finds_the_known_insecure_outages(stressed):
    """Every outage confirmed with AC: none that AC finds overloaded passes the DC screen
    unflagged (screening threshold 0.9), and the big ones the issue names are insecure."""
    r = screen(stressed, confirm="all")
    est, islanding, _ = dc_screen(stressed)
    flagged = {k + 1 for k in range(est.shape[1])
               if islanding[k] or np.nanmax(np.r_[est[:, k], -1.0]) > r.screen_loading}
    overloaded = {o.line for o in r.outages if o.verdict == "overload"}
    assert overloaded and overloaded <= flagged
    assert not r.secure
    assert {3, 7, 8, 9, 31, 33} <= {o.line for o in r.insecure}   # the whole-grid blackouts
    # the screen is a screen: most outages need no AC solve
    assert len(flagged) < 0.5 * len(r.outages)
    # every AC-confirmed outage reports a loading and a power-flow status
    assert all(np.isfinite(o.ac_max_loading) and o.pf_status for o in r.outages)


def test_derived_ratings_make_the_point_secure_and_are_tight(stressed):
    """n1_ratings' rule: margin x the largest N-1 current. With margin 1.2 the worst post-outage
    loading is 1/1.2 on at least one line (tight, not just large) and the point is secure."""
    rating, from_case = n1_ratings(stressed, np.zeros(stressed.case.n_branch), margin=1.2, floor_mva=1.0)
    assert not from_case.any()
    m = unprotected(stressed)
    m.case.rate_a_mva[:] = rating
    m.set_state(m.get_state())
    m.balance()
    r = screen(m, confirm="all")
    assert r.secure
    worst = max(o.ac_max_loading for o in r.outages)
    assert 1 / 1.2 - 1e-6 <= worst <= 1 / 1.2 + 1e-9
    # a case rating is kept as it is
    given = np.zeros(stressed.case.n_branch)
    given[4] = 12.5
    rating2, from_case2 = n1_ratings(stressed, given, margin=1.2, floor_mva=1.0)
    assert from_case2[4] and rating2[4] == 12.5 and np.array_equal(np.delete(rating2, 4), np.delete(rating, 4))


def _ppc(case, pg_mw, open_branch):
    """A PYPOWER case dict of ``case`` with the units at ``pg_mw`` and branch ``open_branch`` out."""
    n = case.n_bus
    bus = np.zeros((n, 13))
    bus[:, 0] = case.bus_id
    bus[:, 1] = case.bus_type
    bus[:, 2], bus[:, 3] = case.pd_mw, case.qd_mvar
    bus[:, 4], bus[:, 5] = case.gs_mw, case.bs_mvar
    bus[:, 6] = 1
    bus[:, 7], bus[:, 8] = case.vm_pu, case.va_deg
    bus[:, 9] = case.base_kv
    bus[:, 10] = 1
    bus[:, 11], bus[:, 12] = case.vmax_pu, case.vmin_pu
    gen = np.zeros((case.n_gen, 21))
    gen[:, 0] = case.bus_id[case.gen_bus]
    gen[:, 1], gen[:, 2] = pg_mw, case.qg_mvar
    gen[:, 3], gen[:, 4] = case.qmax_mvar, case.qmin_mvar
    gen[:, 5], gen[:, 6], gen[:, 7] = case.vg_pu, case.mbase_mva, case.gen_status
    gen[:, 8], gen[:, 9] = case.pmax_mw, case.pmin_mw
    br = np.zeros((case.n_branch, 13))
    br[:, 0], br[:, 1] = case.bus_id[case.f_bus], case.bus_id[case.t_bus]
    br[:, 2], br[:, 3], br[:, 4] = case.r_pu, case.x_pu, case.b_pu
    br[:, 5] = case.rate_a_mva
    br[:, 8] = np.where((case.tap == 1.0) & (case.shift_deg == 0.0), 0.0, case.tap)
    br[:, 9] = case.shift_deg
    br[:, 10] = 1
    br[open_branch, 10] = 0
    br[:, 11], br[:, 12] = -360, 360
    return {"version": "2", "baseMVA": case.base_mva, "bus": bus, "gen": gen, "branch": br}


def test_one_ac_contingency_matches_pandapower(stressed):
    """Line 36 (30-17, 231 MW) out: the plant's post-outage voltages against pandapower's runpp on
    the same network (converted by pandapower's own from_ppc), units at the plant's dispatch and
    pandapower's slack at the reference bus. Newton tolerance 1e-8 pu on our side: 1e-6 pu / rad."""
    pytest.importorskip("pandapower")
    import pandapower as pp
    from pandapower.converter.pypower import from_ppc

    m = stressed
    snap = m.get_state()
    k = 35
    r = ac_outage(m, snap, k)
    assert not r["dead"].any() and r["islands"] == 1
    vm, va = m.out["vm_pu"].copy(), m.out["va_deg"].copy()
    pg = m.out["p_gen_mw"].copy()
    m.set_state(snap)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = from_ppc(_ppc(m.case, pg, k), f_hz=50)
        pp.runpp(net, tolerance_mva=1e-9, max_iteration=30)
    order = np.argsort(net.bus.index.to_numpy())
    assert len(order) == m.case.n_bus
    assert np.abs(net.res_bus.vm_pu.to_numpy()[order] - vm).max() < 1e-6
    assert np.abs(np.radians(net.res_bus.va_degree.to_numpy()[order] - va)).max() < 1e-6
    ref = int(np.flatnonzero(m.case.bus_type == 3)[0])
    slack_gen = int(np.flatnonzero(m.case.gen_bus == ref)[0])
    assert abs(float(net.res_ext_grid.p_mw.sum()) - pg[slack_gen]) < 1e-3   # MW


def test_without_ac_confirmation_flagged_outages_fail_closed(stressed):
    r = screen(stressed, confirm="none")
    assert not r.secure
    assert {o.verdict for o in r.insecure} == {"unconfirmed"}
    assert not any(o.critical for o in r.outages) and all(o.flagged for o in r.insecure)
    with pytest.raises(ValueError, match="confirm: 'some'"):
        screen(stressed, confirm="some")
