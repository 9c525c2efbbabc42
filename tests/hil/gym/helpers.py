"""Shared helpers of the hil.gym tests: the gym scenario, and the same scenario as a lockstep
Runtime run whose bus-driven inputs replay a given action sequence as profiles."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "bioreactor_gym.toml"


def raw_scenario() -> dict:
    return tomllib.loads(CONFIG.read_text())


def runtime_replay(actions: np.ndarray, action_names: list[str], seed: int, step_s: float, record_dir: Path):
    """Run the gym scenario in the real loop (hil.runtime.Runtime, lockstep, recorded) with
    the bus inputs driven by profiles that replay `actions` (one row per step), no bus, no
    policy, no servers; returns the recording as a DataFrame."""
    from hil.scenario.config import parse_scenario
    from hil.recorder import read_recording
    from hil.runtime import Runtime

    data = raw_scenario()
    for key in ("bus", "policy", "safety", "gym"):
        data.pop(key, None)
    data["loop"]["seed"] = seed
    for j, name in enumerate(action_names):
        data["inputs"][name] = {"driver": "profile",
                                "profile": [[k * step_s, float(a)] for k, a in enumerate(actions[:, j])]}
    sc = parse_scenario(data, base_dir=CONFIG.parent)
    n = actions.shape[0]
    rt = Runtime(sc, lockstep=True, duration_s=n * step_s, record=True, record_path=str(record_dir),
                 start_servers=False)
    try:
        summary = rt.run()
    finally:
        rt.close()
    assert summary.state == "stopped", summary.error
    return read_recording(record_dir), summary
