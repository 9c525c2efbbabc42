"""The residual model inside the loop's plant step: lockstep and real time apply exactly what
the sysid simulation applies; bad model files are configuration errors."""

from __future__ import annotations

import numpy as np
import pytest

from hil.calibration.logs import RunLog
from hil.calibration.residual import ResidualModel, apply_correction
from hil.calibration.simulate import RunSimulator
from hil.config import parse_scenario
from hil.errors import ConfigError
from hil.recorder import read_recording
from hil.runtime import Runtime
from plants.base import load_plant_module
from tests.hil.test_config import _with

MODULE = load_plant_module("bioreactor")
SPEC = MODULE.SPEC


def _model(tmp_path):
    nx = SPEC.n_states
    lo = np.concatenate([SPEC.nominal("states"), SPEC.nominal("inputs")])
    sc = np.ones(nx + SPEC.n_inputs)
    m = ResidualModel.zeros(SPEC, ["co2", "glucose"], ["x.co2", "u.aeration_rate"], lo, sc)
    m.W[0, 0] = -0.2                                   # mmol/(L h) constant
    m.W[0, 1 + SPEC.index("states", "co2")] = -0.5     # 1/h on (co2 - 0.5)
    m.W[1, 0] = -0.3                                   # g/(L h)
    path = tmp_path / "res.npz"
    m.save(path)
    return m, path


def test_apply_correction_matches_readable_python():
    m, _ = _model_in_memory()
    x = SPEC.nominal("states") + 0.1
    u = SPEC.nominal("inputs")
    phi = np.concatenate([[1.0], (np.concatenate([x, u]) - m.feat_lo) / m.feat_scale])
    expect = x.copy()
    for r, i in enumerate(m.idx):
        expect[i] += 0.01 * m.W[r] @ phi
    apply_correction(x, u, 0.01, *m.arrays())
    np.testing.assert_allclose(x, expect, rtol=1e-14)


def _model_in_memory():
    lo = np.concatenate([SPEC.nominal("states"), SPEC.nominal("inputs")])
    m = ResidualModel.zeros(SPEC, ["co2", "glucose"], ["x.co2", "x.glucose"], lo, np.full(lo.size, 2.0))
    m.W[0, 1 + SPEC.index("states", "glucose")] = 0.7  # reads glucose, which row 1 changes
    m.W[1, 1 + SPEC.index("states", "co2")] = -0.4
    m.W[1, 0] = 0.1
    return m, None


@pytest.mark.parametrize("realtime", [False, True])
def test_loop_applies_the_residual_model_as_sysid_simulates_it(tmp_path, realtime):
    m, path = _model(tmp_path)
    changes = {"plant__residual_model": str(path), "loop__step_s": 10.0}
    if realtime:
        changes["loop__time_scale"] = 2000.0  # 5 ms period
    sc = parse_scenario(_with(**changes))
    with Runtime(sc, lockstep=not realtime, duration_s=600.0, record_path=str(tmp_path / "rec")) as rt:
        x0 = rt.plant.x.copy()
        rt.run()
    df = read_recording(tmp_path / "rec")
    # the same inputs through the sysid simulator with the same correction
    n = len(df) + 1
    t = np.arange(n) * 10.0
    U = np.vstack([df[[f"app.{u}" for u in SPEC.names("inputs")]].to_numpy(), np.zeros((1, SPEC.n_inputs))])
    run = RunLog("rec", t, U, np.zeros((n, SPEC.n_outputs)), np.full((n, SPEC.n_states), np.nan), {})
    sim = RunSimulator(MODULE, m)
    _, X, _, ok = sim.run(run, rt.plant.p, x0)
    assert ok
    for s in ("co2", "glucose", "biomass"):
        np.testing.assert_allclose(df[f"x.{s}"].to_numpy(), X[1:, SPEC.index("states", s)], rtol=1e-12, atol=1e-15)
    # and the correction acted: without it co2 ends elsewhere
    _, X0, _, _ = RunSimulator(MODULE).run(run, rt.plant.p, x0)
    assert abs(X0[-1, SPEC.index("states", "co2")] - df["x.co2"].iloc[-1]) > 0.01


def test_bad_residual_model_is_a_config_error(tmp_path):
    (tmp_path / "bad.npz").write_bytes(b"not an npz")
    sc = parse_scenario(_with(plant__residual_model=str(tmp_path / "bad.npz")))
    with pytest.raises(ConfigError, match="plant.residual_model"):
        Runtime(sc, lockstep=True, duration_s=10.0, record=False)
