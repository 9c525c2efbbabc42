"""The gym's SafetyWrapper and `hil run --lockstep` ([safety] placement = "loop") enforce the same
thing: same scenario, same proposals -> the same applied actions and the same per-step source.

configs/bioreactor_gym.toml (every gap, the PID fallback, the shear limit), the policy in full
mode with the confidence checks off (a policy in training has no statistics: the wrapper's
default) and no monitor rules; the policy `wavy` (gym_shield_policies.py) proposes from the
observation and is silent on a few of them. The lockstep run has three processes (loop,
policy, safety supervisor) over the bus; the gym calls the same function on the same
observation and steps the wrapper. Asserted per step: the recording's `shield.source` equals
the wrapper's code, and the applied actions (app.*) equal the gym's `action_applied` exactly
(the same compiled shield on the same floats: no tolerance).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from hil.recorder import read_recording
from tests.hil.safety.helpers import IPC_DIRS, ROOT, remove_ipc_dirs
from tests.integration.gym_shield_policies import ACTIONS, FEATURES, wavy

pytest.importorskip("gymnasium")

CONFIG = ROOT / "configs" / "bioreactor_gym.toml"
STEPS = 150
SEED = 1


@pytest.fixture(autouse=True)
def _clean_ipc_dirs():
    yield
    remove_ipc_dirs()


def _scenario_file(tmp_path):
    """configs/bioreactor_gym.toml without its monitor rules and rollout gates (the gates' fallback
    rate needs a confidence check, which a policy in training has none of), the entry policy
    `wavy` in place of the stored one."""
    lines, skip = [], False
    for line in CONFIG.read_text().splitlines():
        head = line.split("#")[0].strip()
        if head.startswith("["):
            skip = head in ("[[safety.monitor.rules]]",) or head.startswith("[safety.rollout.gates")
        if skip:
            continue
        if head.startswith('directory = "../policies/'):
            line = ("entry = 'tests.integration.gym_shield_policies:wavy'\n"
                    f"features = {json.dumps(FEATURES)}\ninputs = {json.dumps(ACTIONS)}")
        elif head.startswith('version = "v1"'):
            continue
        lines.append(line)
    path = tmp_path / "bioreactor_gym_shield.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _lockstep(tmp_path, config):
    ipc = tempfile.mkdtemp(prefix="hg", dir="/tmp")  # short: sun_path is 108 bytes
    IPC_DIRS.append(ipc)
    rec, log = tmp_path / "rec", tmp_path / "safety.jsonl"
    sets = ["safety.placement='loop'", "safety.mode='full'", "safety.rollout.auto_promote=false",
            "safety.confidence.mahalanobis=false", "safety.confidence.disagreement=false",
            "safety.confidence.consistency=false", f"safety.decision_log='{log}'", f"bus.ipc_dir='{ipc}'",
            f"loop.seed={SEED}"]
    args = [sys.executable, "-m", "hil.cli", "run", str(config), "--lockstep", "--duration", str(float(STEPS)),
            "--json", "--quiet", "--record", str(rec)]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary, read_recording(summary["record_path"]).set_index("step")


def _gym(config):
    import hil.gym
    from hil.gym.safety import SafetyWrapper
    from hil.policy.features import FeatureMap

    env = SafetyWrapper(hil.gym.make(config, episode_s=float(STEPS) + 10.0))
    base = env.unwrapped
    fmap = FeatureMap(base.model.spec, FEATURES)
    order = [ACTIONS.index(n) for n in base.action_names]
    env.reset(seed=SEED)
    codes, applied = [], []
    for _ in range(STEPS):
        a = wavy(fmap.build(base.y_meas, base.u_app))[order]
        _, _, term, trunc, info = env.step(a)
        codes.append(info["safety"]["code"])
        applied.append(info["u_applied"][base.model.action_index])
        assert not term
    names = [f"app.{n}" for n in base.action_names]
    return np.array(codes), np.array(applied), names


def test_gym_and_lockstep_apply_the_same_actions_from_the_same_sources(tmp_path):
    config = _scenario_file(tmp_path)
    summary, df = _lockstep(tmp_path, config)
    codes, applied, names = _gym(config)
    n = min(len(df), STEPS)
    assert n >= STEPS - 1, len(df)
    src = df["shield.source"].to_numpy()[:n].astype(int)
    app = df[names].to_numpy(float)[:n]
    diff = np.flatnonzero(src != codes[:n])
    assert diff.size == 0, [(int(k), int(src[k]), int(codes[k])) for k in diff[:10]]
    bad = np.flatnonzero((app != applied[:n]).any(axis=1))
    assert bad.size == 0, [(int(k), app[k].tolist(), applied[k].tolist()) for k in bad[:5]]
    # the comparison covered every source this scenario produces: policy, projected, the
    # supervisor's fallback (silent policy) and the first step's supervisor silence
    counts = {int(c): int((codes[:n] == c).sum()) for c in np.unique(codes[:n])}
    assert counts.get(0, 0) > 5 and counts.get(1, 0) > 5 and counts.get(3, 0) >= 2 and counts.get(6) == 1, counts
