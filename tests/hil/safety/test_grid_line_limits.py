"""The grid's PTDF line limits as a plant limit family (`[[safety.projection.plant]] kind =
"line_rating"`, plants/grid/line_limits.py) in the projection, and its fail-closed paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hil.safety.config import PlantLimit, ProjectionSection
from hil.safety.projection import Projector, plant_limit_family
from plants.base import Plant, load_plant

ROOT = Path(__file__).resolve().parents[3]
ACTIONS = ["gen_11.p_set", "gen_29.p_set"]


@pytest.fixture(scope="module")
def grid():
    model = load_plant("grid", {"case": str(ROOT / "configs/grids/case118.m")})
    plant = Plant(model, dt=1.0)
    plant.step(1.0)
    return model, plant.compute_outputs().copy(), plant.u.copy()


def _projector(model, options=None):
    section = ProjectionSection(plant=[PlantLimit(name="lines", kind="line_rating", options=options or {})])
    return Projector(section, model.spec, ACTIONS, plant=model)


def _rows(pr, y, u):
    """The family's rows at (y, u): W (m, n_actions), b (m,)."""
    _, fam, _ = pr.families[0]
    W, b = np.zeros((fam.m, len(ACTIONS))), np.zeros(fam.m)
    fam.fill(y, u, W, b)
    return W, b


def test_clips_a_transfer_to_the_line_rows(grid):
    model, y, u = grid
    pr = _projector(model)
    out, clips = pr.project(np.array([320.0, 292.0]), None, -1.0, y, u)
    assert out[0] < 300.0 and clips
    assert any(c.reason.startswith("linear:lines.line_54.") for c in clips), clips
    W, b = _rows(pr, y, u)
    assert (W @ out <= b + 1e-6).all()                  # every row holds at the projected action
    ok, clips_ok = pr.project(np.array([225.0, 387.0]), None, -1.0, y, u)   # a small move passes
    assert not clips_ok and np.allclose(ok, [225.0, 387.0])


def test_rows_hold_the_other_units_at_their_applied_values(grid):
    """Restricted to the actions, the rows are the full rows with the other units' part in b."""
    model, y, u = grid
    pr = _projector(model)
    W, b = _rows(pr, y, u)
    _, fam, _ = pr.families[0]
    from plants.grid.line_limits import LineFlowLimits

    Wf, bf, names = LineFlowLimits(model)(y, u)         # over all inputs
    cols = [model.spec.index("inputs", a) for a in ACTIONS]
    u2 = u.copy()
    for a in ([320.0, 292.0], [100.0, 450.0], [0.0, 0.0]):
        u2[cols] = a
        # a row the actions can violate is in both; the restricted row says the same as the full one
        for k, name in enumerate(fam.row_names):
            if np.abs(W[k]).sum() > 0:
                j = names.index(name)
                assert (W[k] @ np.array(a) - b[k]) == pytest.approx(Wf[j] @ u2 - bf[j], abs=1e-6)


def test_a_failing_family_holds_the_applied_values(grid, monkeypatch):
    model, y, u = grid
    pr = _projector(model)
    _, fam, _ = pr.families[0]

    def broken(y, u, W, b):
        raise RuntimeError("boom")

    monkeypatch.setattr(fam, "fill", broken)
    out, clips = pr.project(np.array([320.0, 292.0]), None, -1.0, y, u)
    held = u[[model.spec.index("inputs", a) for a in ACTIONS]]
    np.testing.assert_allclose(out, held, atol=1e-6)
    assert clips and all(c.reason == "linear:lines.failed" for c in clips) and pr.fill_failures == 1

    def nan_rows(y, u, W, b):
        W[:] = 1.0
        b[:] = np.nan

    monkeypatch.setattr(fam, "fill", nan_rows)
    out, _ = pr.project(np.array([320.0, 292.0]), None, -1.0, y, u)
    np.testing.assert_allclose(out, held, atol=1e-6)
    assert pr.fill_failures == 2


def test_bad_flow_makes_the_rows_unknown(grid):
    model, y, u = grid
    pr = _projector(model)
    assert pr.unknown_limits(y, u) == []
    y_bad = y.copy()
    y_bad[model.spec.index("outputs", "line_54.p_mw")] = np.nan
    assert pr.unknown_limits(y_bad, u) == ["lines"]


def test_a_plant_without_the_family_or_bad_options_is_refused(grid):
    model, _, _ = grid
    with pytest.raises(ValueError, match=r"plant\[0\]\.kind: bioreactor provides no limit family 'line_rating'"):
        plant_limit_family(load_plant("bioreactor"), "line_rating", ["feed_rate"], {}, "safety.projection.plant[0]")
    with pytest.raises(ValueError, match=r"plant\[0\]\.options\.margin: "):
        plant_limit_family(model, "line_rating", ACTIONS, {"margin": -1.0}, "safety.projection.plant[0]")
    with pytest.raises(ValueError, match=r"plant\[0\]\.options\.horizon_s: not an option of line_rating"):
        plant_limit_family(model, "line_rating", ACTIONS, {"horizon_s": 1.0}, "safety.projection.plant[0]")
    with pytest.raises(ValueError, match=r"plant\[0\]\.options\.actions: none of gen\.p_set"):
        plant_limit_family(model, "line_rating", ["load.scale"], {}, "safety.projection.plant[0]")


def test_n1_rows_tighten_the_transfer_for_a_listed_contingency(grid):
    """`contingencies = [30]`: after branch 30 opens, line 54 would carry more of the transfer, so
    the projection stops it earlier than the base rows do, on an N-1 row, and every row holds."""
    model, y, u = grid
    base, _ = _projector(model).project(np.array([320.0, 292.0]), None, -1.0, y, u)
    pr = _projector(model, {"contingencies": [30]})
    out, clips = pr.project(np.array([320.0, 292.0]), None, -1.0, y, u)
    assert out[0] < base[0] - 1.0
    assert any("line_54.n1_30.fwd" in c.reason for c in clips), clips
    W, b = _rows(pr, y, u)
    assert (W @ out <= b + 1e-6).all()
    _, fam, _ = pr.families[0]
    assert fam.m == 4 * 186 and fam.row_names[2 * 186 + 2 * 53] == "line_54.n1_30.fwd"


def test_n1_row_sensitivities_are_the_ptdf_of_the_post_outage_topology(grid):
    """Independent check of PTDF + LODF x PTDF[k]: the PTDF computed afresh on the network with
    branch k open (same slack), at every line that has a row; 1e-9 MW per MW (round-off)."""
    from plants.grid.line_limits import LineFlowLimits
    from plants.grid.sensitivity import ptdf

    model, y, u = grid
    fam = LineFlowLimits(model, None, {"contingencies": [30, 37], "n1_margin": 0.01})   # every reachable row
    W = np.zeros((fam.m, len(fam.action_names)))
    b = np.zeros(fam.m)
    fam.fill(y, u, W, b)
    grid_model = fam.grid
    nl = grid_model.case.n_branch
    slack = grid_model._slack_of_root[grid_model.state["island"]]
    for j, k in enumerate((29, 36)):
        br = grid_model.state["br_status"].copy()
        br[k] = 0
        post = ptdf(grid_model.case, br, slack)
        expected = post[:, fam.gen_bus[fam.gen_act]]
        block = W[2 * nl * (1 + j):2 * nl * (2 + j):2][:, fam.cols]       # the .fwd rows
        has = np.abs(block).sum(axis=1) > 0
        assert has.sum() > 100 and not has[k]
        assert np.abs(block[has] - expected[has]).max() < 1e-9


@pytest.mark.parametrize("options, reason", [
    ({"contingencies": [0]}, "contingencies: 0 is not a branch row in 1..186"),
    ({"contingencies": [5, 5]}, "contingencies: branch 5 is listed twice"),
    ({"contingencies": 5}, "contingencies: 5 is not a list"),
    ({"n1_margin": 3.0}, "n1_margin: 3.0 is not a fraction"),
])
def test_n1_options_are_checked(grid, options, reason):
    from plants.grid.line_limits import LineFlowLimits

    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(".", r"\.")):
        LineFlowLimits(grid[0], None, options)
