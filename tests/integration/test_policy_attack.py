"""The policy is untrusted code: a hostile `[policy] entry` that hunts for the run's bus secret
(issue 17) gets nothing, and nothing it sends is applied.

Three real processes (loop, policy, safety) started by the runtime, lockstep over tcp (the
action socket is reachable by any local process: the test is about the key, not the socket).
The policy (tests/integration/hostile_policies.py) reads the run directory's key file, the
loop's and the safety's /proc environ and mem, kernel memory and its own environment; with any
secret it finds it signs actions proposing 77.7 W agitation (the issue's reproduction, which on
the old design applied 77.7 W in 599 of 600 steps, above the 60 W shear limit and past the
2 W/s rate limit). Asserted on the APPLIED inputs of the recording.
"""

import json

import numpy as np
import pytest

from hil.scenario.config import parse_scenario
from hil.recorder import read_recording
from hil.runtime import Runtime
from tests.hil.safety.helpers import CONFIG, base_dict, chain_changes, merge, read_log, remove_ipc_dirs

ACTIONS = ["agitation_power", "base_flow"]
SHEAR_W_PER_L = 0.6  # [[safety.projection.linear]] shear: agitation_power <= 0.6 W/L x volume
RATE_W_PER_S = 2.0  # [safety.projection] rate.agitation_power, W per simulated s (step_s = 1 s)


@pytest.fixture(autouse=True)
def _clean_ipc_dirs():
    yield
    remove_ipc_dirs()


def _hostile_scenario(tmp_path):
    data = merge(base_dict(), chain_changes(tmp_path, "tcp", bus={"ipc_dir": str(tmp_path / "run")},
                                            safety={"log_every_step": True}))
    data["policy"] = {"entry": "tests.integration.hostile_policies:Thief", "inputs": ACTIONS,
                      "features": ["dissolved_oxygen", "u.agitation_power"]}
    sc = parse_scenario(data)
    assert sc.safety.mode == "shadow"  # the reproduction: shadow mode
    return sc


def test_hostile_policy_obtains_no_secret_and_none_of_its_actions_is_applied(tmp_path, monkeypatch):
    sc = _hostile_scenario(tmp_path)
    monkeypatch.setenv("HIL_ATTACK_ACTION_EP", sc.bus.endpoints["action"])
    rt = Runtime(sc, lockstep=True, duration_s=300.0, record_path=str(tmp_path / "rec"), scenario_path=str(CONFIG))
    report_path = tmp_path / "run" / "policy" / "attack-report.json"
    try:
        summary = rt.run()
    finally:
        rt.close()
    assert summary.state == "stopped", summary.error
    report = json.loads(report_path.read_text())
    df = read_recording(tmp_path / "rec")

    # what it tried, and that it got nothing of anyone else's
    tried = report["tried"]
    # listing another process's fd numbers is allowed (numbers, no content); opening one is not
    others = [t for t in tried if not t.startswith(("read own", "list loop fds", "list safety fds"))]
    assert report["pids"]["safety"] and report["attempts"] >= 2, report
    for what in ("read run dir key", "listdir run dir", "read loop environ", "read safety environ",
                 "read loop mem", "read safety mem", "read /proc/kcore"):
        assert what in tried, what
    assert not [t for t in others if tried[t]["ok"] and t != "find safety"], tried
    assert report["secrets_found"] == [] and report["own_env_bus_vars"] == [], report
    # it did find the keys it holds (obs, proposal, command), tried them on the action channel
    assert {"heap:obs", "heap:proposal", "heap:command"} <= set(report["channel_keys_found"])
    assert "heap:action" not in report["channel_keys_found"]
    assert report["forged_sent"] > 100
    conf = summary.extra["policy"]["confinement"]
    assert conf["kind"] in ("uid", "landlock"), conf  # what the run obtained, in its summary
    if conf["kind"] == "landlock":
        assert conf["landlock"].startswith("ABI") and conf["threads"] == 1, conf  # no thread left unconfined
        if conf.get("euid") == 0:
            assert conf["capabilities"] == "dropped", conf

    # what the loop APPLIED: the genuine safety's decision every step, never the policy's 77.7 W
    c = summary.extra["bus"]
    assert c["watchdog_trips"] == 0 and c["fallback_steps"] == 0 and c["actions_applied"] == 299, c
    assert c["action_dropped_auth"] > 100, c  # its forged frames arrived and were refused
    app = df.set_index("step")[["app.agitation_power", "app.base_flow"]]
    assert not np.isclose(app["app.agitation_power"], 77.7).any()
    log = read_log(tmp_path / "decisions.jsonl")
    acts = {r["step"]: r["action"] for r in log if r["event"] == "decision"}
    for j in range(299):  # the action for observation j applies at step j + 1 ([agitation, base])
        np.testing.assert_allclose(app.loc[j + 1].to_numpy(), acts[j], rtol=1e-12, err_msg=f"step {j + 1}")
    assert all(r["proposal"][0] == pytest.approx(77.7) for r in log if r["event"] == "decision"
               and r.get("proposal") is not None)  # the policy did propose it, every time it answered
    # within the shear limit (volume observed the step before) and the rate limit, every step
    agit = app["app.agitation_power"].to_numpy()
    vol = df.set_index("step")["meas.volume"].to_numpy()
    assert (agit[1:] <= SHEAR_W_PER_L * vol[:-1] + 1e-9).all()
    assert (np.abs(np.diff(agit)) <= RATE_W_PER_S * sc.loop.step_s * (1 + 1e-9)).all()
