"""configs/panda_policy.toml with the in-loop shield ([safety] placement = "loop", policy at
250 Hz, the loop at 1 kHz): three real processes (loop, policy, safety supervisor) over the
bus. Each test asserts on what the loop APPLIED (the recording's app.* columns) and on the
shield's per-step source (`shield.source`: 0 policy, 1 projected, 2 fallback:late,
3 fallback:mode, 6 fallback:supervisor_silent).

- a proposal older than its age bound is not applied: the fallback law acts on exactly those
  steps (lockstep, reproducible);
- a signed envelope change (the limited mode's band, new with every supervisor decision) bounds
  what the policy's proposal may apply;
- forged supervisor decisions (another key; the policy's own proposal key) sent to the loop
  during a run change nothing: the policy never acts in shadow mode;
- a silent supervisor (SIGSTOP, real time) puts the fallback on after supervisor_silence_s,
  with an alarm, and the policy acts again once it speaks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from hil.recorder import read_recording
from tests.hil.safety.helpers import IPC_DIRS, remove_ipc_dirs

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "panda_policy.toml"
FEATURES = "[" + ",".join(f'"joint_{k}.q"' for k in range(1, 8)) + "]"
KD = np.array([50.0, 50.0, 50.0, 50.0, 30.0, 25.0, 15.0])  # [[safety.fallback.joint_pd]] kd
JOINTS = range(1, 8)


@pytest.fixture(autouse=True)
def _clean_ipc_dirs():
    yield
    remove_ipc_dirs()


def _ipc_dir() -> str:
    d = tempfile.mkdtemp(prefix="hz", dir="/tmp")  # short: sun_path is 108 bytes
    IPC_DIRS.append(d)
    return d


def _cli(tmp_path, duration_s: float, *sets: str, ipc_dir: str | None = None):
    """`hil run configs/panda_policy.toml --lockstep` -> (summary, recording by step, decision log)."""
    rec, log = tmp_path / "rec", tmp_path / "safety.jsonl"
    args = [sys.executable, "-m", "hil.cli", "run", str(CONFIG), "--lockstep", "--duration", str(duration_s),
            "--json", "--quiet", "--record", str(rec), "--set", f"safety.decision_log='{log}'",
            "--set", f"bus.ipc_dir='{ipc_dir or _ipc_dir()}'"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return summary, read_recording(summary["record_path"]).set_index("step"), events


def test_a_proposal_older_than_its_age_bound_is_not_applied_the_fallback_law_is(tmp_path):
    # proposals every 4 steps, each valid for 2 steps after the one it answers: the 4th step of
    # each period has only a proposal of age 3 (late)
    summary, df, events = _cli(tmp_path, 0.6, "policy.max_age_s=0.002")
    src = df["shield.source"]
    k = df.index.to_numpy()
    steady = k >= 8
    late = steady & (k % 4 == 0)
    assert (src[late] == 2).all(), src[late].value_counts().to_dict()
    assert src[steady & ~late].isin([0, 1]).all(), src[steady & ~late].value_counts().to_dict()
    bus = summary["bus"]
    assert bus["shield_fallback_late_steps"] == int((src == 2).sum()) >= 0.24 * len(df)
    assert bus["watchdog_trips"] == 0 and bus["shield_fallback_supervisor_silent_steps"] <= 1
    # APPLIED on a late step: the fallback law, not the stale proposal. The joint PD takes over
    # where the arm is (q_ref = the measured q), so tau = -kd dq_measured (the previous step's
    # measurement); the gripper is held at its applied width; that action projected on the
    # envelope at the previous step's measurement, by the safety process's own projection
    # (hil/safety/projection.py, the plant families in numpy): an independent implementation
    from hil.bus.config import action_input_names
    from hil.scenario.config import load_scenario
    from hil.safety.projection import Projector

    sc = load_scenario(CONFIG)
    plant = sc.plant.load()
    spec = plant.spec
    names = action_input_names(sc, spec)
    proj = Projector(sc.safety.projection, spec, names, plant=plant)
    meas = [f"meas.{n}" for n in spec.names("outputs")]
    app = [f"app.{n}" for n in spec.names("inputs")]
    act = [f"app.{n}" for n in names]
    late_steps = k[late]
    for s in late_steps:
        y, u = df.loc[s - 1, meas].to_numpy(float), df.loc[s - 1, app].to_numpy(float)
        dq = df.loc[s - 1, [f"meas.joint_{j}.dq" for j in JOINTS]].to_numpy(float)
        law = np.concatenate([-KD * dq, [df.loc[s - 1, "app.gripper.width_target"]]])
        want, _ = proj.project(law, df.loc[s - 1, act].to_numpy(float), 0.001, y, u)
        np.testing.assert_allclose(df.loc[s, act].to_numpy(float), want, rtol=1e-7, atol=1e-7, err_msg=f"step {s}")
    tau = df.loc[late_steps, [f"app.joint_{j}.tau_target" for j in JOINTS]].to_numpy()
    dq = df.loc[late_steps - 1, [f"meas.joint_{j}.dq" for j in JOINTS]].to_numpy()
    assert np.isclose(tau, -KD * dq, rtol=1e-9, atol=1e-9).all(axis=1).mean() > 0.1  # the law itself where nothing binds
    grip = df["app.gripper.width_target"]
    np.testing.assert_array_equal(grip.loc[late_steps].to_numpy(), grip.loc[late_steps - 1].to_numpy())
    # and the stale proposal would have been something else: the policy's torque differs
    prev = df.loc[late_steps - 1, [f"app.joint_{j}.tau_target" for j in JOINTS]].to_numpy()
    assert np.abs(prev - tau).max() > 1.0


def test_a_signed_envelope_change_bounds_what_the_policy_applies(tmp_path):
    # limited mode: the supervisor's band is the baseline (joint PD hold) +- 2 N m on joint 2,
    # new with every decision; the policy pushes joint 2 with 30 N m
    summary, df, events = _cli(
        tmp_path, 0.5, "policy.directory=''", "policy.entry='tests.integration.panda_policies:push_out'",
        f"policy.features={FEATURES}", "safety.monitor.rules=[]", "safety.mode='limited'",
        "safety.rollout.limited_max_deviation={'joint_2.tau_target' = 2.0}")
    sup = [e for e in events if e["event"] == "supervisor"]
    assert len(sup) > 50 and all(e["mode"] == "limited" and e["allow"] for e in sup[1:])
    band = {e["step"]: e["band"]["joint_2.tau_target"] for e in sup}
    assert len({tuple(b) for b in band.values()}) > 20  # the envelope changes, decision by decision
    app = df["app.joint_2.tau_target"]
    checked = 0
    for s, (lo, hi) in band.items():
        for k in range(s + 1, s + 5):  # decision on observation s: enforced from step s + 1 until superseded
            if k in app.index and (k - 1) // 4 * 4 == s:
                assert lo - 1e-9 <= app[k] <= hi + 1e-9, (k, app[k], lo, hi)
                checked += 1
    assert checked > 150
    assert app.max() < 5.0  # 30 N m proposed
    assert df["shield.source"].iloc[8:].eq(1).mean() > 0.95  # projected: the band cut the proposal


def _forge(run_dir: str, stop: threading.Event, sent: list):
    """A local process of the run's user that knows the supervisor's socket and, like the policy,
    the proposal channel's key (read from the run's key file here), sends decisions letting the
    policy act: signed with a key of its own, and with the proposal key."""
    from hil.bus.auth import channel_keys
    from hil.bus.wire import Sender

    key_file = Path(run_dir) / "key"
    while not key_file.exists() and not stop.is_set():
        time.sleep(0.01)
    if stop.is_set():
        return
    proposal_key = channel_keys(key_file.read_bytes(), ("proposal",))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect("ipc://" + os.path.join(run_dir, "supervisor"))
    senders = [Sender("supervisor", {"supervisor": os.urandom(32)}), Sender("proposal", proposal_key)]
    n = 8
    step = 0
    while not stop.is_set():
        for s in senders:
            raw = s.encode_supervisor(step, step * 1e-3, True, np.full(n, -np.inf), np.full(n, np.inf), "full", "forged")
            try:
                sock.send(raw, zmq.NOBLOCK)
                sent.append(1)
            except zmq.Again:
                pass
        step += 4
        time.sleep(0.002)
    sock.close(0)
    ctx.term()


def test_forged_supervisor_decisions_during_a_run_never_let_the_policy_act(tmp_path):
    ipc = _ipc_dir()
    stop, sent = threading.Event(), []

    worker = threading.Thread(target=_forge, args=(ipc, stop, sent), daemon=True)
    worker.start()
    try:
        summary, df, events = _cli(
            tmp_path, 1.0, "policy.directory=''", "policy.entry='tests.integration.panda_policies:push_out'",
            f"policy.features={FEATURES}", "safety.monitor.rules=[]", "safety.mode='shadow'", ipc_dir=ipc)
    finally:
        stop.set()
        worker.join(10)
    bus = summary["bus"]
    assert len(sent) > 100 and bus["supervisor_dropped_auth"] > 100, (len(sent), bus["supervisor_dropped_auth"])
    assert bus["supervisor_accepted"] > 0  # the genuine supervisor was heard meanwhile
    src = df["shield.source"]
    assert not src.isin([0, 1]).any(), src.value_counts().to_dict()  # shadow: the policy never acts
    assert df["app.joint_2.tau_target"].max() < 5.0  # its 30 N m never reached the arm


def test_a_silent_supervisor_puts_the_fallback_on_with_an_alarm_then_the_policy_again(tmp_path):
    from hil.scenario.config import load_scenario
    from hil.runtime import Runtime

    sc = load_scenario(CONFIG, {"bus": {"ipc_dir": _ipc_dir()},
                                "safety": {"decision_log": str(tmp_path / "safety.jsonl")}})
    rt = Runtime(sc, lockstep=False, duration_s=3.0, record_path=str(tmp_path / "rec"), scenario_path=str(CONFIG))
    rt.announce = True  # as `hil run` does: `hil safety status` finds the loop's shield status
    marks = {}

    def on_status(status):
        from hil.commands.safety import full_status, status_lines

        h = rt._policy_handles
        if h is None:
            return
        if "status" not in marks and "cont" in marks and status["sim_time_s"] >= 2.0:
            # after the supervisor spoke again; in real time the live stats file is written by a child
            # process (hil/loop/stats_writer.py) that starts with the run: wait (bounded) for its write
            until = time.monotonic() + 0.8
            st = full_status(sc, 5.0)
            while st.get("shield") is None and time.monotonic() < until:
                time.sleep(0.02)
                st = full_status(sc, 5.0)
            marks["status"] = "\n".join(status_lines(st))
        elif "stop" not in marks and status["sim_time_s"] >= 1.0:
            marks["stop"] = status["steps"]
            os.kill(h.safety.pid, signal.SIGSTOP)
        elif "stop" in marks and "cont" not in marks and status["sim_time_s"] >= 1.6:
            marks["cont"] = status["steps"]
            os.kill(h.safety.pid, signal.SIGCONT)

    try:
        summary = rt.run(on_status)
    finally:
        if rt._policy_handles is not None and "stop" in marks and "cont" not in marks:
            os.kill(rt._policy_handles.safety.pid, signal.SIGCONT)
        rt.close()
    assert summary.exit_code == 0, (summary.stop_reason, summary.error)
    df = read_recording(tmp_path / "rec").set_index("step")
    src = df["shield.source"]
    first_policy = src[src.isin([0, 1])].index.min()  # before the supervisor's first decision: silent too
    assert first_policy < marks["stop"]
    silent = src[(src == 6) & (src.index > first_policy)].index
    assert len(silent) > 300, src.value_counts().to_dict()  # ~0.6 s stopped less the 0.1 s bound
    assert silent.min() > marks["stop"] - 200 and silent.max() < marks["cont"] + 300
    after = src.loc[silent.max() + 50:]
    assert after.isin([0, 1]).mean() > 0.9  # the supervisor speaks again: the policy acts
    # `hil safety status` shows both sides: the supervisor's decision and the shield's steps
    assert "supervisor (placement loop): policy MAY act (policy), mode full" in marks["status"], marks["status"]
    assert "shield (in the loop): now " in marks["status"] and "policy " in marks["status"]
    alarms = [a for a in summary.alarms if a["kind"] == "supervisor_silent"]
    assert len(alarms) == 1 and not alarms[0]["active"], summary.alarms
    # APPLIED while silent: the fallback holds the gripper and the joints where they were
    grip = df.loc[silent, "app.gripper.width_target"]
    assert grip.nunique() == 1
    q = df.loc[silent, [f"x.joint_{j}.q" for j in JOINTS]].to_numpy()
    assert np.abs(q - q[0]).max() < 0.02  # rad
