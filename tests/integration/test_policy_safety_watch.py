"""The loop watches its safety process (hil/safety/watch.py): killed or stopped mid-run, the
safety raises an alarm, shows in `dead_processes`, and with `[safety] required` (the default)
the run exits 8 (issue 17: both ended with exit 0, no alarm, empty dead_processes).

Real time (50x, 20 ms period), three real processes started by the runtime; the fault is
injected from the status callback. Asserted on the summary and on the APPLIED inputs.
"""

import os
import signal

import numpy as np
import pytest

from hil.scenario.config import parse_scenario
from hil.loop.health import EXIT_SAFETY_LOST
from hil.recorder import read_recording
from hil.runtime import Runtime
from tests.hil.safety.helpers import CONFIG, base_dict, chain_changes, merge, remove_ipc_dirs

FALLBACK = np.array([0.0003, 30.0])  # [bus].fallback_action: base_flow, agitation_power
RATE = np.array([0.0005, 2.0])  # [safety.projection].rate per sim s (step_s = 1 s)


@pytest.fixture(autouse=True)
def _clean_ipc_dirs():
    yield
    remove_ipc_dirs()


def _run(tmp_path, fault_at_s, fault, safety=None, duration=80.0):
    changes = {"loop": {"time_scale": 50.0},
               "safety": {"mode": "full", "rollout": {"auto_promote": False}, **(safety or {})}}
    sc = parse_scenario(merge(base_dict(), chain_changes(tmp_path, **changes)))
    rt = Runtime(sc, lockstep=False, duration_s=duration, record_path=str(tmp_path / "rec"), scenario_path=str(CONFIG))
    marks = {}

    def on_status(status):
        h = rt._policy_handles
        if h is not None and status["sim_time_s"] >= fault_at_s:
            fault(h, status, marks)

    try:
        summary = rt.run(on_status)
    finally:
        rt.close()
    return summary, read_recording(tmp_path / "rec"), marks


def _kill(h, status, marks):
    if "step" not in marks:
        marks["step"] = status["steps"] - 1
        os.kill(h.safety.pid, signal.SIGKILL)


def _ramps_to_fallback(df, from_step, min_steps=5):
    """The APPLIED values after the safety is gone: the loop's fallback, approached at the rate
    limits from where the safety left them, never a step change."""
    app = df.set_index("step")[["app.base_flow", "app.agitation_power"]].loc[from_step:].to_numpy()
    assert len(app) > min_steps
    assert (np.abs(np.diff(app, axis=0)) <= RATE * (1 + 1e-9)).all()
    return app


def test_killed_required_safety_stops_the_run_with_exit_8_alarm_and_dead_process(tmp_path):
    summary, df, marks = _run(tmp_path, 20.0, _kill)
    assert "step" in marks
    assert summary.state == "failed" and summary.stop_reason == "safety lost", (summary.state, summary.stop_reason)
    assert summary.exit_code == EXIT_SAFETY_LOST == 8
    assert summary.dead_processes == {"safety": "killed by SIGKILL"}, summary.dead_processes
    alarms = [a for a in summary.alarms if a["kind"] == "safety_died"]
    assert len(alarms) == 1 and "killed by SIGKILL" in alarms[0]["message"], summary.alarms
    assert summary.steps < 80  # stopped at the next status tick, not run to the end on the fallback
    _ramps_to_fallback(df, marks["step"], min_steps=1)
    assert summary.extra["safety_watch"]["died"] == "killed by SIGKILL"


def test_killed_optional_safety_alarms_and_the_run_goes_on_under_the_fallback(tmp_path):
    summary, df, marks = _run(tmp_path, 20.0, _kill, safety={"required": False})
    assert summary.state == "stopped" and summary.exit_code == 0 and summary.steps == 80
    assert summary.dead_processes == {"safety": "killed by SIGKILL"}
    assert [a["kind"] for a in summary.alarms].count("safety_died") == 1
    app = _ramps_to_fallback(df, marks["step"])
    np.testing.assert_allclose(app[-1], FALLBACK, rtol=1e-12)  # reached the fallback and held it
    assert summary.extra["bus"]["watchdog_trips"] >= 1


def test_stopped_safety_raises_a_hang_alarm_and_exit_8_after_it_resumes(tmp_path):
    def stop_then_continue(h, status, marks):
        if "stop" not in marks:
            marks["stop"] = status["steps"] - 1
            os.kill(h.safety.pid, signal.SIGSTOP)
        elif "cont" not in marks and status["sim_time_s"] >= 130.0:  # 2.2 s of wall time stopped
            marks["cont"] = status["steps"] - 1
            os.kill(h.safety.pid, signal.SIGCONT)

    summary, df, marks = _run(tmp_path, 20.0, stop_then_continue, safety={"hang_s": 1.0}, duration=170.0)
    assert "cont" in marks
    assert summary.state == "stopped" and summary.steps == 170  # it came back: the run went on
    assert summary.exit_code == EXIT_SAFETY_LOST, summary.warnings
    hung = [a for a in summary.alarms if a["kind"] == "safety_hung"]
    assert len(hung) == 1 and "no heartbeat" in hung[0]["message"], summary.alarms
    assert not hung[0]["active"] and "answers again" in hung[0]["message"]
    assert marks["stop"] <= hung[0]["step"] <= marks["cont"]
    assert summary.dead_processes == {}
    assert any("hung" in w and "exit code 8" in w for w in summary.warnings), summary.warnings
    _ramps_to_fallback(df, marks["stop"])  # the loop's fallback acted meanwhile, at the rate limits


def test_killed_safety_with_restart_is_replaced_and_its_successor_acts_again(tmp_path):
    """[safety] restart: the run goes on; the new safety (same secret, newer session) resumes in
    the predecessor's mode (full here), and the plant again gets ITS decisions: asserted on the
    APPLIED inputs against the new process's decision log records."""
    from tests.hil.safety.helpers import read_log

    safety = {"log_every_step": True, "restart": {"max_restarts": 1, "backoff_s": 0.2}}
    # 12 s of wall time: a new Python process (numpy, Numba's cache) comes up in a few s when loaded
    summary, df, marks = _run(tmp_path, 20.0, _kill, safety=safety, duration=600.0)
    assert summary.state == "stopped" and summary.exit_code == 0 and summary.steps == 600, \
        (summary.warnings, summary.extra["safety_watch"])
    watch = summary.extra["safety_watch"]
    assert watch["deaths"] == 1 and watch["restarts"] == 1 and watch["state"] == "up", watch
    assert summary.dead_processes == {}
    died = [a for a in summary.alarms if a["kind"] == "safety_died"]
    assert len(died) == 1 and not died[0]["active"] and "restart #1" in died[0]["message"], summary.alarms
    assert any("restarted 1 time" in w for w in summary.warnings), summary.warnings
    log = read_log(tmp_path / "decisions.jsonl")
    restart = [r for r in log if r["event"] == "restart"]
    assert len(restart) == 1 and restart[0]["mode"] == "full", restart
    i = log.index(restart[0])
    after = {r["step"]: r for r in log[i:] if r["event"] == "decision"}
    assert after and min(after) > marks["step"]
    # the successor decides on the policy's proposals; on a loaded machine a proposal may miss its
    # step (the policy process is 50x real time too), and the safety then says so: baseline:silent
    sources = [r["source"] for r in after.values()]
    assert set(sources) <= {"policy", "baseline:silent"}, set(sources)
    assert sources.count("policy") >= 0.8 * len(sources), (sources.count("policy"), len(sources))
    app = df.set_index("step")[["app.base_flow", "app.agitation_power"]]
    steps = [j for j in sorted(after) if (j + 1) in app.index]
    assert len(steps) > 30
    matched = sum(np.allclose(app.loc[j + 1].to_numpy(), after[j]["action"]) for j in steps)
    assert matched >= 0.9 * len(steps), (matched, len(steps))  # (a late step may apply the held action)
