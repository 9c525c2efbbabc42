"""The residual model inside the loop's plant step: lockstep and real time apply exactly what
the sysid simulation applies; bad model files are configuration errors."""

from __future__ import annotations

import numpy as np
import pytest

from hil.calibration.logs import RunLog
from hil.calibration.residual import ResidualModel, apply_correction
from hil.calibration.simulate import RunSimulator
from hil.scenario.config import parse_scenario
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


# ---- extra features: logged columns and events ----

TAU_S = 120.0


def _event_model():
    """co2 and glucose corrected by the time since base_flow last switched on and by its
    decaying trace (tau 120 s): events the loop has (base_flow is a plant input)."""
    nf = SPEC.n_states + SPEC.n_inputs + 2
    lo = np.concatenate([SPEC.nominal("states"), SPEC.nominal("inputs"), [0.05, 0.5]])
    sc = np.concatenate([np.ones(SPEC.n_states + SPEC.n_inputs), [0.1, 0.25]])
    m = ResidualModel.zeros(SPEC, ["co2", "glucose"], ["x.co2", "since.base_flow", f"trace.base_flow:{TAU_S}"],
                            lo, sc, time_unit_s=MODULE.TIME_UNIT_S)
    assert m.W.shape == (2, 1 + nf) and not m.loop_blockers()
    base = 1 + SPEC.n_states + SPEC.n_inputs
    m.W[0, 0] = -0.1
    m.W[0, base] = 0.8       # mmol/(L h) per scaled hour since the pump switched on
    m.W[0, base + 1] = -1.5  # mmol/(L h) per scaled trace
    m.W[1, base + 1] = 0.6   # g/(L h)
    return m


def test_event_features_match_readable_python():
    """The kernel's time since the last rising edge and its trace, against a direct reading
    of the input sequence (an edge: > 0 after <= 0; the run's start counts as one)."""
    m = _event_model()
    j = SPEC.index("inputs", "base_flow")
    dt_s = 10.0
    dt = dt_s / MODULE.TIME_UNIT_S
    pulses = [0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 0, 0]
    x = SPEC.nominal("states") + 0.1
    buf = m.arrays()
    for k, on in enumerate(pulses):
        u = SPEC.nominal("inputs")
        u[j] = 0.004 * on
        edges = [i for i in range(k + 1) if pulses[i] and (i == 0 or not pulses[i - 1])]
        since_h = (k - (edges[-1] if edges else 0)) * dt
        trace = np.exp(-since_h * MODULE.TIME_UNIT_S / TAU_S)
        scale = m.feat_scale[:m.feat_lo.size]  # then the rates
        phi = np.concatenate([[1.0], (np.concatenate([x, u, [since_h, trace]]) - m.feat_lo) / scale])
        expect = x.copy()
        for r, i in enumerate(m.idx[:2]):
            expect[i] += dt * m.W[r] @ phi
        apply_correction(x, u, dt, *buf)
        np.testing.assert_allclose(x, expect, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("realtime", [False, True])
def test_loop_applies_event_features_as_sysid_simulates_them(tmp_path, realtime):
    """The event state lives in the loop's per-instance buffer: lockstep and real time give
    the trajectory the sysid simulator gives over the recorded inputs."""
    m = _event_model()
    path = tmp_path / "ev.npz"
    m.save(path)
    pulses = [[0.0, 0.0], [60.0, 0.004], [120.0, 0.0], [300.0, 0.004], [330.0, 0.0], [450.0, 0.004]]
    changes = {"plant__residual_model": str(path), "loop__step_s": 10.0,
               "inputs__base_flow": {"driver": "profile", "profile": pulses}}
    if realtime:
        changes["loop__time_scale"] = 2000.0
    sc = parse_scenario(_with(**changes))
    with Runtime(sc, lockstep=not realtime, duration_s=600.0, record_path=str(tmp_path / "rec")) as rt:
        x0 = rt.plant.x.copy()
        rt.run()
    df = read_recording(tmp_path / "rec")
    assert (np.diff((df["app.base_flow"].to_numpy() > 0).astype(int)) == 1).sum() == 3  # three pump starts
    n = len(df) + 1
    t = np.arange(n) * 10.0
    U = np.vstack([df[[f"app.{u}" for u in SPEC.names("inputs")]].to_numpy(), np.zeros((1, SPEC.n_inputs))])
    run = RunLog("rec", t, U, np.zeros((n, SPEC.n_outputs)), np.full((n, SPEC.n_states), np.nan), {})
    _, X, _, ok = RunSimulator(MODULE, ResidualModel.load(path, SPEC)).run(run, rt.plant.p, x0)
    assert ok
    for s in ("co2", "glucose"):
        np.testing.assert_allclose(df[f"x.{s}"].to_numpy(), X[1:, SPEC.index("states", s)], rtol=1e-12, atol=1e-15)
    # the events acted: the same model with the pump never switching on ends elsewhere
    U0 = U.copy()
    U0[:, SPEC.index("inputs", "base_flow")] = 0.0
    run0 = RunLog("flat", t, U0, run.Y, run.X_presc, {})
    _, X0, _, _ = RunSimulator(MODULE, m).run(run0, rt.plant.p, x0)
    assert abs(X0[-1, SPEC.index("states", "co2")] - df["x.co2"].iloc[-1]) > 1e-3


def test_a_model_reading_a_logged_column_is_not_written_for_the_loop(tmp_path):
    """A feature of a logged extra column (no plant input) is fine for diagnosis; writing the
    model for the loop, which would apply it without that feature, is refused by name."""
    nf = SPEC.n_states + SPEC.n_inputs + 2
    m = ResidualModel.zeros(SPEC, ["dissolved_o2"], ["x.biomass", "trace.antifoam:86400", "since.base_flow"],
                            np.zeros(nf), np.ones(nf), time_unit_s=MODULE.TIME_UNIT_S)
    assert m.extra_columns == ["antifoam"]
    assert len(m.loop_blockers()) == 1 and "'antifoam'" in m.loop_blockers()[0]
    with pytest.raises(ValueError, match=r"not written: feature 'trace.antifoam:86400' reads the logged column "
                                         r"'antifoam', which is no input of bioreactor"):
        m.save(tmp_path / "diag.npz")
    assert not (tmp_path / "diag.npz").exists()
    # the simulator feeds the column from the log, and names it when a log lacks it
    run = RunLog("r", np.arange(3) * 10.0, np.tile(SPEC.nominal("inputs"), (3, 1)), np.zeros((3, SPEC.n_outputs)),
                 np.full((3, SPEC.n_states), np.nan), {"other": np.zeros(3)})
    with pytest.raises(ValueError, match="reads the extra column 'antifoam', which this log lacks"):
        RunSimulator(MODULE, m).run(run, SPEC.nominal("params"), SPEC.nominal("states"))


@pytest.mark.parametrize("name, match", [
    ("trace.antifoam", "a trace needs its time constant"),
    ("trace.antifoam:-5", "a trace needs its time constant"),
    ("since.antifoam:60", "only a trace takes a time constant"),
    ("e.feed_rate", "is an input of bioreactor: use u.feed_rate"),
    ("z.biomass", "expected x.<state>, u.<input>"),
])
def test_bad_extra_feature_names_are_refused(name, match):
    nf = SPEC.n_states + SPEC.n_inputs + (name.split(".")[0] in ("e", "since", "trace"))
    with pytest.raises(ValueError, match=match):
        ResidualModel.zeros(SPEC, ["co2"], [name], np.zeros(nf), np.ones(nf))


def test_a_simulation_resumed_mid_run_carries_the_event_state():
    """Segments (multiple shooting, windowed fits) start mid-run: the event state on entry
    is what the earlier steps left, so two segments give the one-piece trajectory."""
    m = _event_model()
    n = 90
    t = np.arange(n) * 10.0
    U = np.tile(SPEC.nominal("inputs"), (n, 1))
    U[[5, 6, 7, 30, 31, 60], SPEC.index("inputs", "base_flow")] = 0.004
    run = RunLog("r", t, U, np.zeros((n, SPEC.n_outputs)), np.full((n, SPEC.n_states), np.nan), {})
    sim = RunSimulator(MODULE, m)
    x0 = SPEC.nominal("states")
    _, X, _, _ = sim.run(run, SPEC.nominal("params"), x0)
    for mid in (6, 31, 45):
        _, Xa, x_mid, _ = sim.run(run, SPEC.nominal("params"), x0, 0, mid)
        _, Xb, _, _ = sim.run(run, SPEC.nominal("params"), x_mid, mid)
        np.testing.assert_array_equal(Xb[mid:], X[mid:])
