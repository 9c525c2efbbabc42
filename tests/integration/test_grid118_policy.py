"""configs/grid118_policy.toml end to end (lockstep, three processes: loop, policy, safety):
the greedy policy asks for a transfer that would overload line 54; the wrapper's PTDF line
limits (`[[safety.projection.plant]] kind = "line_rating"`) clip it, so what the loop
APPLIED keeps every recorded line loading under its rating and no line trips."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from hil.recorder import read_recording
from plants.base import Plant, load_plant

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "grid118_policy.toml"
pytestmark = pytest.mark.timeout(180)


def test_wrapper_keeps_every_line_under_its_rating(tmp_path):
    log = tmp_path / "safety.jsonl"
    # a private ipc directory: the default one is per scenario name, shared with any other run
    # of this scenario on the machine (short: sun_path is 108 bytes)
    ipc_dir = tempfile.mkdtemp(prefix="hg", dir="/tmp")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "hil.cli", "run", str(CONFIG), "--lockstep", "--duration", "30", "--json",
             "--quiet", "--record", str(tmp_path / "rec"), "--set", f'safety.decision_log="{log}"',
             "--set", f'safety.status_path="{tmp_path / "status.json"}"', "--set", f'bus.ipc_dir="{ipc_dir}"'],
            cwd=ROOT, capture_output=True, text=True, timeout=170)
    finally:
        shutil.rmtree(ipc_dir, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    df = read_recording(summary["record_path"])
    loading = df[[c for c in df.columns if c.startswith("y.line_") and c.endswith(".loading")]]
    closed = df[[c for c in df.columns if c.startswith("y.line_") and c.endswith(".closed")]]
    assert loading.shape[1] == 186 and len(df) == 30
    # what the user cares about: every line under its rating at every step, none tripped
    assert loading.to_numpy().max() <= 100.0, loading.max().sort_values().tail(3)
    assert (closed.to_numpy() == 1).all()
    # the policy acted (full mode) and pushed: unit 11 went up, but not to where it wanted
    app11 = df["app.gen_11.p_set"].to_numpy()
    assert app11.max() > 240.0 and app11.max() < 300.0
    assert df["y.line_54.loading"].max() > 90.0                 # it did use the line
    decisions = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [d for d in decisions if d.get("event") == "decision"]
    assert steps and all(d["source"] == "policy" for d in steps)
    reasons = {c["reason"] for d in steps for c in d.get("clips", [])}
    assert any(r.startswith("linear:lines.line_54.") for r in reasons), reasons
    assert all(d["proposal"][0] > d["action"][0] + 5.0 for d in steps[-10:])   # it kept asking for more
    assert summary["safety"]["clipped_decisions"] > 10
    # without the wrapper the policy's transfer overloads line 54 (the counterfactual, same plant)
    model = load_plant("grid", {"case": str(ROOT / "configs/grids/case118.m"), "rating_margin": 1.25,
                                "rating_floor_mva": 100.0})
    plant = Plant(model, dt=1.0)
    s = model.spec
    plant.u[s.index("inputs", "gen_11.p_set")] = 320.0
    plant.u[s.index("inputs", "gen_29.p_set")] = 292.0
    plant.step(1.0)
    assert plant.compute_outputs()[s.index("outputs", "line_54.loading")] > 105.0


def test_in_loop_shield_keeps_every_line_under_its_rating(tmp_path):
    """The same scenario with [safety] placement = "loop": the compiled line rows in the loop's
    shield (plants/grid/line_limits.py fill_line_rows) cut the policy's transfer; asserted on
    the APPLIED set-points and the recorded loadings, and on each step's shield source."""
    ipc_dir = tempfile.mkdtemp(prefix="hg", dir="/tmp")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "hil.cli", "run", str(CONFIG), "--lockstep", "--duration", "30", "--json",
             "--quiet", "--record", str(tmp_path / "rec"), "--set", "safety.placement='loop'",
             "--set", f'safety.decision_log="{tmp_path / "safety.jsonl"}"',
             "--set", f'safety.status_path="{tmp_path / "status.json"}"', "--set", f'bus.ipc_dir="{ipc_dir}"'],
            cwd=ROOT, capture_output=True, text=True, timeout=170)
    finally:
        shutil.rmtree(ipc_dir, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    df = read_recording(summary["record_path"])
    loading = df[[c for c in df.columns if c.startswith("y.line_") and c.endswith(".loading")]]
    closed = df[[c for c in df.columns if c.startswith("y.line_") and c.endswith(".closed")]]
    assert loading.shape[1] == 186 and len(df) == 30
    assert loading.to_numpy().max() <= 100.0, loading.max().sort_values().tail(3)
    assert (closed.to_numpy() == 1).all()
    app11 = df["app.gen_11.p_set"].to_numpy()
    assert app11.max() > 240.0 and app11.max() < 300.0          # the policy pushed, the rows held it
    assert df["y.line_54.loading"].max() > 90.0
    src = df["shield.source"].to_numpy()
    assert (src[5:] == 1).sum() > 10                              # projected: the line rows cut the proposal
    assert set(np.unique(src[5:])) <= {0, 1}                      # no fallback once running
    bus = summary["bus"]
    assert bus["shield_projected_steps"] > 10 and bus["shield_fallback_unknown_limits_steps"] == 0
