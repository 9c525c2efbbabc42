"""The grown plant contract (plants/spec.py, plants/base.py) proven on the test plant
tests/plants/array_plant.py: spec built from a model file, array groups, per-element names,
algebraic unknowns warm-started inside the step, discrete state changed by events, all of
it in snapshot/restore; the plant's own max sub-step; a physical randomization hook."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from plants.base import Plant, PlantModel, PlantOptionError, load_plant, substeps_for
from plants.spec import Group, PlantSpec, Quantity, SpecBuilder, element_names
from tests.plants import array_plant as AP

MODEL_FILE = str(Path(__file__).parent / "data" / "heaters.toml")
NAME = "tests.plants.array_plant"


def model() -> PlantModel:
    return load_plant(NAME, {"file": MODEL_FILE})


def test_spec_built_from_the_model_file_names_elements_by_file_id():
    spec = model().spec
    assert spec.names("states") == ("node_3.temp", "node_7.temp", "node_12.temp", "node_20.temp")
    g = spec.group("outputs", "node.temp")
    assert (g.start, g.size, g.unit) == (0, 4, "K")
    assert list(spec.expand("outputs", "node.power")) == element_names("node", [3, 7, 12, 20], "power")
    # per-element, by position in the group, and negative positions resolve to the same index
    assert spec.index("outputs", "node_12.power") == spec.index("outputs", "node.power[2]") == \
        spec.index("outputs", "node.power[-2]") == g.stop + 2
    assert list(spec.indices("params", "link.g")) == [12, 13, 14]
    assert spec.names("params")[12:15] == ("link_1.g", "link_2.g", "link_5.g")
    assert spec.has("inputs", "heater.duty") and spec.has("inputs", "heater.duty[3]")
    assert not spec.has("inputs", "heater.duty[4]") and not spec.has("inputs", "heater_4.duty")
    with pytest.raises(KeyError, match=r"heater.duty has 4 elements"):
        spec.index("inputs", "heater.duty[4]")
    with pytest.raises(KeyError, match=r"known: heater.duty\[4\] \(heater_3.duty..heater_20.duty\), reset"):
        spec.index("inputs", "heater_4.duty")
    assert spec.nominal("discrete").dtype == np.int64 and spec.n_algebraic == 1


def test_model_is_built_once_per_options_and_bad_options_name_the_key(tmp_path):
    assert model() is model()
    with pytest.raises(PlantOptionError) as e:
        load_plant(NAME, {"file": MODEL_FILE, "case": "x"})
    assert e.value.option == "case" and "options: file" in str(e.value)
    bad = tmp_path / "bad.toml"
    bad.write_text("ambient_K = 293.0\n[[node]]\nid = 1\ncapacity_J_per_K = -5.0\n")
    with pytest.raises(PlantOptionError) as e:
        load_plant(NAME, {"file": str(bad)})
    assert e.value.option == "file" and "capacity_J_per_K = -5.0" in e.value.reason
    with pytest.raises(PlantOptionError) as e:
        load_plant(NAME, {"file": str(tmp_path / "missing.toml")})
    assert e.value.option == "file" and "cannot read" in e.value.reason
    with pytest.raises(PlantOptionError, match="takes no options"):
        load_plant("bioreactor", {"case": "x"})


def test_max_substep_comes_from_the_model_file_and_drives_the_substeps():
    m = model()
    # trip_delay_s / 10 = 0.2 s is tighter than the link coupling bound (0.5 * 250 / 3.5 = 35.7 s)
    assert m.max_substep == pytest.approx(0.2)
    assert substeps_for(m, 1.0) == 5 and Plant(m, dt=1.0).substeps == 5
    with pytest.raises(ValueError, match="maximum stable sub-step of 0.2 s"):
        Plant(m, substeps=2, dt=1.0)


def _heated(m: PlantModel, dt: float = 1.0) -> Plant:
    plant = Plant(m, dt=dt)
    plant.u[m.spec.indices("inputs", "heater.duty")] = 1.0
    return plant


def test_algebraic_unknown_is_warm_started_and_solves_the_source_equation():
    m = model()
    plant = _heated(m)
    spec = m.spec
    p = plant.p
    plant.step(1.0)
    y = plant.compute_outputs()
    v = y[spec.index("outputs", "supply.voltage")]
    i = y[spec.index("outputs", "supply.current")]
    isc, i0, vt = (p[spec.index("params", k)] for k in ("source.I_sc", "source.I_0", "source.V_t"))
    # outputs take the load at the temperatures after the last sub-step (0.2 s later than the
    # solve): the source's I(V) matches within that drift (1e-3)
    assert i == pytest.approx(isc - i0 * (math.exp(v / vt) - 1.0), rel=1e-3)
    # the kernel's solve against an independent root finder (Newton stops at |dV| <= 1e-12 (1 + V))
    from scipy.optimize import brentq

    for g in (0.0, 0.05, 0.575, 5.0):
        ref = brentq(lambda u: isc - i0 * (math.exp(u / vt) - 1.0) - g * u, 0.0, 50.0, xtol=1e-14, rtol=1e-15)
        assert AP.solve_supply(1.0, g, isc, i0, vt)[0] == pytest.approx(ref, rel=0, abs=1e-11 * (1 + ref))
    assert plant.z[0] == v
    plant = _heated(m, dt=0.2)  # one sub-step per step: one solve
    plant.step(0.2)
    cold = plant.d[spec.index("discrete", "solver.iterations")]
    plant.step(0.2)
    warm = plant.d[spec.index("discrete", "solver.iterations")]
    assert warm < cold  # the warm start from z needs fewer Newton iterations
    z_before = plant.z.copy()
    plant.z[0] = spec.algebraic[0].nominal  # a cold start again
    plant.step(0.2)
    assert plant.d[spec.index("discrete", "solver.iterations")] > warm
    assert plant.z[0] == pytest.approx(z_before[0], rel=1e-3)


def test_protection_trips_by_event_inside_the_step_at_the_delay_and_reset_clears_it():
    m = model()
    spec = m.spec
    plant = Plant(m, dt=0.2)
    plant.x[:] = 330.0
    node = spec.index("states", "node_20.temp")
    trip = spec.index("discrete", "node_20.trip")
    over = spec.index("discrete", "node_20.over_us")
    plant.p[spec.index("params", "protection.trip")] = 329.0  # all nodes start above the trip level
    plant.u[spec.index("inputs", "heater_20.duty")] = 1.0
    for k in range(9):  # 9 x 0.2 s = 1.8 s < 2 s delay
        plant.step(0.2)
        assert plant.d[trip] == 0, k
    plant.step(0.2)  # the 10th sub-step reaches 2.0 s above the trip level
    assert plant.d[trip] == 1 and plant.d[over] == 2_000_000
    assert plant.compute_outputs()[spec.index("outputs", "node_20.power")] == 0.0  # the trip cut the heater
    plant.u[spec.index("inputs", "reset")] = 1.0
    plant.step(0.2)
    assert plant.d[trip] == 1  # still above reset_K: reset refused
    plant.x[node] = 300.0
    plant.step(0.2)
    assert plant.d[trip] == 0 and plant.d[over] == 0


def test_snapshot_restore_round_trips_algebraic_and_discrete_state_bit_for_bit():
    m = model()
    plant = _heated(m)
    for _ in range(1500):  # node 20 trips at ~1610 s at full duty
        plant.step(1.0)
    spec = m.spec
    trips = spec.indices("discrete", "node.trip")
    assert not plant.d[trips].any()
    snap = plant.snapshot()
    trace = []
    for _ in range(300):
        plant.step(1.0)
        trace.append(plant.compute_outputs().copy())
    after = plant.snapshot()
    assert plant.d[trips].any() and not after.equals(snap)  # the window holds a trip event
    plant.restore(snap)
    assert plant.snapshot().equals(snap)
    replay = []
    for _ in range(300):
        plant.step(1.0)
        replay.append(plant.compute_outputs().copy())
    assert np.array_equal(np.array(trace), np.array(replay))  # bit for bit, iterations included
    assert plant.snapshot().equals(after)
    # a second instance restored from the snapshot (a shadow fork) follows the same path
    fork = _heated(m)
    fork.restore(snap)
    for _ in range(300):
        fork.step(1.0)
    assert fork.snapshot().equals(after)


def test_work_buffers_are_private_per_instance():
    m = model()
    a, b = _heated(m), _heated(m)
    assert all(x is y for x, y in zip(a.aux[:3], b.aux[:3]))  # data shared
    assert all(x is not y for x, y in zip(a.aux[3:], b.aux[3:]))  # work copied


def test_randomization_hook_draws_physical_structured_parameters():
    m = model()
    spec = m.spec
    base = spec.nominal("params")
    rng = np.random.default_rng(1)
    lo, hi = spec.lows("params"), spec.highs("params")
    cap, gamb = spec.indices("params", "node.capacity"), spec.indices("params", "node.g_ambient")
    for _ in range(300):
        p = base.copy()
        spec.randomize(p, rng, 0.5)
        assert np.all(p >= lo) and np.all(p <= hi) and np.all(p[:15] > 0)
        # a node's capacity and ambient conductance move together (s and s^(2/3))
        s = p[cap] / base[cap]
        inside = (s > 0.3 + 1e-9) & (s < 3.0 - 1e-9) & (p[gamb] > lo[gamb]) & (p[gamb] < hi[gamb])
        assert np.allclose((p[gamb] / base[gamb])[inside], s[inside] ** (2 / 3), rtol=1e-12)
        assert np.array_equal(p[15:], base[15:])  # scalars untouched


def test_spec_validation_rejects_overlapping_groups_bad_names_and_mixed_units():
    q = [Quantity(f"a_{i}.v", "V", 0.0, -1.0, 1.0) for i in range(3)]
    with pytest.raises(ValueError, match="overlap"):
        PlantSpec("p", (), (), tuple(q), (), groups=(Group("outputs", "a.v", 0, 2), Group("outputs", "b.v", 1, 2)))
    with pytest.raises(ValueError, match="outside"):
        PlantSpec("p", (), (), tuple(q), (), groups=(Group("outputs", "a.v", 2, 2),))
    with pytest.raises(ValueError, match="already"):
        PlantSpec("p", (), (), tuple(q), (), groups=(Group("outputs", "a_1.v", 0, 1),))
    with pytest.raises(ValueError, match="mixes units"):
        PlantSpec("p", (), (), (*q[:2], Quantity("a_2.v", "A", 0, -1, 1)), (),
                  groups=(Group("outputs", "a.v", 0, 3, unit="V"),))
    with pytest.raises(ValueError, match="not an identifier"):
        Quantity("bus 1.vm", "pu", 1, 0, 2)
    with pytest.raises(ValueError, match="not an integer"):
        PlantSpec("p", (), (), (), (), discrete=(Quantity("mode", "1", 0.5, 0, 1),))
    b = SpecBuilder("p")
    with pytest.raises(ValueError, match="3 values for 2 elements"):
        b.array("params", "line.r", ["line_1.r", "line_2.r"], unit="pu", nominal=[1, 2, 3], low=0, high=5)


def test_the_bioreactor_loads_as_an_ode_model_unchanged():
    import plants.bioreactor as bio

    m = load_plant("bioreactor")
    assert m.form == "ode" and m.spec is bio.SPEC and m.max_substep == bio.MAX_SUBSTEP
    a, b = Plant(m, dt=1 / 3600), Plant(bio, dt=1 / 3600)
    for _ in range(50):
        a.step(1 / 3600)
        b.step(1 / 3600)
    assert np.array_equal(a.x, b.x)
    assert a.snapshot().z.size == 0 and a.snapshot().d.dtype == np.int64


def test_both_plants_pass_the_conformance_checks():
    from tests.plants.contract_checks import assert_plant_contract

    def full_duty(plant):
        plant.u[plant.spec.indices("inputs", "heater.duty")] = 1.0

    assert_plant_contract(model(), 1.0, n_steps=200, setup=full_duty)
    assert_plant_contract(load_plant("bioreactor"), 1 / 3600)


def test_the_conformance_checks_catch_state_kept_outside_the_snapshot():
    from dataclasses import replace

    from tests.plants.contract_checks import assert_plant_contract

    m = model()

    def leaky_step(t, x, z, d, u, p, dt, n_sub, *aux):  # keeps its warm start in a work buffer
        aux[-1][0] += 1.0
        x[0] += aux[-1][0] * dt
        return t + dt

    bad = replace(m, step=leaky_step)
    with pytest.raises(AssertionError, match="bit for bit"):
        assert_plant_contract(bad, 1.0)


def test_a_model_file_the_reader_did_not_expect_is_a_named_error(tmp_path):
    node = "[[node]]\nid = {}\ncapacity_J_per_K = 1.0\ng_ambient_W_per_K = 1.0\nr0_ohm = 1.0\n"
    bad = tmp_path / "odd.toml"
    bad.write_text("ambient_K = 293.0\n" + node.format(1) + node.format(2)
                   + "[[link]]\na = 1\nb = 2\ng_W_per_K = 1.0\n")  # a link without its id: the reader's KeyError
    with pytest.raises(PlantOptionError, match="could not be built: KeyError: 'id'"):
        load_plant(NAME, {"file": str(bad)})
