"""The loop: lockstep determinism, input handling, bounds, divergence, recording."""

import numpy as np
import pytest

from hil.scenario.config import parse_scenario
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


@pytest.mark.parametrize("path", ["fused", "staged"])
def test_non_finite_state_stops_the_run_and_keeps_the_recording(tmp_path, path):
    """A blow-up at step 99 (as a stiff plant with a bad parameter gives) stops the run with the
    state named, on the compiled step's fused path and on its staged path (hooks set)."""
    import dataclasses

    from numba import njit

    with _runtime(tmp_path, duration=600.0) as rt:
        real_step = rt.plant.model.step
        i_do = rt.spec.index("states", "dissolved_o2")
        t_fail = 99.5 * rt.dt_plant  # plant time during step 99

        @njit
        def failing_step(t, x, u, p, dt, n_sub, work):
            t = real_step(t, x, u, p, dt, n_sub, work)
            if t > t_fail:
                x[i_do] = np.inf
            return t

        rt.plant.model = dataclasses.replace(rt.plant.model, step=failing_step)
        if path == "staged":
            rt.hooks = _NoHooks()
        summary = rt.run()
    assert summary.state == "failed" and summary.steps == 100
    assert "dissolved_o2" in summary.error and "step 99" in summary.error
    df = read_recording(tmp_path / "run")
    assert len(df) == 100 and df["step"].iloc[-1] == 99
    assert read_meta(tmp_path / "run")["state"] == "failed"


class _NoHooks:
    """Per-step hooks that change nothing (Runtime.hooks): the step runs its staged path."""

    def pre(self, k, t):
        pass

    def actuate(self, k, t, u):
        pass

    def sense(self, k, t_end, y):
        pass


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


# ---- the process image's writers die or hang: what the loop applies ----
def test_loop_applies_the_last_complete_write_after_a_writer_died_mid_write(tmp_path):
    from hil.loop.health import REPAIR_AFTER_STEPS
    from tests.hil.test_image import kill_mid_write

    with _runtime(tmp_path, duration=20.0) as rt:
        i = rt.spec.index("inputs", "base_flow")
        rt.image.write_inputs([i], [0.005])  # a complete write (L/h)
        assert kill_mid_write(rt.image.name, i, 0.009) == -9  # SIGKILLed mid-write, 0.009 landed
        summary = rt.run()
    df = read_recording(tmp_path / "run")
    applied = df["app.base_flow"].to_numpy()
    # the loop repairs the image itself (no new writer comes) and applies the last complete write
    assert (applied[REPAIR_AFTER_STEPS - 1:] == 0.005).all()
    assert (applied != 0.009).all()  # nothing of the dead write ever reached the plant
    assert summary.input_repairs == 1 and summary.stale_input_steps == 0
    assert [a["kind"] for a in summary.alarms] == ["input_writer_died"]


def test_hung_writer_is_a_stale_input_alarm_in_status_and_summary(tmp_path):
    from tests.hil.test_image import start_hung_writer

    shown = []
    sc = parse_scenario(_with(loop__status_interval_s=0.001))
    with Runtime(sc, lockstep=True, duration_s=200.0, record=False) as rt:
        i = rt.spec.index("inputs", "base_flow")
        rt.image.write_inputs([i], [0.005])
        writer = start_hung_writer(rt.image.name)
        try:
            summary = rt.run(on_status=shown.append)
        finally:
            writer.kill()
            writer.join(10)
    assert summary.steps == 200 and summary.state == "stopped"
    assert summary.stale_input_steps > 150  # every step from the repair attempt on
    assert any(a["kind"] == "inputs_stale" for a in summary.alarms)
    assert any("inputs stale" in a for s in shown for a in s["alarms"])
    assert rt.u_app[i] == rt.spec.quantity("inputs", "base_flow").nominal  # held, never the torn value


# ---- status line, garbage collector ----
def test_status_callback_that_blocks_forever_does_not_stall_the_run():
    """A status sink that never returns (a full stderr pipe): the run still ends at its duration."""
    import gc
    import threading

    entered, release = threading.Event(), threading.Event()
    seen = {}

    def blocking(status):
        seen["gc_enabled"] = gc.isenabled()
        seen["frozen"] = gc.get_freeze_count()
        entered.set()
        release.wait(60)  # in the old code this held the loop; 60 s is only the test's safety net

    sc = parse_scenario(_with(loop__time_scale=200.0, loop__status_interval_s=0.005))  # 5 ms period
    with Runtime(sc, duration_s=100.0, record=False) as rt:
        summary = rt.run(on_status=blocking)
        returned_while_blocked = not release.is_set()
    release.set()
    assert summary.steps == 100 and summary.state == "stopped"
    assert entered.is_set() and returned_while_blocked
    assert summary.status_lines_dropped >= 1
    # the collector was frozen and disabled while the loop ran, and is back after
    assert seen["gc_enabled"] is False and seen["frozen"] > 1000
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert summary.gc["collections"] >= 1


# ---- sub-steps and state bounds ----
def test_substeps_are_derived_from_the_plants_max_substep(tmp_path):
    sc = parse_scenario(_with(loop__step_s=60.0, loop__time_scale=1.0))
    with Runtime(sc, lockstep=True, duration_s=600.0, record=False) as rt:
        assert rt.plant.substeps == 40  # 60 s / 1.5 s
        assert rt.run().substeps == 40


def test_explicit_substeps_longer_than_stable_are_refused():
    from hil.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_scenario(_with(loop__step_s=10.0, plant__substeps=2))
    assert err.value.path == "plant.substeps"
    assert "5 s each" in str(err.value) and "1.5 s" in str(err.value) and "at least 7" in str(err.value)
    assert "loop.step_s = 10 s" in str(err.value)
    parse_scenario(_with(loop__step_s=10.0, plant__substeps=7))  # 1.43 s each: fine


def _overfilled(**changes):
    """Full feed into a nearly full vessel: the volume passes its 150 L bound after ~10 h."""
    return parse_scenario(_with(plant__initial_state={"volume": 145.0}, loop__step_s=60.0,
                                inputs__feed_rate={"driver": "fixed", "value": 0.5}, **changes))


def test_states_out_of_bounds_are_counted_per_state_and_alarmed(tmp_path):
    with Runtime(_overfilled(), lockstep=True, duration_s=20 * 3600.0, record_path=str(tmp_path / "r")) as rt:
        summary = rt.run()
    df = read_recording(tmp_path / "r")
    out = int((df["x.volume"] > 150.0).sum())
    assert out > 0 and summary.state == "stopped" and summary.exit_code == 0
    assert summary.state_out_of_bounds == {"volume": out}
    alarm, = [a for a in summary.alarms if a["kind"] == "state_out_of_bounds"]
    assert alarm["source"] == "volume" and "[50, 150]" in alarm["message"]


def test_state_out_of_bounds_fails_the_run_when_the_scenario_says_so():
    from hil.loop.health import EXIT_STATE_OUT_OF_BOUNDS

    with Runtime(_overfilled(loop__on_state_out_of_bounds="fail"), lockstep=True, duration_s=20 * 3600.0,
                 record=False) as rt:
        summary = rt.run()
    assert summary.state == "failed" and summary.stop_reason == "state out of bounds"
    assert summary.exit_code == EXIT_STATE_OUT_OF_BOUNDS == 3
    assert summary.steps < 1200 and summary.state_out_of_bounds == {"volume": 1}
    assert "volume" in summary.error and "150" in summary.error
    assert rt.plant.x[rt.spec.index("states", "volume")] > 150.0


def test_nominal_runs_report_no_state_out_of_bounds():
    for cfg in ("bioreactor.toml", "bioreactor_plc.toml"):
        from hil.scenario.config import load_scenario
        from tests.hil.test_config import ROOT

        with Runtime(load_scenario(ROOT / "configs" / cfg), lockstep=True, record=False) as rt:
            summary = rt.run()
        assert summary.state == "stopped" and summary.state_out_of_bounds == {} and summary.alarms == []


# ---- helper processes ----
def test_recorder_killed_mid_run_stops_the_run_with_exit_4(tmp_path):
    import os
    import signal

    from hil.loop.health import EXIT_PROCESS_DIED

    def kill_recorder(rt):
        os.kill(rt.recorder.pid, signal.SIGKILL)
        rt.recorder.process.join(10)

    sc = parse_scenario(_with(loop__status_interval_s=0.001))
    with Runtime(sc, lockstep=True, duration_s=86400.0, record_path=str(tmp_path / "r")) as rt:
        summary = rt.run(on_started=kill_recorder)
    assert summary.state == "failed" and summary.exit_code == EXIT_PROCESS_DIED == 4
    assert summary.dead_processes == {"recorder": "killed by SIGKILL"}
    assert summary.steps < 86400 and "recorder" in summary.error
    assert any(a["kind"] == "process_died" and a["source"] == "recorder" for a in summary.alarms)
