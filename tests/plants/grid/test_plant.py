"""The grid as a hil plant (plants/grid/plant.py): contract, ratings option, randomization,
fault hooks through inputs, and the wrapper's PTDF line limits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from plants.base import Plant, PlantOptionError, load_plant
from plants.grid import FAULTS
from plants.grid.line_limits import LineFlowLimits
from plants.grid.case import read_matpower
from tests.plants.contract_checks import assert_plant_contract

ROOT = Path(__file__).resolve().parents[3]
CASE14 = str(ROOT / "configs/grids/case14.m")
CASE118 = str(ROOT / "configs/grids/case118.m")


@pytest.fixture(scope="module")
def m14():
    return load_plant("grid", {"case": CASE14})


@pytest.fixture(scope="module")
def m118():
    return load_plant("grid", {"case": CASE118})


def _y(plant, name):
    return plant.y[plant.spec.index("outputs", name)]


def test_contract_case14_and_case118(m14, m118):
    assert_plant_contract(m14, 1.0)
    assert_plant_contract(m118, 1.0, n_steps=5)


def test_case118_spec_has_per_element_groups(m118):
    s = m118.spec
    for kind, group, n in (("outputs", "bus.vm", 118), ("outputs", "line.loading", 186), ("outputs", "line.closed", 186),
                           ("inputs", "gen.p_set", 54), ("inputs", "line.open_cmd", 186), ("inputs", "load.shed", 118),
                           ("algebraic", "bus.vm_state", 118), ("discrete", "line.status", 186),
                           ("params", "line.rating", 186)):
        g = s.group(kind, group)
        assert g is not None and g.size == n, (group, g)
    assert s.quantity("outputs", "bus_12.vm").unit == "pu"
    assert s.names("inputs")[s.index("inputs", "gen.p_set[0]")] == "gen_1.p_set"
    assert m118.max_substep == float("inf")


def test_nominal_state_is_at_rest_and_steps_stay_there(m118):
    p = Plant(m118, dt=1.0)
    p.step(1.0)
    p.compute_outputs()
    assert _y(p, "grid.frequency") == pytest.approx(50.0, abs=1e-6)
    assert _y(p, "grid.islands") == 1 and _y(p, "grid.blackout") == 0
    # base_flow ratings (margin 1.25): the base case loads no line above 100 %
    assert 60.0 < _y(p, "grid.max_loading") < 100.0


def test_ratings_options(tmp_path, m14):
    case = read_matpower(CASE14)
    m = load_plant("grid", {"case": CASE14, "rating_margin": 2.0, "rating_floor_mva": 1.0})
    r2 = m.spec.nominal("params")[m.spec.indices("params", "line.rating")]
    r1 = m14.spec.nominal("params")[m14.spec.indices("params", "line.rating")]
    assert (r2 > 0).all() and (r1 >= 100.0).all()
    csv = tmp_path / "r.csv"
    csv.write_text("line,rating_mva\n3,123.5\n")
    m = load_plant("grid", {"case": CASE14, "ratings_csv": str(csv)})
    assert m.spec.quantity("params", "line_3.rating").nominal == 123.5
    bad = tmp_path / "bad.csv"   # (load_plant caches by options: a new file name)
    bad.write_text("line,rating_mva\n99,10\n")
    with pytest.raises(PlantOptionError) as info:
        load_plant("grid", {"case": CASE14, "ratings_csv": str(bad)})
    assert info.value.option == "ratings_csv" and f"1..{case.n_branch}" in info.value.reason
    with pytest.raises(PlantOptionError) as info:
        load_plant("grid", {"case": CASE14, "ratings": "case"})
    assert info.value.option == "ratings" and "RATE_A" in info.value.reason
    with pytest.raises(PlantOptionError) as info:
        load_plant("grid", {"case": CASE14, "rating_margin": -1})
    assert info.value.option == "rating_margin"


def test_randomize_keeps_lines_physical(m118):
    s = m118.spec
    p0 = s.nominal("params")
    p = p0.copy()
    s.randomize(p, np.random.default_rng(3), 0.3)
    r, x, rating = (s.indices("params", g) for g in ("line.r", "line.x", "line.rating"))
    assert (p[rating] > 0).all() and not np.array_equal(p[rating], p0[rating])
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio0, ratio = p0[x] / p0[r], p[x] / p[r]
    ok = p0[r] > 0
    np.testing.assert_allclose(ratio[ok], ratio0[ok], rtol=1e-9)   # one factor per line: same X/R
    assert ((p >= s.lows("params")) & (p <= s.highs("params"))).all()
    plant = Plant(m118, dt=1.0)
    plant.p[:] = p
    plant.step(1.0)
    assert np.isfinite(plant.compute_outputs()).all()


def test_fault_hooks_through_inputs(m14):
    s = m14.spec
    assert set(FAULTS) == {"line_trip", "gen_trip", "load_step"}
    for group, _, _ in FAULTS.values():
        assert s.group("inputs", group) is not None
    p = Plant(m14, dt=1.0)
    p.u[s.index("inputs", "line_5.open_cmd")] = 1.0
    p.step(1.0)
    p.compute_outputs()
    assert _y(p, "line_5.closed") == 0 and _y(p, "line_5.p_mw") == 0.0
    p.u[s.index("inputs", "line_5.open_cmd")] = 0.0
    p.u[s.index("inputs", "line_5.close_cmd")] = 1.0
    p.step(1.0)
    p.compute_outputs()
    assert _y(p, "line_5.closed") == 1
    p.u[s.index("inputs", "gen_2.on")] = 0.0      # unit trip: frequency falls
    p.step(1.0)
    p.compute_outputs()
    assert _y(p, "gen_2.in_service") == 0 and _y(p, "gen_2.p_mw") == 0.0
    assert _y(p, "grid.frequency") < 49.99
    q = Plant(m14, dt=1.0)
    q.u[s.indices("inputs", "load.scale")] = 1.1  # load step
    q.step(1.0)
    q.compute_outputs()
    assert _y(q, "grid.frequency") < 49.99


def test_ptdf_limits_predict_flows_and_follow_a_trip(m118):
    s = m118.spec
    lim = LineFlowLimits(m118)
    p = Plant(m118, dt=1.0)
    p.step(1.0)
    y, u = p.compute_outputs().copy(), p.u.copy()
    W, b, names = lim(y, u)
    assert W.shape == (len(names), s.n_inputs) and len(names) > 0
    assert (W @ u <= b + 1e-9).all()                   # the operating point is inside
    # a balanced redispatch: the rows' prediction of the new flows (DC) against the AC flow
    g_up, g_dn = s.index("inputs", "gen_5.p_set"), s.index("inputs", "gen_12.p_set")
    u2 = u.copy()
    u2[g_up] += 50.0
    u2[g_dn] -= 50.0
    p.u[:] = u2
    p.step(1.0)
    y2 = p.compute_outputs()
    pf = s.indices("outputs", "line.p_mw")
    H = lim._ptdf(np.ones(186, dtype=np.int64), np.ones(54, dtype=np.int64))
    gb = lim.gen_bus
    dc = H[:, gb[4]] * 50.0 - H[:, gb[11]] * 50.0
    moved = np.abs(dc) > 5.0
    np.testing.assert_allclose((y2[pf] - y[pf])[moved], dc[moved], rtol=0.25, atol=3.0)
    # a trip: rows of the open line disappear, PTDF recomputed for the new topology
    k = int(np.argmax(np.abs(y[pf])))
    y3 = y.copy()
    y3[s.index("outputs", f"line_{k + 1}.closed")] = 0.0
    _, _, names3 = lim(y3, u)
    assert not any(n.startswith(f"line_{k + 1}.") for n in names3)
    H3 = lim.grid.sensitivities()[0]
    assert np.all(H3[k] == 0.0)
    # Bad measurement: unknown, never silently computed
    y4 = y.copy()
    y4[pf[0]] = np.nan
    assert lim.unknown(y4, u)
    with pytest.raises(ValueError):
        lim(y4, u)
