"""Grid step: protection timing, cascade, islands, blackout, snapshots, thermal."""

import numpy as np
import pytest

from plants.grid.case import read_matpower
from plants.grid.network import PF_COLLAPSED, PF_CONVERGED, GridModel, GridParams
from plants.grid.topology import DEAD, SLACK

from .conftest import GRIDS


def case14():
    return read_matpower(GRIDS / "case14.m")


def line(case, f, t):
    return int(np.flatnonzero((case.bus_id[case.f_bus] == f) & (case.bus_id[case.t_bus] == t))[0])


def rated_for(case, k, loading):
    """case14 with only line k rated, so that its base-case loading is ``loading``."""
    i_pu = GridModel(case).out["i_pu"][k]
    case.rate_a_mva[:] = 0.0
    case.rate_a_mva[k] = i_pu * case.base_mva / loading
    return case


def run(model, steps, dt=1.0, each=None):
    status = []
    for s in range(steps):
        if each:
            each(model, s)
        model.step(dt)
        status.append(model.out["br_status"].copy())
    return np.array(status)


@pytest.mark.parametrize("allowed", [0, 2, 5])
def test_soft_overflow_trips_after_allowed_steps_exactly(allowed):
    """Grid2Op semantics: loading 1.5 > soft (1.0): the line opens in step allowed + 1, not before."""
    c = case14()
    k = line(c, 2, 3)
    model = GridModel(rated_for(c, k, 1.5), GridParams(overflow_allowed_steps=allowed))
    assert model.out["loading"][k] == pytest.approx(1.5)
    status = run(model, allowed + 3)[:, k]
    assert status.tolist() == [1] * allowed + [0] * 3


def test_hard_overflow_trips_at_once_and_cooldown_blocks_reclose():
    """Loading 2.5 > hard (2.0) trips in the same step; with cooldown 3 a close asked every step is
    rejected for 2 steps and applied in the 3rd, where the line trips again at once."""
    c = case14()
    k = line(c, 2, 3)
    model = GridModel(rated_for(c, k, 2.5), GridParams(cooldown_steps=3, overflow_allowed_steps=10))
    trips, status = [], []
    for _ in range(8):
        model.cmd_close[k] = 1
        model.step(1.0)
        trips.append(int(model.out["tripped_this_step"][0]))
        status.append(int(model.out["br_status"][k]))
    assert trips == [1, 0, 0, 1, 0, 0, 1, 0]
    assert status == [0] * 8


def test_reclose_after_cooldown_holds_when_not_overloaded():
    c = case14()
    k = line(c, 2, 3)
    model = GridModel(c, GridParams(cooldown_steps=2))
    model.cmd_open[k] = 1
    model.step(1.0)
    model.cmd_open[k] = 0
    assert model.out["br_status"][k] == 0
    model.cmd_close[k] = 1
    model.step(1.0)   # an operator's open sets no cooldown: the close applies at once
    assert model.out["br_status"][k] == 1


def test_temperature_follows_first_order_and_trips():
    c = case14()
    k = line(c, 2, 3)
    model = GridModel(rated_for(c, k, 1.0), GridParams(overflow_allowed_steps=10 ** 6, temp_trip_c=70.0))
    model.tau_thermal_s[:] = 60.0
    temps = [model.out["temp_c"][k]]
    for _ in range(30):
        model.step(10.0)
        temps.append(model.out["temp_c"][k])
        if model.out["br_status"][k] == 0:
            break
    # T = 25 + 50 (1 - exp(-t / 60)) at loading 1.0 (within the loading's drift from frequency changes).
    t = 10.0 * np.arange(len(temps))
    expected = 25 + 50 * (1 - np.exp(-t / 60.0))
    assert np.abs(np.array(temps[:-1]) - expected[:-1]).max() < 0.05
    # 70 C is reached after t = -60 ln(0.1) = 138 s; the trip acts in the next step's protection round.
    assert model.out["br_status"][k] == 0 and 140.0 <= model.state["t_s"][0] <= 160.0


def test_cascade_case14_ends_in_stated_islands():
    """case14, every line rated 1.25 x its base-case current (at least 10 MVA), Grid2Op thresholds
    (soft 100 % for > 2 steps, hard 200 %), line 1-2 opened at t = 0, 12 steps of 1 s."""
    c = case14()
    base = GridModel(c).out["i_pu"]
    c.rate_a_mva[:] = np.maximum(1.25 * base * c.base_mva, 10.0)
    model = GridModel(c)
    model.cmd_open[line(c, 1, 2)] = 1
    trips = []
    for _ in range(12):
        model.step(1.0)
        model.cmd_open[:] = 0
        trips.append(int(model.out["tripped_this_step"][0]))
        assert np.isfinite(model.out["vm_pu"]).all() and np.isfinite(model.out["pf_mw"]).all()
    island = model.out["island"]
    groups = {int(r): sorted(c.bus_id[island == r].tolist()) for r in np.unique(island[island >= 0])}
    assert trips == [4, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0]
    # Step 1: 1-5 (hard, > 200 %) opens and bus 1's 232 MW unit is islanded with no load; that island
    # over-frequency trips (> 2.5 Hz) and the rest sags to ~48.7 Hz under droop. 6-11, 7-8, 13-14 also
    # trip hard in the cascade rounds. Step 4: the lines that stayed over 100 % for 3 steps open.
    assert list(groups.values()) == [[2, 3, 4, 5, 6, 12, 13], [8]]
    assert sorted(c.bus_id[island < 0].tolist()) == [1, 7, 9, 10, 11, 14]
    opened = [(int(c.bus_id[c.f_bus[l]]), int(c.bus_id[c.t_bus[l]])) for l in np.flatnonzero(model.out["br_status"] == 0)]
    assert opened == [(1, 2), (1, 5), (4, 7), (4, 9), (6, 11), (7, 8), (7, 9), (9, 10), (9, 14), (13, 14)]
    assert model.out["n_islands"][0] == 2 and model.out["blackout"][0] == 0
    assert model.out["unserved_load_mw"][0] == pytest.approx(29.5 + 9.0 + 3.5 + 14.9)
    assert model.out["freq_hz"][c.bus_index(2)] == pytest.approx(48.68, abs=0.01)


def test_islands_dead_and_energized():
    c = case14()
    model = GridModel(c)
    for f, t in ((9, 14), (13, 14), (7, 8)):
        model.cmd_open[line(c, f, t)] = 1
    model.step(1.0)
    o = model.out
    b14, b8 = c.bus_index(14), c.bus_index(8)
    assert o["island"][b14] == -1 and o["role"][b14] == DEAD and o["vm_pu"][b14] == 0.0 and o["freq_hz"][b14] == 0.0
    assert o["role"][b8] == SLACK and o["island"][b8] == b8 and o["vm_pu"][b8] == pytest.approx(c.vg_pu[c.gen_bus == b8][0])
    assert o["n_islands"][0] == 2 and o["unserved_load_mw"][0] == pytest.approx(14.9)
    H, L, islanding = model.sensitivities()
    assert np.all(H[:, b14] == 0) and islanding[line(c, 1, 2)] == False  # noqa: E712


def test_non_convergence_is_a_clear_blackout_state():
    model = GridModel(case14())
    model.load_scale[:] = 6.0
    model.step(1.0)
    o = model.out
    assert o["collapsed_this_step"][0] >= 1 and o["blackout"][0] == 1 and o["n_islands"][0] == 0
    for key, arr in o.items():
        assert np.isfinite(arr).all(), key
    assert not o["vm_pu"].any() and o["served_load_mw"][0] == 0.0
    model.load_scale[:] = 1.0
    model.step(1.0)
    assert o["blackout"][0] == 1           # latched: a collapse does not clear itself
    model.black_start()
    model.step(1.0)
    assert o["blackout"][0] == 0 and o["n_islands"][0] == 1 and o["vm_pu"].min() > 0.9


def test_snapshot_replay_is_bit_identical():
    c = case14()
    base = GridModel(c).out["i_pu"]
    c.rate_a_mva[:] = np.maximum(1.25 * base * c.base_mva, 10.0)
    model = GridModel(c)
    model.cmd_open[line(c, 1, 2)] = 1
    model.step(1.0)
    model.cmd_open[:] = 0
    snap = model.get_state()
    first = []
    for _ in range(5):
        model.step(1.0)
        first.append({k: v.copy() for k, v in model.out.items()})
    model.set_state(snap)
    for ref in first:
        model.step(1.0)
        for k, v in model.out.items():
            assert np.array_equal(v, ref[k]), k


@pytest.mark.parametrize("kw, reason", [({"governor_tg_s": 0.0}, "governor_tg_s"), ({"hard_limit": 0.5}, "hard_limit"),
                                        ({"max_iter": 0}, "max_iter"), ({"agc_ki": -1.0}, "agc_ki")])
def test_bad_parameters_are_named(kw, reason):
    with pytest.raises(ValueError, match=reason):
        GridParams(**kw)


def test_runtime_tap_change_equals_a_case_built_with_that_tap():
    c = case14()
    k = line(c, 4, 7)
    model = GridModel(c, GridParams(max_share_rounds=0))
    model.tap[k] = 1.02
    model.step(1.0)   # dispatch of this step uses the governor state at its start (zero): a pure flow
    c2 = case14()
    c2.tap[k] = 1.02
    fresh = GridModel(c2, GridParams(max_share_rounds=0))
    fresh.gen_p_set_mw[:] = model.gen_p_set_mw
    fresh.step(1.0)
    assert np.abs(model.out["vm_pu"] - fresh.out["vm_pu"]).max() < 1e-9
    assert abs(model.out["vm_pu"][c.bus_index(7)] - GridModel(case14()).out["vm_pu"][c.bus_index(7)]) > 1e-3


def test_garbled_inputs_never_reach_the_outputs():
    c = case14()
    model = GridModel(c)
    model.load_scale[3] = np.nan
    model.load_shed[4] = np.inf
    model.gen_scale[1] = np.nan
    model.gen_p_set_mw[2] = np.nan
    model.gen_v_set_pu[0] = np.inf
    model.step(1.0)
    o = model.out
    for key, arr in o.items():
        assert np.isfinite(arr).all(), key
    assert o["blackout"][0] == 0 and o["n_islands"][0] == 1
    assert o["vm_pu"][c.gen_bus[0]] == pytest.approx(c.vg_pu[0])    # bad setpoint ignored
    # A non-finite scale or shed reads as nominal (scale 1, no shed); a non-finite P setpoint as Pmin.
    assert o["served_load_mw"][0] == pytest.approx(c.pd_mw.sum())
    assert o["p_gen_mw"][2] == pytest.approx(c.pmin_mw[2], abs=1.0)


def test_collapse_of_one_island_leaves_the_other_energized():
    c = case14()
    model = GridModel(c)
    model.cmd_open[line(c, 7, 8)] = 1          # bus 8 (a unit, no load) becomes its own island
    model.load_scale[:] = 6.0                  # the main island has no solution
    model.step(1.0)
    o = model.out
    b8 = c.bus_index(8)
    assert o["collapsed_this_step"][0] == 1 and o["n_islands"][0] == 1
    assert o["island"][b8] == b8 and o["vm_pu"][b8] > 0.9
    assert (o["island"] == -1).sum() == 13 and np.isfinite(o["pf_mw"]).all()
    # one energized bus without load is not a grid that is up: no demand served is a blackout,
    # and the solver's outcome says why (collapse latched, not a converged solve)
    assert o["served_fraction"][0] == 0.0 and o["blackout"][0] == 1
    assert o["pf_status"][0] == PF_COLLAPSED and o["dead_buses"][0] == 13


def test_blackout_is_a_served_fraction_below_the_threshold_and_shed_load_counts_as_not_served():
    c = case14()
    model = GridModel(c, GridParams(blackout_served_fraction=0.5))
    total = float(c.pd_mw.sum())
    model.load_shed[:] = 0.4                   # 40 % shed everywhere: 60 % served, not a blackout
    model.step(1.0)
    o = model.out
    assert o["shed_load_mw"][0] == pytest.approx(0.4 * total, rel=1e-12)
    assert o["served_fraction"][0] == pytest.approx(0.6, rel=1e-12) and o["blackout"][0] == 0
    assert o["pf_status"][0] == PF_CONVERGED and o["pf_mismatch_pu"][0] < GridParams().tol_pu
    model.load_shed[:] = 0.55                  # 45 % served: below the threshold
    model.step(1.0)
    assert o["served_fraction"][0] == pytest.approx(0.45, rel=1e-12) and o["blackout"][0] == 1
    assert o["n_islands"][0] == 1 and o["dead_buses"][0] == 0  # energized, yet a blackout by the threshold
