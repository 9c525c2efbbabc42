"""The loop: lockstep determinism, input handling, bounds, divergence, recording."""

import numpy as np
import pytest

from hil.config import parse_scenario
from hil.errors import PlantDiverged
from hil.recorder import read_meta, read_recording
from hil.runtime import Runtime
from tests.hil.test_config import _with


def _runtime(tmp_path, name="run", duration=600.0, **changes):
    sc = parse_scenario(_with(**changes))
    return Runtime(sc, lockstep=True, duration_s=duration, record_path=str(tmp_path / name))


def test_lockstep_runs_are_identical_bit_for_bit(tmp_path):
    frames = []
    for name in ("a", "b"):
        with _runtime(tmp_path, name) as rt:
            summary = rt.run()
        assert summary.state == "stopped" and summary.steps == 600
        frames.append(read_recording(tmp_path / name).drop(columns=["wall_ns"]))
    assert len(frames[0]) == 600
    assert frames[0].equals(frames[1])


def test_profile_inputs_follow_their_schedule(tmp_path):
    with _runtime(tmp_path, duration=40.0, inputs__feed_rate__profile=[[0.0, 0.0], [10.0, 0.1], [30.0, 0.2]]) as rt:
        rt.run()
    df = read_recording(tmp_path / "run")
    t_start = df["t_s"] - 1.0  # t_s is the end of the step; the command applies from its start
    expected = np.where(t_start < 10, 0.0, np.where(t_start < 30, 0.1, 0.2))
    np.testing.assert_array_equal(df["app.feed_rate"], expected)


def test_out_of_bounds_commands_are_clipped_and_counted(tmp_path):
    with _runtime(tmp_path, duration=10.0) as rt:
        i = rt.spec.index("inputs", "base_flow")
        rt.image.write_inputs([i], [1.0])  # physical bound is 0.01 L/h
        summary = rt.run()
    df = read_recording(tmp_path / "run")
    assert summary.clipped_inputs == 10
    assert (df["cmd.base_flow"] == 1.0).all()
    assert (df["app.base_flow"] == rt.spec.quantity("inputs", "base_flow").high).all()


def test_non_finite_command_holds_the_previous_one(tmp_path):
    with _runtime(tmp_path, duration=5.0) as rt:
        i = rt.spec.index("inputs", "base_flow")
        rt.image.write_inputs([i], [np.nan])
        summary = rt.run()
    df = read_recording(tmp_path / "run")
    assert summary.non_finite_inputs == 5 and summary.clipped_inputs == 0
    assert (df["app.base_flow"] == rt.spec.quantity("inputs", "base_flow").nominal).all()
    assert np.isfinite(df.filter(like="x.").to_numpy()).all()


def test_non_finite_state_stops_the_run_and_keeps_the_recording(tmp_path):
    with _runtime(tmp_path, duration=600.0) as rt:
        real_step = rt.plant._step
        calls = {"n": 0}

        def failing_step(t, x, u, p, dt, n_sub, work):
            calls["n"] += 1
            t = real_step(t, x, u, p, dt, n_sub, work)
            if calls["n"] == 100:  # a blow-up, as a stiff plant with a bad parameter gives
                x[rt.spec.index("states", "dissolved_o2")] = np.inf
            return t

        rt.plant._step = failing_step
        summary = rt.run()
    assert summary.state == "failed" and summary.steps == 100
    assert "dissolved_o2" in summary.error and "step 99" in summary.error
    df = read_recording(tmp_path / "run")
    assert len(df) == 100 and df["step"].iloc[-1] == 99
    assert read_meta(tmp_path / "run")["state"] == "failed"


def test_realtime_run_keeps_its_period_and_reports_lateness(tmp_path):
    sc = parse_scenario(_with(loop__time_scale=200.0))  # 5 ms period
    with Runtime(sc, duration_s=100.0, record=False) as rt:
        summary = rt.run().as_dict()
    assert summary["mode"] == "realtime" and summary["steps"] == 100
    # 100 periods of 5 ms: the run cannot be shorter than its deadlines allow
    assert summary["wall_time_s"] >= 99 * 0.005
    assert set(summary["lateness_us"]) >= {"p50", "p99", "p999", "max"}
    assert summary["lateness_us"]["n"] == 100


def test_plant_diverged_error_names_state():
    err = PlantDiverged("glucose", 5, 6.0)
    assert "glucose" in str(err) and "recording kept" in str(err)
