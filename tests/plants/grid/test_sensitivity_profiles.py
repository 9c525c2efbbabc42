"""PTDF/LODF against DC power flows; CSV profiles."""

import numpy as np
import pytest

from plants.grid.case import read_matpower
from plants.grid.network import GridModel
from plants.grid.profiles import ProfileError, read_profile
from plants.grid.sensitivity import dc_flows, lodf, ptdf

from .conftest import GRIDS


@pytest.fixture(scope="module")
def c118():
    return read_matpower(GRIDS / "case118.m")


def _balanced_injection(case, slack, seed):
    p = np.random.default_rng(seed).normal(0, 50, case.n_bus)
    p[slack] -= p.sum()
    return p


def test_ptdf_matches_dc_power_flow(c118):
    slack = np.full(c118.n_bus, c118.bus_index(69))
    H = ptdf(c118, c118.br_status, slack)
    for seed in range(3):
        p = _balanced_injection(c118, slack[0], seed)
        # Same linear model, different factorization: agree to float precision (1e-9 MW on ~500 MW).
        assert np.abs(H @ p - dc_flows(c118, c118.br_status, p, slack)).max() < 1e-9


def test_lodf_predicts_post_outage_dc_flows(c118):
    slack = np.full(c118.n_bus, c118.bus_index(69))
    H = ptdf(c118, c118.br_status, slack)
    L, islanding = lodf(c118, c118.br_status, H)
    p = _balanced_injection(c118, slack[0], 7)
    before = H @ p
    checked = 0
    for k in range(0, c118.n_branch, 7):
        if islanding[k]:
            continue
        status = c118.br_status.copy()
        status[k] = 0
        after = dc_flows(c118, status, p, slack)
        assert np.abs(before + L[:, k] * before[k] - after).max() < 1e-8
        checked += 1
    assert checked > 20
    # Radial lines (e.g. 9-10 to the unit at bus 10, 116-68 to bus 116) island the network on outage.
    radial = [int(np.flatnonzero((c118.bus_id[c118.f_bus] == f) & (c118.bus_id[c118.t_bus] == t))[0])
              for f, t in ((9, 10), (68, 116))]
    assert islanding[radial].all() and not L[:, radial].any()


def test_model_sensitivities_follow_a_trip():
    case = read_matpower(GRIDS / "case118.m")
    model = GridModel(case)
    H0, _, _ = model.sensitivities()
    model.cmd_open[7] = 1
    model.step(1.0)
    H1, L1, _ = model.sensitivities()
    status = case.br_status.copy()
    status[7] = 0
    slack = np.full(case.n_bus, case.bus_index(69))
    assert np.abs(H1 - ptdf(case, status, slack)).max() < 1e-12
    assert not H1[7].any() and np.abs(H1 - H0).max() > 0.05


def test_profile_interpolates_and_maps_columns(tmp_path):
    case = read_matpower(GRIDS / "case14.m")
    path = tmp_path / "p.csv"
    path.write_text("time_s,load,load.14,gen.2\n0,1.0,1.0,0.5\n100,1.2,0.5,1.0\n")
    prof = read_profile(path, case)
    load, gen = np.zeros(case.n_bus), np.zeros(case.n_gen)
    prof.at(50.0, load, gen)
    assert load[case.bus_index(3)] == pytest.approx(1.1)
    # Columns multiply per row (1.0 * 1.0, 1.2 * 0.5), then rows interpolate: (1.0 + 0.6) / 2.
    assert load[case.bus_index(14)] == pytest.approx(0.8)
    assert gen[1] == pytest.approx(0.75) and gen[0] == 1.0
    prof.at(500.0, load, gen)
    assert load[case.bus_index(14)] == pytest.approx(0.6) and gen[1] == 1.0


@pytest.mark.parametrize("text, reason", [
    ("t,load\n0,1\n", "time_s"),
    ("time_s,load\n0,1\n0,2\n", "strictly increasing"),
    ("time_s,load.99\n0,1\n", "no bus '99'"),
    ("time_s,gen.9\n0,1\n", "generator rows are 1..5"),
    ("time_s,load\n0,-1\n", "finite and >= 0"),
    ("time_s,wind\n0,1\n", "expected load"),
])
def test_profile_errors_name_the_column(tmp_path, text, reason):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ProfileError, match=reason):
        read_profile(path, read_matpower(GRIDS / "case14.m"))


def test_sensitivities_cached_until_topology_changes():
    model = GridModel(read_matpower(GRIDS / "case14.m"))
    first = model.sensitivities()
    model.step(1.0)
    assert model.sensitivities()[0] is first[0]          # same topology: no recomputation
    model.cmd_open[0] = 1
    model.step(1.0)
    again = model.sensitivities()
    assert again[0] is not first[0] and not again[0][0].any()


def test_profile_drives_the_model(tmp_path):
    case = read_matpower(GRIDS / "case14.m")
    path = tmp_path / "p.csv"
    path.write_text("time_s,load\n0,1.0\n10,1.1\n")
    model = GridModel(case)
    model.profile = read_profile(path, case)
    model.load_shed[case.bus_index(14)] = 0.5
    for _ in range(5):
        model.step(1.0)
    # t = 5 s: profile 1.05; bus 14 half shed.
    assert model.out["served_load_mw"][0] == pytest.approx(1.05 * (case.pd_mw.sum() - 0.5 * 14.9))
