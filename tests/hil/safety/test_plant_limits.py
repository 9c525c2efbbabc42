"""hil/safety/plant_limits.py: the projection with a plant's state-dependent rows (the grid's
PTDF line limits), and its fail-closed paths."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hil.safety.config import ProjectionSection
from hil.safety.plant_limits import PlantLimitProjector, plant_limits_hook
from plants.base import Plant, load_plant

ROOT = Path(__file__).resolve().parents[3]
ACTIONS = ["gen_11.p_set", "gen_29.p_set"]


@pytest.fixture(scope="module")
def grid():
    model = load_plant("grid", {"case": str(ROOT / "configs/grids/case118.m")})
    plant = Plant(model, dt=1.0)
    plant.step(1.0)
    return model, plant.compute_outputs().copy(), plant.u.copy()


def _projector(model, hook=None):
    sc = SimpleNamespace(plant=SimpleNamespace(load=lambda: model, model="grid"))
    return PlantLimitProjector(ProjectionSection(plant_limits=True), model.spec, ACTIONS, hook or plant_limits_hook(sc))


def test_clips_a_transfer_to_the_line_rows(grid):
    model, y, u = grid
    pr = _projector(model)
    out, clips = pr.project(np.array([320.0, 292.0]), None, -1.0, y, u)
    assert out[0] < 300.0 and clips
    assert any(c.reason.startswith("linear:line_54.") for c in clips), clips
    W, b, _ = pr.hook(y, u)
    u2 = u.copy()
    u2[[model.spec.index("inputs", a) for a in ACTIONS]] = out
    assert (W @ u2 <= b + 1e-6).all()                  # every row holds at the projected action
    ok, clips_ok = pr.project(np.array([225.0, 387.0]), None, -1.0, y, u)   # a small move passes
    assert not clips_ok and np.allclose(ok, [225.0, 387.0])


def test_a_failing_hook_holds_the_applied_values(grid):
    model, y, u = grid

    def broken(y, u):
        raise RuntimeError("boom")

    pr = _projector(model, broken)
    out, clips = pr.project(np.array([320.0, 292.0]), None, -1.0, y, u)
    held = u[[model.spec.index("inputs", a) for a in ACTIONS]]
    np.testing.assert_allclose(out, held, atol=1e-6)
    assert all("plant_limits_failed" in c.reason for c in clips) and pr.plant_failures == 1


def test_bad_flow_makes_the_rows_unknown(grid):
    model, y, u = grid
    pr = _projector(model)
    assert pr.unknown_limits(y, u) == []
    y_bad = y.copy()
    y_bad[model.spec.index("outputs", "line_54.p_mw")] = np.nan
    assert pr.unknown_limits(y_bad, u) == ["plant_limits"]


def test_a_plant_without_the_hook_is_refused():
    model = load_plant("bioreactor")
    sc = SimpleNamespace(plant=SimpleNamespace(load=lambda: model, model="bioreactor"))
    with pytest.raises(ValueError, match="plant_limits: plant 'bioreactor' provides no linear_limits"):
        plant_limits_hook(sc)
