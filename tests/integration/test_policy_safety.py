"""The loop, the policy and the safety wrapper as three processes over the bus (hil.runtime).

Real sockets (ipc:// in a short temp dir, or tcp://127.0.0.1 on free ports), real child
processes started by hil.safety.launch through the runtime, faults injected mid-run.
"""

import json
import math
import os
import signal
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from hil.bus import SCHEMA_VERSION, Sender
from hil.scenario.config import parse_scenario
from hil.recorder import read_recording
from hil.runtime import Runtime
from plants.base import load_plant_module
from tests.hil.safety.helpers import (
    CONFIG,
    base_dict,
    chain_changes,
    copy_policies,
    merge,
    read_log,
    remove_ipc_dirs,
)

SPEC = load_plant_module("bioreactor").SPEC
LO, HI = SPEC.lows("outputs"), SPEC.highs("outputs")
Y_COLS = [f"y.{n}" for n in SPEC.names("outputs")]


@pytest.fixture(autouse=True)
def _clean_ipc_dirs():
    yield
    remove_ipc_dirs()


def _scenario(tmp_path, transport="ipc", **changes):
    data = merge(base_dict(), chain_changes(tmp_path, transport, **changes))
    return parse_scenario(data)


def _run(tmp_path, sc, *, lockstep, duration, on_status=None, setup=None, name="rec"):
    rt = Runtime(sc, lockstep=lockstep, duration_s=duration, record_path=str(tmp_path / name),
                 scenario_path=str(CONFIG))
    try:
        if setup is not None:
            setup(rt)
        summary = rt.run(on_status)
        handles = rt.__dict__.get("_policy_handles")
        assert handles is None  # the runtime stopped its children
    finally:
        rt.close()
    assert summary.state == "stopped", summary.error
    return summary, read_recording(tmp_path / name)


def _in_bounds(df):
    y = df[Y_COLS].to_numpy()
    assert np.isfinite(y).all()
    assert (y >= LO).all() and (y <= HI).all()


def _decisions(log, step_from=None):
    return [r for r in log if r["event"] == "decision" and (step_from is None or r["step"] >= step_from)]


FULL = {"safety": {"mode": "full", "log_every_step": True, "rollout": {"auto_promote": False}}}


def test_lockstep_chain_is_reproducible(tmp_path):
    frames, counters = [], []
    for name in ("a", "b"):
        sc = _scenario(tmp_path / name, **FULL)
        (tmp_path / name).mkdir()
        summary, df = _run(tmp_path / name, sc, lockstep=True, duration=300.0)
        frames.append(df.drop(columns=["wall_ns", "lateness_us"]))
        counters.append(summary.extra["bus"])
    assert len(frames[0]) == 300
    assert frames[0].equals(frames[1])
    for c in counters:
        assert c["actions_applied"] == 299 and c["lockstep_timeouts"] == 0 and c["watchdog_trips"] == 0
    log = read_log(tmp_path / "a" / "decisions.jsonl")
    acted = {r["step"]: r["source"] for r in _decisions(log)}
    # the policy acted throughout (the last observation's answer races the end of the run)
    assert all(acted.get(k) == "policy" for k in range(299)), {k: v for k, v in acted.items() if v != "policy"}
    _in_bounds(frames[0])


def test_policy_killed_mid_run_fallback_within_two_periods(tmp_path):
    sc = _scenario(tmp_path, loop={"time_scale": 50.0}, **FULL)  # 20 ms period
    killed = {}

    def on_status(status):
        h = rt_holder[0]._policy_handles
        if not killed and status["sim_time_s"] >= 60.0:
            killed["step"] = status["steps"] - 1  # the observation just published
            os.kill(h.policy.pid, signal.SIGKILL)
            killed["code"] = h.policy.wait(5)

    rt_holder = []
    summary, df = _run(tmp_path, sc, lockstep=False, duration=150.0, on_status=on_status,
                       setup=rt_holder.append)
    assert killed["code"] == -signal.SIGKILL
    k = killed["step"]
    log = read_log(tmp_path / "decisions.jsonl")
    after = _decisions(log, step_from=k + 1)
    first_silent = min(r["step"] for r in _decisions(log) if r["source"] == "baseline:silent" and r["step"] >= k)
    assert first_silent <= k + 2, (k, first_silent)
    assert all(r["source"] == "baseline:silent" for r in after if r["step"] >= first_silent)
    assert any(r["event"] == "silent_enter" and r["step"] >= k for r in log)
    # the baseline's actions are what the plant got: the action for observation j applies at step j + 1
    acts = {r["step"]: r["action"] for r in after}
    steps = [j for j in range(first_silent, int(df["step"].max())) if j in acts and (j + 1) in set(df["step"])]
    assert len(steps) > 50
    app = df.set_index("step")[["app.base_flow", "app.agitation_power"]]
    matched = [j for j in steps if np.allclose(app.loc[j + 1].to_numpy(), acts[j])]
    # a decision that came late applies one step later: that step holds the applied action (seen
    # under suite load: 83 of 88 matched), never anything else
    held = [j for j in steps if j not in matched and j in app.index and np.array_equal(app.loc[j + 1].to_numpy(),
                                                                                      app.loc[j].to_numpy())]
    assert len(matched) + len(held) == len(steps), sorted(set(steps) - set(matched) - set(held))
    assert len(matched) >= 0.8 * len(steps)
    _in_bounds(df)
    assert df["y.dissolved_oxygen"].min() > 20.0
    assert summary.extra["bus"]["watchdog_trips"] == 0 or summary.extra["bus"]["fallback_steps"] < 10


def test_safety_hung_loop_fallback_acts_then_recovers(tmp_path):
    sc = _scenario(tmp_path, loop={"time_scale": 50.0}, **FULL)
    marks = {}

    def on_status(status):
        h = rt_holder[0]._policy_handles
        if "stop" not in marks and status["sim_time_s"] >= 40.0:
            marks["stop"] = status["steps"] - 1
            os.kill(h.safety.pid, signal.SIGSTOP)
        elif "stop" in marks and "cont" not in marks and status["sim_time_s"] >= 80.0:
            marks["cont"] = status["steps"] - 1
            os.kill(h.safety.pid, signal.SIGCONT)

    rt_holder = []
    summary, df = _run(tmp_path, sc, lockstep=False, duration=140.0, on_status=on_status, setup=rt_holder.append)
    bus = summary.extra["bus"]
    assert bus["watchdog_trips"] >= 1 and bus["fallback_steps"] >= 20
    fallback = np.array([0.0003, 30.0])  # [bus].fallback_action
    rate_dt = np.array([0.0005, 2.0]) * 1.0  # [safety.projection].rate (per sim s) x step_s
    app = df.set_index("step")[["app.base_flow", "app.agitation_power"]]
    s, c = marks["stop"], marks["cont"]
    # the loop's own fallback moves the APPLIED values toward its action at the safety's rate limits
    jumps = np.abs(np.diff(app.loc[s:c].to_numpy(), axis=0))
    assert (jumps <= rate_dt * (1 + 1e-9)).all(), jumps.max(axis=0)
    assert abs(app.loc[s, "app.agitation_power"] - 30.0) > 4.0  # far enough that a step change would show
    assert bus["fallback_rate_limited_steps"] >= 2
    # ... reaches it and holds it until the safety comes back
    held = [np.allclose(app.loc[j].to_numpy(), fallback) for j in range(s + 4, c)]
    assert any(held) and all(held[held.index(True):]), held
    # the safety process resumes: its actions apply again, the loop's fallback stops
    tail = app.loc[c + 20:].to_numpy()
    assert len(tail) > 20 and not any(np.allclose(r, fallback) for r in tail)
    _in_bounds(df)
    status = json.loads((tmp_path / "safety-status.json").read_text())
    assert status["counters"]["proposal_dropped_too_old"] > 0  # the backlog it woke up to


def test_drifting_do_sensor_monitor_rolls_back_and_says_why(tmp_path):
    pol = copy_policies(tmp_path, extra_known_good=True)  # v1 good, v2 bad candidate, v3 good
    sc = _scenario(tmp_path, policy={"directory": str(pol), "version": "v3"},
                   safety={"mode": "full", "rollout": {"auto_promote": False}, "monitor": {"demote_to": None}})
    i_do = SPEC.index("outputs", "dissolved_oxygen")

    def drift(rt):
        publish = rt.bus.after_step

        def biased(step, t_s, y_meas, u_applied):
            y = y_meas.copy()
            y[i_do] -= 0.5 * max(0.0, t_s - 30.0)  # the DO probe drifts -0.5 %/s from t = 30 s
            publish(step, t_s, y, u_applied)

        rt.bus.after_step = biased

    summary, df = _run(tmp_path, sc, lockstep=True, duration=300.0, setup=drift)
    log = read_log(tmp_path / "decisions.jsonl")
    rollbacks = [r for r in log if r["event"] == "rollback"]
    assert rollbacks, [r for r in log if r["event"] != "decision"][:20]
    first = rollbacks[0]
    assert first["from"] == "v3" and first["to"] == "v1"  # previous known-good: skips candidate v2
    assert "rule do_low: dissolved_oxygen < 20 for 30 s" in first["reason"]
    alarms = [r for r in log if r["event"] == "alarm"]
    assert alarms and alarms[0]["rule"] == "do_low" and alarms[0]["t_s"] == first["t_s"]
    status = json.loads((tmp_path / "safety-status.json").read_text())
    assert status["alarm_count"] >= 1 and "v3" in status["rolled_back"]
    assert status["rollbacks"][0]["reason"].startswith("rule do_low")
    # the true DO was fine all along (it is the probe that drifted), and nothing left its bounds
    _in_bounds(df)
    assert df["y.dissolved_oxygen"].min() > 30.0


def test_bad_version_trips_the_monitor_and_the_previous_good_one_recovers(tmp_path):
    sc = _scenario(tmp_path, policy={"version": "v2"},
                   safety={"mode": "full", "rollout": {"auto_promote": False}, "monitor": {"demote_to": None},
                           "log_every_step": True})
    summary, df = _run(tmp_path, sc, lockstep=True, duration=700.0)
    log = read_log(tmp_path / "decisions.jsonl")
    rb = [r for r in log if r["event"] == "rollback"]
    assert len(rb) == 1 and (rb[0]["from"], rb[0]["to"]) == ("v2", "v1")
    t_rb = rb[0]["t_s"]
    do = df.set_index("t_s")["y.dissolved_oxygen"]
    assert do.loc[:t_rb].min() < 20.0  # v2 did starve the culture of oxygen
    # v1 is acting again (its proposals accepted) and DO is back near its setpoint
    late = _decisions(log, step_from=int(t_rb) + 60)
    assert late and all(r["source"] == "policy" for r in late)
    assert do.iloc[-50:].min() > 35.0
    _in_bounds(df)


def test_shadow_mode_logs_proposals_never_applies_them_over_tcp(tmp_path):
    sc = _scenario(tmp_path, transport="tcp", policy={"version": "v2"},
                   safety={"mode": "shadow", "rollout": {"auto_promote": False}})
    summary, df = _run(tmp_path, sc, lockstep=True, duration=400.0)
    log = read_log(tmp_path / "decisions.jsonl")
    dec = {r["step"]: r for r in _decisions(log)}
    assert len(dec) >= 399 and all(r["source"] == "baseline:shadow" for r in dec.values())  # (last: races the end)
    assert all(r["proposal"] is not None for r in dec.values())
    app = df.set_index("step")["app.agitation_power"]
    differ = 0
    for j in range(0, 399):
        assert app.loc[j + 1] == pytest.approx(dec[j]["action"][1], rel=1e-12)  # the baseline's action
        differ += abs(dec[j]["proposal"][1] - dec[j]["action"][1]) > 0.5
    assert differ > 100  # the bad policy wanted something else, many times
    assert not [r for r in log if r["event"] in ("alarm", "rollback")]
    assert df["y.dissolved_oxygen"].min() > 30.0  # its proposals would have sent DO to 12 %


ATTACKER = r"""
import json, sys, time, zmq, msgpack
action, proposal, control, out, ready = sys.argv[1:6]
ctx = zmq.Context()
to_loop = ctx.socket(zmq.PUSH); to_loop.connect(action)
to_safety = ctx.socket(zmq.PUSH); to_safety.connect(proposal)
req = ctx.socket(zmq.REQ); req.setsockopt(zmq.LINGER, 0); req.connect(control)
evil = [0.0044, 77.7]
import struct
from hil.bus.wire import KIND_CODES, pack_frame, pack_str
def msg(kind, sid, seq, step, payload):  # a well-formed frame of the current format, without a valid tag
    a = payload["a"]
    if kind == "action":
        body = struct.pack("<2d", *a) + pack_str(payload["source"]) + pack_str(payload["mode"])
    else:
        body = struct.pack("<3d", payload["compute_us"], *a) + pack_str(payload["version"])
    return pack_frame(KIND_CODES[kind], sid=sid, seq=seq, step=step, t_s=float(step + 1), wall_ns=time.time_ns(),
                      n0=len(a), body=body)
replies = []
for op in ("promote", "rollback", "demote"):  # unsigned operator requests: refused
    req.send(msgpack.packb({"op": op, "to": "shadow", "reason": "attacker"}))
    replies.append(msgpack.unpackb(req.recv(), raw=False) if req.poll(5000) else None)
open(ready, "w").write("1")
seq, sent, end = 0, 0, time.monotonic() + 60
while time.monotonic() < end:
    for step in range(0, 400):
        seq += 1  # a session far newer than any genuine one, well-formed, every step, no key
        to_loop.send(msg("action", 2**62, seq, step, {"a": evil, "source": "policy", "mode": "full", "advice": None}))
        to_loop.send(msg("action", 2**62, seq, step, {"a": evil, "source": "policy", "mode": "full",
                                                       "advice": None}) + b"\x00" * 16)
        to_safety.send(msg("proposal", 2**62, seq, step, {"a": evil, "members": [], "version": "v1",
                                                          "compute_us": 1.0}))
        sent += 3
        if step % 50 == 0:
            json.dump({"sent": sent, "replies": replies}, open(out + ".tmp", "w"))
            import os; os.replace(out + ".tmp", out)
            time.sleep(0.002)
"""


def test_forged_replayed_and_wrong_key_messages_never_act_and_the_genuine_safety_keeps_acting(tmp_path):
    """Lockstep over TCP (anyone local can connect): a process without the secret sends
    well-formed actions with a far larger session id for every step, tagged with zeros, forged
    proposals and unsigned promote/rollback/demote requests; this test replays genuine actions
    it captured and sends actions signed with a wrong key. None acts: every step applies the
    genuine safety's decision, the loop's watchdog never trips."""
    import subprocess
    import sys

    from hil.bus.auth import channel_key, sign

    sc = _scenario(tmp_path, transport="tcp", bus={"ipc_dir": str(tmp_path / "run")}, **FULL)
    ep = sc.bus.endpoints
    ready, report = tmp_path / "attacker.ready", tmp_path / "attacker.json"
    env = {k: v for k, v in os.environ.items() if k != "HIL_BUS_KEY"}
    captured: list[bytes] = []
    marks = {"replayed": 0, "wrong_key": 0}
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(ep["action"])
    attacker = None

    rt_holder = []

    def setup(rt):
        rt_holder.append(rt)
        decode = rt.bus._rx.decode

        def capture(raw):
            msg = decode(raw)
            if msg is not None and len(captured) < 50:
                captured.append(bytes(raw))
            return msg

        rt.bus._rx.decode = capture

    def start_attacker():
        nonlocal attacker
        h = rt_holder[0]._policy_handles
        env = {k: v for k, v in (e.split("=", 1) for e in
               open(f"/proc/{h.policy.pid}/environ").read().split("\0") if "=" in e)}
        # no key in the policy's environment block (its channel keys came over the bootstrap pipe)
        assert "HIL_BUS_KEY" not in env and "HIL_BUS_CHANNEL_KEYS" not in env
        marks["policy_env_checked"] = True
        attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, ep["action"], ep["proposal"], ep["control"],
                                     str(report), str(ready)], env=env)
        deadline = time.monotonic() + 30
        while not (ready.exists() and report.exists()) and time.monotonic() < deadline:
            time.sleep(0.01)  # lockstep: the loop waits here (in its own thread) for the attacker

    def inject(step):
        if captured:
            push.send(captured[0])  # a genuine action, applied long ago: a replay
            push.send(captured[-1])
            marks["replayed"] += 2
        wrong = Sender("action", b"w" * 32, sid=2**62)  # a well-formed action signed with another key
        push.send(wrong.encode(step - 1, 0.0, {"a": [0.0044, 77.7], "source": "policy", "mode": "full",
                                               "advice": None}))
        marks["wrong_key"] += 1

    def setup_with_attack(rt):
        setup(rt)
        before = rt.bus.before_step

        def before_step(step, t_s, u_cmd, lockstep):
            if step == 5:
                start_attacker()
            if step >= 5 and step % 40 == 0:
                inject(step)
            return before(step, t_s, u_cmd, lockstep)

        rt.bus.before_step = before_step

    try:
        summary, df = _run(tmp_path, sc, lockstep=True, duration=300.0, setup=setup_with_attack)
    finally:
        if attacker is not None:
            attacker.kill()
            attacker.wait(5)
        push.close(0)
        ctx.term()
    att = json.loads(report.read_text())
    assert att["sent"] > 300 and marks["replayed"] >= 4 and marks["wrong_key"] >= 2 and marks["policy_env_checked"]
    assert all(r is not None and not r["ok"] and "refused" in r["error"] for r in att["replies"]), att["replies"]
    # what the loop APPLIED: the genuine safety's decision for every step, never the forged values
    log = read_log(tmp_path / "decisions.jsonl")
    acts = {r["step"]: r["action"] for r in _decisions(log)}
    app = df.set_index("step")[["app.base_flow", "app.agitation_power"]]
    assert not np.isclose(app.to_numpy(), 77.7).any() and not np.isclose(app["app.base_flow"], 0.0044).any()
    for j in range(0, 299):
        np.testing.assert_allclose(app.loc[j + 1].to_numpy(), acts[j], rtol=1e-12, err_msg=f"step {j + 1}")
    assert all(r["source"] == "policy" for r in _decisions(log) if r["step"] < 299)
    c = summary.extra["bus"]
    assert c["watchdog_trips"] == 0 and c["fallback_steps"] == 0 and c["actions_applied"] == 299, c
    assert c["action_dropped_auth"] >= 2 * 100 and c["action_dropped_replay"] >= marks["replayed"] - 2
    st = json.loads((tmp_path / "safety-status.json").read_text())
    assert st["mode"] == "full" and st["counters"]["control_refused"] == 3
    assert st["counters"]["proposal_dropped_auth"] >= 100
    assert not [r for r in log if r["event"] in ("rollback", "mode")]


def test_unsigned_or_stale_operator_requests_are_refused_signed_ones_obeyed(tmp_path):
    """The control socket in-process: status for anyone, promote/demote/rollback only signed."""
    import msgpack

    from hil.bus.auth import sign_control
    from hil.safety.wrapper import SafetyProcess

    sc = _scenario(tmp_path, **FULL)
    key = b"s" * 32
    proc = SafetyProcess(sc, str(CONFIG), key=key)

    def ask(raw):
        return msgpack.unpackb(proc._control(raw), raw=False)

    assert ask(msgpack.packb({"op": "status"}))["ok"]
    assert not ask(msgpack.packb({"op": "demote", "to": "shadow"}))["ok"]
    assert not ask(sign_control(b"w" * 32, {"op": "demote", "to": "shadow"}))["ok"]  # wrong key
    assert proc.core.rollout.mode == "full"
    signed = sign_control(key, {"op": "demote", "to": "advisory", "reason": "drill"})
    assert ask(signed)["ok"] and proc.core.rollout.mode == "advisory"
    res = ask(signed)  # the same signed request again: a replay
    assert not res["ok"] and "replayed" in res["error"]
    assert proc.c["control_refused"] == 3
    proc.log.close()


def test_nan_policy_is_silent_and_the_baseline_holds(tmp_path):
    sc = _scenario(tmp_path, policy={"entry": "tests.hil.safety.policies:nan_policy",
                                     "features": ["dissolved_oxygen"], "directory": "", "version": "v1"},
                   bus={"policy_deadline_s": 0.05}, **FULL)
    summary, df = _run(tmp_path, sc, lockstep=True, duration=40.0)
    log = read_log(tmp_path / "decisions.jsonl")
    assert all(r["source"] == "baseline:silent" for r in _decisions(log))
    assert summary.extra["bus"]["watchdog_trips"] == 0  # the safety answered every step
    assert summary.extra["bus"]["actions_applied"] == 39
    # in lockstep the policy says it is silent (an abstention), so the safety decided each step
    # at once instead of waiting its deadline: no deadline missed, every decision an abstention
    st = json.loads((tmp_path / "safety-status.json").read_text())["counters"]
    assert st["deadline_misses"] == 0 and st["policy_abstained"] >= 39, st
    assert all("abstained" in r.get("reason", "") for r in _decisions(log) if r.get("reason")), _decisions(log)[:3]
    _in_bounds(df)


def test_operator_cli_status_promote_demote_rollback(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import hil.commands.safety as cli

    sc = _scenario(tmp_path, loop={"time_scale": 50.0},
                   safety={"mode": "shadow", "rollout": {"auto_promote": False,
                                                         "gates": {"shadow": {"window_s": 20.0}}}})
    monkeypatch.setattr(cli, "_load", lambda config: sc)
    rt = Runtime(sc, lockstep=False, duration_s=600.0, record_path=str(tmp_path / "rec"), scenario_path=str(CONFIG))
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("summary", rt.run()))
    th.start()
    runner = CliRunner()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the wrapper answers and has decided something
            res = runner.invoke(cli.command, ["status", str(CONFIG), "--json", "--timeout", "0.5"])
            if res.exit_code == 0 and json.loads(res.output)["t_s"] is not None:
                break
            time.sleep(0.1)
        assert res.exit_code == 0, f"the safety wrapper never answered status: {res.output}"
        st = json.loads(res.output)
        assert st["mode"] == "shadow" and st["version"] == "v1"
        res = runner.invoke(cli.command, ["promote", str(CONFIG)])
        if st["t_s"] < 10.0:  # the shadow gate needs 20 s of sim time in shadow first (margin: 0.2 s wall)
            assert res.exit_code == 1 and "refused" in res.output and "window 20 s" in res.output, res.output
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # 25 s of sim time in shadow (0.5 s of wall time)
            res = runner.invoke(cli.command, ["status", str(CONFIG), "--json", "--timeout", "2"])
            if res.exit_code == 0 and (json.loads(res.output)["t_s"] or 0.0) >= 25.0:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the wrapper never reached 25 s of sim time: {res.output}")
        res = runner.invoke(cli.command, ["promote", str(CONFIG)])
        assert res.exit_code == 0 and "promoted shadow -> advisory" in res.output, res.output
        res = runner.invoke(cli.command, ["status", str(CONFIG)])
        assert res.exit_code == 0 and "mode advisory" in res.output
        # advisory: the policy's (projected) action is published as advice, the baseline acts
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(sc.bus.endpoint("advice", sc.name))
        try:
            assert sub.poll(5000), "no advice published in advisory mode"
            from hil.bus import Receiver, payload_schema
            from hil.bus.auth import read_run_key

            advice = Receiver("action", payload_schema("action", SPEC.n_outputs, SPEC.n_inputs, 2),
                              read_run_key(sc.bus, sc.name), channel="advice").decode(sub.recv())
            assert advice.payload["mode"] == "advisory" and advice.payload["source"] == "baseline:advisory"
            assert advice.payload["advice"] is not None and advice.payload["advice"].shape == (2,)
        finally:
            sub.close(0)
            ctx.term()
        res = runner.invoke(cli.command, ["demote", str(CONFIG), "--to", "shadow", "--reason", "drill"])
        assert res.exit_code == 0 and "mode shadow" in res.output
        res = runner.invoke(cli.command, ["rollback", str(CONFIG), "--reason", "drill"])
        assert res.exit_code == 0 and "baseline controller holds" in res.output  # v1 has no predecessor
    finally:
        rt.request_stop()
        th.join(60)
        rt.close()
    assert box["summary"].state == "stopped"
    log = read_log(tmp_path / "decisions.jsonl")
    reasons = [r.get("reason", "") for r in log if r["event"] in ("mode", "promote_refused", "rollback")]
    assert any("promoted by operator" in r for r in reasons) and any("drill" in r for r in reasons)
    res = runner.invoke(cli.command, ["log", str(tmp_path / "decisions.jsonl")])
    assert res.exit_code == 0 and "rollback" in res.output and "baseline:shadow" in res.output


def test_dead_policy_in_lockstep_costs_seconds_not_a_deadline_per_step(tmp_path):
    """Killed before the run: every step falls back, the safety stops waiting a full deadline."""
    sc = _scenario(tmp_path, **FULL)

    def kill_policy(rt):
        start = rt._start_children

        def start_then_kill():
            start()
            rt._policy_handles.policy.kill()
            rt._policy_handles.policy.wait(5)

        rt._start_children = start_then_kill

    t0 = time.monotonic()
    summary, df = _run(tmp_path, sc, lockstep=True, duration=60.0, setup=kill_policy)
    assert time.monotonic() - t0 < 30.0  # 3 misses at 1 s, then 50 ms each (60 s deadlines otherwise)
    log = read_log(tmp_path / "decisions.jsonl")
    assert all(r["source"] == "baseline:silent" for r in _decisions(log))
    assert summary.extra["bus"]["lockstep_timeouts"] == 0  # the safety answered every step itself
    _in_bounds(df)


def test_bad_do_dropout_reaches_the_safety_with_bad_quality_not_dropped(tmp_path):
    """A "bad" DO sensor dropout (NaN) travels as Bad quality: the policy and the safety accept
    every such observation (none dropped as non-finite), and the loop never stalls."""
    gaps = {"sensors": {"dissolved_oxygen": {"dropout_rate_per_s": 0.02, "dropout_duration_s": 20.0,
                                             "dropout_mode": "bad"}}}
    sc = _scenario(tmp_path, gaps=gaps, bus={"policy_deadline_s": 0.05}, **FULL)  # the policy is silent on NaN
    summary, df = _run(tmp_path, sc, lockstep=True, duration=300.0)
    bad_steps = int(df["meas.dissolved_oxygen"].isna().sum())
    assert bad_steps >= 10  # the dropouts happened (seeded)
    bus = summary.extra["bus"]
    assert bus["obs_bad_quality"] == bad_steps and bus["obs_sent"] == 2 * 300 and bus["lockstep_timeouts"] == 0
    st = json.loads((tmp_path / "safety-status.json").read_text())["counters"]
    assert st["obs_dropped_nonfinite"] == 0 and st["obs_dropped_malformed"] == 0
    assert st["obs_bad_quality"] >= bad_steps - 1  # (the last observation races the end of the run)
    assert st["obs_accepted"] >= 299
    assert np.isfinite(df[["app.base_flow", "app.agitation_power"]].to_numpy()).all()


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_dead_or_hung_policy_is_restarted_with_backoff_counted_and_proposes_again(tmp_path, fault):
    """[policy] restart: a policy SIGKILLed (dead) or SIGSTOPped (hung: no heartbeat) mid-run is
    detected at the loop's status tick, (killed and) started again after the backoff, counted,
    and its proposals reach the safety again through the same secret."""
    sc = _scenario(tmp_path, policy={"restart": {"max_restarts": 2, "backoff_s": 0.2, "hang_s": 2.0}},
                   bus={"policy_deadline_s": 0.05}, **FULL)
    marks = {}

    def on_status(status):
        h = rt_holder[0]._policy_handles
        if "step" not in marks and status["steps"] >= 50:
            marks["step"], marks["pid"] = status["steps"] - 1, h.policy.pid
            os.kill(h.policy.pid, getattr(signal, fault))
        elif "step" in marks and h.policy.pid != marks["pid"] and "new" not in marks:
            marks["new"] = h.policy.pid
        time.sleep(0.005)  # lockstep runs fast: leave the supervisor some wall time per step

    rt_holder = []
    summary, df = _run(tmp_path, sc, lockstep=True, duration=1200.0, on_status=on_status, setup=rt_holder.append)
    sup = summary.extra["policy"]
    assert sup["policy_restarts"] == 1 and sup["state"] == "up", sup
    if fault == "SIGKILL":
        assert sup["policy_deaths"] == 1 and sup["policy_hangs"] == 0 and "died" in sup["alarms"][0]
    else:
        assert sup["policy_hangs"] == 1 and sup["policy_deaths"] == 0 and "hung" in sup["alarms"][0]
    assert marks.get("new") and marks["new"] != marks["pid"]
    log = read_log(tmp_path / "decisions.jsonl")
    dec = _decisions(log, step_from=marks["step"] + 1)
    silent = [r["step"] for r in dec if r["proposal"] is None]
    back = [r["step"] for r in dec if r["proposal"] is not None and r["step"] > (silent[0] if silent else 0)]
    assert silent and back, "the policy never went silent or never came back"
    assert summary.extra["bus"]["watchdog_trips"] == 0 and summary.extra["bus"]["lockstep_timeouts"] == 0
    _in_bounds(df)
