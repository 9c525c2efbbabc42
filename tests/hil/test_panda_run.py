"""configs/panda.toml in lockstep: per-joint recording columns, the gaps on the joint groups,
the position-mode arm holding its targets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hil.cli import parse_settings
from hil.scenario.config import load_scenario
from hil.recorder import read_recording
from hil.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]


def test_lockstep_panda_records_per_joint_columns_with_gaps(tmp_path):
    sc = load_scenario(ROOT / "configs" / "panda.toml",
                       parse_settings([f"recording.path='{tmp_path / 'rec'}'", "loop.duration_s=0.5",
                                       "inputs.joint_2.q_target.value=-0.6"]))
    with Runtime(sc, lockstep=True) as rt:
        assert rt.plant.substeps == 4  # 1 ms / MAX_SUBSTEP 0.25 ms
        summary = rt.run()
    assert summary.exit_code == 0 and summary.steps == 500
    df = read_recording(summary.record_path)
    meta = json.loads((Path(summary.record_path) / "_meta.json").read_text())
    for k in range(1, 8):
        for col in (f"x.joint_{k}.q", f"y.joint_{k}.tau_measured", f"meas.joint_{k}.q", f"cmd.joint_{k}.q_target",
                    f"app.joint_{k}.q_target", f"y.joint_{k}.tau_command"):
            assert col in df.columns, col
    assert meta["groups"]["outputs.joint.q"][1] == 7
    # encoder quantization: every measured q is a whole number of 5.992e-6 rad counts
    q_meas = df[[f"meas.joint_{k}.q" for k in range(1, 8)]].to_numpy()
    counts = q_meas / 5.992e-6
    assert np.allclose(counts, np.round(counts), atol=1e-6)
    # torque sensors: bias 0.15 N m plus noise (0.05 N m std), per joint
    err = (df[[f"meas.joint_{k}.tau_measured" for k in range(1, 8)]].to_numpy()
           - df[[f"y.joint_{k}.tau_measured" for k in range(1, 8)]].to_numpy())
    assert abs(err.mean() - 0.15) < 0.01 and 0.03 < err.std() < 0.07
    # the drive tracks the new target of joint 2 (from -0.785 to -0.6 rad) within 0.5 s
    assert abs(df["x.joint_2.q"].iloc[-1] - (-0.6)) < 0.02
    assert abs(df["x.joint_2.q"].iloc[0] - (-0.785398)) < 0.01


def test_plant_spread_draws_the_arm_through_its_hook(tmp_path):
    """[gaps.randomize] plant_spread: link mass scales, contact and friction drawn by the
    plant's hook, recorded in _meta.json, and the run steps the randomized arm."""
    sc = load_scenario(ROOT / "configs" / "panda.toml",
                       parse_settings([f"recording.path='{tmp_path / 'rec'}'", "loop.duration_s=0.05",
                                       "gaps.randomize.plant_spread=0.2"]))
    with Runtime(sc, lockstep=True) as rt:
        summary = rt.run()
        p, spec = rt.plant.p, rt.plant.spec
        scale = p[spec.indices("params", "link.mass_scale")]
    assert summary.exit_code == 0
    meta = json.loads((Path(summary.record_path) / "_meta.json").read_text())
    drawn = meta["randomized"]
    assert drawn["plant.link_3.mass_scale"] == scale[2] != 1.0
    assert 0.5 <= scale.min() and scale.max() <= 2.0
    assert drawn["plant.mu_kinetic"] <= drawn["plant.mu_static"]
    assert drawn["plant.hc_stiffness"] != 2e5
