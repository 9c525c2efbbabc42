"""configs/panda_policy.toml in lockstep (policy and safety processes over the bus): the
reach-and-grasp demo grasps and lifts the object; a policy pushing out of the workspace box is
clipped (what the loop APPLIED keeps the TCP in the box); the fallback joint PD holds the arm
when the policy is silent; the bad v2 is rolled back to v1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from hil.recorder import read_recording

ROOT = Path(__file__).resolve().parents[2]
FEATURES = "[" + ",".join(f'"joint_{k}.q"' for k in range(1, 8)) + "]"


def _run(tmp_path, duration_s: float, *sets: str):
    rec = tmp_path / "rec"
    log = tmp_path / "safety.jsonl"
    args = [sys.executable, "-m", "hil.cli", "run", str(ROOT / "configs" / "panda_policy.toml"), "--lockstep",
            "--duration", str(duration_s), "--json", "--quiet", "--record", str(rec),
            "--set", f"safety.decision_log='{log}'"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return summary, read_recording(summary["record_path"]), events


def test_reach_and_grasp_demo_lifts_the_object(tmp_path):
    summary, df, events = _run(tmp_path, 4.0)
    assert summary["alarms"] == []
    last = df.iloc[-1]
    assert last["y.object.held"] == 1.0 and last["y.object.dropped"] == 0.0
    assert last["y.object.position.z"] > 0.15  # lifted from 0.05 m
    assert 0.0 < last["y.contact.force"]
    # the in-loop shield applied the policy's proposals (its source column: 0 policy, 1 projected)
    assert df["shield.source"].isin([0, 1]).mean() > 0.95
    # the supervisor let the policy act on every proposal (one decision per 4 ms proposal)
    c = events[-1]["counters"]
    assert c["policy_actions"] == c["decisions"] >= 0.95 * summary["steps"] / 4


def test_policy_pushing_out_of_the_box_is_clipped(tmp_path):
    summary, df, events = _run(tmp_path, 1.5, "policy.directory=''",
                               "policy.entry='tests.integration.panda_policies:push_out'",
                               f"policy.features={FEATURES}", "safety.monitor.rules=[]")  # projection alone
    # what the loop applied kept the TCP inside [0.25, 0.75] x [-0.4, 0.4] x [0.03, 0.8] (1 cm:
    # the barrier is linearised, friction and lag left out)
    ee = df[["y.ee.position.x", "y.ee.position.y", "y.ee.position.z"]].to_numpy()
    assert (ee >= np.array([0.24, -0.41, 0.02])).all() and (ee <= np.array([0.76, 0.41, 0.81])).all()
    # the applied torque is not the proposal: the projection cut it (reason linear:workspace)
    assert (df["app.joint_2.tau_target"] < 29.0).mean() > 0.5
    clips = [c for e in events for c in e.get("clips", [])]
    assert any("linear:workspace" in c["reason"] for c in clips), sorted({c["reason"] for c in clips})
    # it hit the box: the TCP came within 2 cm of a face
    assert ee[:, 0].max() > 0.73 or ee[:, 2].min() < 0.05


def test_fallback_joint_pd_holds_position(tmp_path):
    summary, df, events = _run(tmp_path, 1.0, "policy.directory=''",
                               "policy.entry='tests.integration.panda_policies:silent'",
                               f"policy.features={FEATURES}")
    assert events[-1]["counters"]["baseline_actions"] == events[-1]["counters"]["decisions"] > 0
    assert (df["shield.source"] >= 2).all()  # never the policy: its proposals are not finite
    q = df[[f"x.joint_{k}.q" for k in range(1, 8)]].to_numpy()
    assert np.abs(q - q[0]).max() < 0.01  # rad, held where it started
    assert np.isfinite(df["app.joint_1.tau_target"]).all()


def test_bad_v2_is_rolled_back_to_v1(tmp_path):
    summary, df, events = _run(tmp_path, 1.5, "policy.version='v2'")
    rollbacks = [e for e in events if e["event"] == "rollback"]
    assert [(r["from"], r["to"]) for r in rollbacks] == [("v2", "v1")]  # and v1 is kept
    assert [e["rule"] for e in events if e["event"] == "alarm"] == ["joint_speed"]
    t_rb = rollbacks[0]["t_s"]
    # v2 (negative damping) drove joint 2 past 1.5 rad/s; v1 acts after the rollback and calms it
    assert df.loc[df["t_s"] <= t_rb, "x.joint_2.dq"].max() > 1.5
    assert abs(df["x.joint_2.dq"].iloc[-1]) < 1.0  # v1 ramps its reference at 0.6 rad/s
    # the in-loop shield applied the policy's proposals (its source column: 0 policy, 1 projected)
    assert df["shield.source"].isin([0, 1]).mean() > 0.95
    # the supervisor let the policy act on its proposals (one decision per 4 ms proposal) but
    # while the rollback switched versions
    c = events[-1]["counters"]
    assert c["decisions"] - 3 <= c["policy_actions"] and c["decisions"] >= 0.95 * summary["steps"] / 4
