"""The safety process's reactions seen from outside (three real processes over the bus):
after it hangs and the loop's watchdog applied its own fallback, its actions move the
actuators from the APPLIED value at the rate limit, never back to where it last was in one
step; a dead policy is reported as lost, not only as silent steps."""

import json
import os
import signal

import numpy as np
import pytest

from hil.scenario.config import parse_scenario
from hil.recorder import read_recording
from hil.runtime import Runtime
from tests.hil.safety.helpers import CONFIG, base_dict, chain_changes, merge, read_log, remove_ipc_dirs

RATE = {"app.agitation_power": 2.0, "app.base_flow": 0.0005}  # per sim s ([safety.projection].rate)


@pytest.fixture(autouse=True)
def _clean_ipc_dirs():
    yield
    remove_ipc_dirs()


def test_resumed_safety_ramps_from_the_applied_fallback_at_the_rate_limit(tmp_path):
    changes = chain_changes(tmp_path, "ipc", loop={"time_scale": 50.0},  # 20 ms period
                            safety={"mode": "full", "rollout": {"auto_promote": False}})
    sc = parse_scenario(merge(base_dict(), changes))
    marks, holder = {}, []

    def on_status(status):
        h = holder[0]._policy_handles
        if "stop" not in marks and status["sim_time_s"] >= 40.0:
            marks["stop"] = status["steps"] - 1
            os.kill(h.safety.pid, signal.SIGSTOP)
        elif "stop" in marks and "cont" not in marks and status["sim_time_s"] >= 80.0:
            marks["cont"] = status["steps"] - 1
            os.kill(h.safety.pid, signal.SIGCONT)

    rt = Runtime(sc, lockstep=False, duration_s=140.0, record_path=str(tmp_path / "rec"),
                 scenario_path=str(CONFIG))
    holder.append(rt)
    try:
        summary = rt.run(on_status)
    finally:
        rt.close()
    assert summary.state == "stopped", summary.error
    assert "cont" in marks and summary.extra["bus"]["watchdog_trips"] >= 1
    df = read_recording(tmp_path / "rec").set_index("step")
    app = df.loc[marks["cont"]:, list(RATE)]
    fallback = np.array([30.0, 0.0003])  # [bus].fallback_action (agitation, base)
    assert np.allclose(app.iloc[0].to_numpy(), fallback)  # the loop's own action while the safety hung
    before = df.loc[marks["stop"] - 5:marks["stop"], "app.agitation_power"]
    assert (abs(before - 30.0) > 5.0).all()  # the safety had the agitator well away from 30 W
    # what the plant got after the resume: every step within the rate limit of the previous one
    for col, rate in RATE.items():
        steps = np.abs(np.diff(app[col].to_numpy()))
        assert steps.max() <= rate * sc.loop.step_s * (1 + 1e-9), (col, steps.max(), int(np.argmax(steps)))
    # and the safety said why it started from there
    log = read_log(tmp_path / "decisions.jsonl")
    ov = [r for r in log if r["event"] == "applied_override" and r["step"] >= marks["stop"]]
    assert ov and "agitation_power" in ov[0]["inputs"] and ov[0]["applied"][1] == pytest.approx(30.0)


def test_a_dead_policy_raises_policy_lost_in_the_status_not_just_silent_steps(tmp_path):
    """The policy process is killed before the run (lockstep): the safety decides every step
    with the baseline and, after [safety].policy_lost_after_s, says the policy is lost."""
    changes = chain_changes(tmp_path, "ipc", safety={"mode": "full", "rollout": {"auto_promote": False},
                                                     "policy_lost_after_s": 10.0})
    sc = parse_scenario(merge(base_dict(), changes))
    rt = Runtime(sc, lockstep=True, duration_s=30.0, record_path=str(tmp_path / "rec"), scenario_path=str(CONFIG))
    start = rt._start_children

    def start_then_kill():
        start()
        rt._policy_handles.policy.kill()
        rt._policy_handles.policy.wait(5)

    rt._start_children = start_then_kill
    try:
        summary = rt.run()
    finally:
        rt.close()
    assert summary.state == "stopped", summary.error
    st = json.loads((tmp_path / "safety-status.json").read_text())
    assert st["policy"]["state"] == "lost" and st["counters"]["policy_lost"] == 1
    lost = [a for a in st["alarms"] if a["rule"] == "policy_lost"]
    assert len(lost) == 1 and lost[0]["message"].startswith("policy lost: no valid proposal for 10 s")
    assert summary.extra["bus"]["lockstep_timeouts"] == 0  # the safety answered every step itself
