"""benchmarks/grid_speed.py and grid_peers.py run and compare like with like (no timing is asserted)."""

import importlib.util
import sys

import numpy as np
import pytest

from .conftest import REFERENCE, ROOT


def _load(name):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_parts_run():
    bench = _load("grid_speed")
    with np.load(REFERENCE) as d:
        ref = {k: d[k] for k in d.files}
    r = bench.bench_reference118(ref)
    assert r["max_dvm"] < 1e-6 and r["max_dva"] < 1e-6 and r["iterations"] >= 1
    step = bench.bench_grid_step(3)
    assert step["steps"] == 3 and step["median"] > 0


def test_peers_solve_identical_problem_and_agree():
    pytest.importorskip("lightsim2grid")
    pytest.importorskip("pandapower")
    peers = _load("grid_peers")
    p = peers.build_problem("case118")
    # identical injections: the Sbus every side solves equals LSGrid's own after it applied the loads
    scale = peers.load_scales(len(p.load_p_mw), 3, 1)[2]
    pm, qm = p.loads(scale)
    ls = peers.LightsimSide(p)
    ls.set_loads(pm, qm)
    ls.solve(peers.TOL_PU)
    assert np.abs(np.asarray(p.grid.get_Sbus_solver()) - p.sbus(pm, qm)).max() < 1e-12
    # load steps are 1-2 % of the system load (not fractions of a percent)
    steps = peers.load_scales(50, 40, 3).mean(axis=1)
    rel = np.abs(np.diff(np.r_[1.0, steps])) / np.r_[1.0, steps][:-1]
    assert rel.min() > 0.008 and rel.max() < 0.022
    r = peers.compare(p, steps=4, repeats=3, pypower_steps=2)
    assert set(r["warm_ms"]) >= {"hil", "lightsim2grid"} and len(r["warm_ms"]["hil"]["repeats"]) == 3
    assert r["max_dv_warm_pu"]["lightsim2grid"] < peers.AGREE_PU
    assert r["max_dv_flat_pu"]["lightsim2grid"] < peers.AGREE_FLAT_PU
    assert r["hil_iterations_median"] >= 2


def test_disagreeing_answers_are_refused(monkeypatch):
    pytest.importorskip("lightsim2grid")
    pytest.importorskip("pandapower")
    peers = _load("grid_peers")
    p = peers.build_problem("case118")
    real = peers.LightsimSide.voltage
    monkeypatch.setattr(peers.LightsimSide, "voltage", lambda self: real(self) * (1 + 1e-4))
    with pytest.raises(AssertionError, match="disagree"):
        peers.compare(p, steps=2, repeats=3, pypower_steps=0)
