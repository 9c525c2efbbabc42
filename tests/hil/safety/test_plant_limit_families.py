"""State-dependent linear limits a plant provides ([[safety.projection.plant]], the Panda's
Cartesian box for the TCP) and the joint PD / hold fallback (hil/safety/fallback.py)."""

import numpy as np
import pytest
from scipy.optimize import minimize

from hil.safety.config import FallbackSection, ProjectionSection
from hil.safety.fallback import FallbackController
from hil.safety.projection import Projector, plant_limit_family
from plants.base import Plant, load_plant
from plants.panda import gravity_hook

MODEL = load_plant("panda")
SPEC = MODEL.spec
NAMES = list(SPEC.expand("inputs", "joint.tau_target")) + ["gripper.width_target"]
BOX = {"low": [0.25, -0.4, 0.03], "high": [0.75, 0.4, 0.8], "horizon_s": 0.1}


def _state(dq=None):
    plant = Plant(MODEL)
    if dq is not None:
        plant.x[SPEC.indices("states", "joint.dq")] = dq
    return plant.compute_outputs().copy(), plant.u.copy()


def test_rows_move_with_the_state_and_the_projection_is_the_nearest_feasible_point():
    near = {**BOX, "high": [0.35, 0.4, 0.8]}  # the TCP starts at x = 0.307 m
    proj = Projector(ProjectionSection(plant=[{"name": "workspace", "kind": "ee_box", "options": near}]),
                     SPEC, NAMES, plant=MODEL)
    y0, u = _state()
    y1, _ = _state(dq=[0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0])  # moving forward and down
    a = np.array([0.0, 80.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.08])
    out0, _ = proj.project(a, None, -1.0, y0, u)
    W0, b0 = proj.W.copy(), proj.b0.copy()
    out1, clips = proj.project(a, None, -1.0, y1, u)
    W1, b1 = proj.W.copy(), proj.b0.copy()
    assert not np.allclose(b0, b1)  # b(state) and W(state) rebuilt per observation
    assert (W1 @ out1 <= b1 + 1e-6).all()
    assert (W0 @ out0 <= b0 + 1e-6).all()
    assert clips and all("linear:workspace" in c.reason for c in clips if c.input != "joint_2.tau_target"
                         or "box" not in c.reason)
    assert out1[1] < 80.0
    # optimality: the nearest point (span-scaled) inside the box and the rows
    scale = proj.scale
    res = minimize(lambda v: np.sum(((v - a) / scale) ** 2), out1, method="SLSQP",
                   bounds=list(zip(proj.lo, proj.hi)),
                   constraints=[{"type": "ineq", "fun": lambda v: b1 - W1 @ v}], options={"ftol": 1e-14})
    assert np.sum(((out1 - a) / scale) ** 2) <= res.fun * (1 + 1e-6) + 1e-12


def test_a_bad_joint_measurement_makes_the_rows_unknown():
    proj = Projector(ProjectionSection(plant=[{"name": "workspace", "kind": "ee_box", "options": BOX}]),
                     SPEC, NAMES, plant=MODEL)
    y, u = _state()
    assert proj.unknown_limits(y, u) == []
    y[SPEC.index("outputs", "joint_3.q")] = np.nan
    assert proj.unknown_limits(y, u) == ["workspace"]
    y, u = _state()
    y[SPEC.index("outputs", "contact.force")] = np.nan  # not read by the rows
    assert proj.unknown_limits(y, u) == []


def test_configuration_errors_name_the_key():
    with pytest.raises(ValueError, match=r"safety.projection.plant\[0\].kind: .*no limit family 'sphere'"):
        plant_limit_family(MODEL, "sphere", NAMES, {}, "safety.projection.plant[0]")
    with pytest.raises(ValueError, match=r"plant\[0\].options.low: expected 3 finite numbers"):
        plant_limit_family(MODEL, "ee_box", NAMES, {"low": [0, 0], "high": [1, 1, 1]}, "safety.projection.plant[0]")
    with pytest.raises(ValueError, match=r"options.actions: none of joint.tau_target"):
        plant_limit_family(MODEL, "ee_box", ["gripper.width_target"], BOX, "safety.projection.plant[0]")


def _pd(gravity=False):
    sec = FallbackSection(joint_pd=[{"inputs": "joint.tau_target", "position": "joint.q", "velocity": "joint.dq",
                                     "kp": 100.0, "kd": [10.0] * 7, "gravity": gravity}],
                          hold=["gripper.width_target"])
    return FallbackController(sec, SPEC, NAMES, plant=MODEL)


def test_joint_pd_holds_where_it_took_over_and_holds_the_gripper():
    fb = _pd()
    y, u = _state()
    u[SPEC.index("inputs", "gripper.width_target")] = 0.03
    a = fb.update(y, u, 0.001)
    assert np.allclose(a[:7], 0.0, atol=1e-12) and a[7] == 0.03  # at the reference, at rest
    q = y[SPEC.indices("outputs", "joint.q")]
    y2 = y.copy()
    y2[SPEC.indices("outputs", "joint.q")] = q + 0.01
    a2 = fb.update(y2, u, 0.001)
    assert np.allclose(a2[:7], -1.0)  # kp 100 N m/rad x 0.01 rad back to where it took over
    fb.track(np.zeros(8), y2, u)  # the policy acted: the reference follows the measured q
    assert np.allclose(fb.update(y2, u, 0.001)[:7], 0.0, atol=1e-12)
    y2[SPEC.index("outputs", "joint_1.q")] = np.nan  # a Bad encoder: no action on it (0 N m)
    assert (fb.update(y2, u, 0.001)[:7] == 0.0).all()


def test_joint_pd_with_gravity_adds_the_plants_gravity_torque():
    y, u = _state()
    a = _pd(gravity=True).update(y, u, 0.001)
    g = gravity_hook(MODEL)(y)
    assert np.abs(g).max() > 1.0
    assert np.allclose(a[:7], np.clip(g, SPEC.lows("inputs")[SPEC.indices("inputs", "joint.tau_target")],
                                      SPEC.highs("inputs")[SPEC.indices("inputs", "joint.tau_target")]))


def _scenario_text(tmp_path, old: str, new: str):
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    text = (root / "configs" / "panda_policy.toml").read_text()
    text = text.replace('"../policies/panda"', f'"{root / "policies" / "panda"}"')
    assert old in text
    path = tmp_path / "sc.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("old, new, key, reason", [
    ('kind = "ee_box"', 'kind = "sphere"', "safety.projection.plant[0].kind", "no limit family 'sphere'"),
    ("options = { low = [0.25, -0.4, 0.03]", "options = { low = [0.25, -0.4]",
     "safety.projection.plant[0].options.low", "expected 3 finite numbers"),
    ('position = "joint.q"\n', 'position = "ee.position"\n', "safety.fallback.joint_pd[0]",
     "7 inputs, 3 positions, 7 velocities"),
    ('hold = ["gripper.width_target"]', 'hold = []', "safety.fallback", "no fallback for gripper.width_target"),
])
def test_scenario_errors_name_the_key(tmp_path, old, new, key, reason):
    from hil.scenario.config import load_scenario
    from hil.errors import ConfigError

    with pytest.raises(ConfigError) as exc:
        load_scenario(_scenario_text(tmp_path, old, new))
    assert any(p == key and reason in r for p, r in exc.value.problems), exc.value.problems
