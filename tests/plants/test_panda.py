"""plants/panda.py: the manipulator as a hil plant (spec from the URDF, contract, hooks)."""

from __future__ import annotations

import numpy as np
import pytest

from plants.base import Plant, load_plant
from plants.manipulator.arm import ArmModel
from plants.panda import EnvelopeLimits, gravity_hook
from tests.plants.contract_checks import assert_plant_contract


@pytest.fixture(scope="module")
def model():
    return load_plant("panda")


def test_spec_groups_per_joint(model):
    spec = model.spec
    for kind, group in (("outputs", "joint.q"), ("outputs", "joint.dq"), ("outputs", "joint.tau_measured"),
                        ("outputs", "joint.tau_command"), ("inputs", "joint.tau_target"),
                        ("states", "joint.q"), ("params", "link.mass_scale")):
        assert spec.group(kind, group).size == 7, group
    assert spec.expand("outputs", "joint.q")[2] == "joint_3.q"
    assert spec.expand("outputs", "ee.position") == ("ee.position.x", "ee.position.y", "ee.position.z")
    for name in ("gripper.width", "gripper.force", "contact.force", "contact.slip", "object.held"):
        spec.index("outputs", name)
    assert spec.n_algebraic == 0 and spec.n_discrete == 0


def test_contract_with_a_held_object(model):
    """The contract on a state with contact (object held, squeezed, in torque mode)."""
    def setup(plant):
        s = plant.spec
        plant.x[s.index("states", "object.held")] = 1.0
        plant.x[s.index("states", "gripper.width")] = 0.045
        plant.u[s.index("inputs", "gripper.width_target")] = 0.0
        plant.u[s.indices("inputs", "joint.tau_target")] = [1.0, -2.0, 0.5, 1.0, 0.0, 0.3, 0.1]

    assert_plant_contract(model, 0.001, setup=setup)


def test_same_trajectory_as_the_arm_kernels(model):
    """The wrapper adds nothing at nominal parameters: bit-for-bit the arm's own step."""
    plant = Plant(model, dt=0.001)
    am = ArmModel.panda()
    tau = np.array([2.0, -1.0, 0.5, 1.5, 0.2, -0.3, 0.1])
    plant.u[plant.spec.indices("inputs", "joint.tau_target")] = tau
    am.us("tau_command")[:] = tau
    for _ in range(50):
        plant.step(0.001)
        am.step(0.001, 4)
    assert np.array_equal(plant.x, am.x)
    assert np.array_equal(plant.compute_outputs(), am.compute_outputs())


def test_link_mass_scale_is_the_scale_links_route(model):
    plant = Plant(model, dt=0.001)
    scale = np.array([1.3, 0.7, 1.1, 0.9, 1.5, 0.6, 1.2])
    plant.p[plant.spec.indices("params", "link.mass_scale")] = scale
    am = ArmModel.panda()
    am.scale_links(scale)
    for _ in range(30):
        plant.step(0.001)
        am.step(0.001, 4)
    assert np.array_equal(plant.x, am.x)


def test_randomize_stays_physical(model):
    spec = model.spec
    rng = np.random.default_rng(3)
    lo, hi = spec.lows("params"), spec.highs("params")
    base = spec.nominal("params")
    for _ in range(50):
        p = base.copy()
        spec.randomize(p, rng, 0.3)
        assert ((p >= lo) & (p <= hi)).all()
        assert p[spec.index("params", "mu_kinetic")] <= p[spec.index("params", "mu_static")]
        assert (p[spec.indices("params", "joint.stribeck")] >= p[spec.indices("params", "joint.coulomb")]).all()
    assert not np.array_equal(p[spec.indices("params", "link.mass_scale")], np.ones(7))


def test_envelope_rows_predict_the_tcp(model):
    """ee_box rows: W a - b is the predicted overshoot; checked against the plant stepped
    with that torque (horizon short, so the second-order prediction holds to ~1e-4 m)."""
    spec = model.spec
    actions = list(spec.expand("inputs", "joint.tau_target"))
    lim = EnvelopeLimits("ee_box", model, actions, {"low": [-1, -1, -1], "high": [1, 1, 1], "horizon_s": 0.02})
    plant = Plant(model, dt=0.001)
    y = plant.compute_outputs().copy()
    tau = np.array([30.0, -20.0, 10.0, 20.0, 5.0, -5.0, 2.0])  # well above friction (<= 1.7 N m)
    W, b = np.zeros((lim.m, 7)), np.zeros(lim.m)
    lim.fill(y, plant.u, W, b)
    predicted = 1.0 - (b[1::2] - W[1::2] @ tau)  # h_pred = hi - (b - W a)
    plant.u[spec.indices("inputs", "joint.tau_target")] = tau
    for _ in range(20):
        plant.step(0.001)
    actual = plant.compute_outputs()[spec.indices("outputs", "ee.position")]
    moved = np.abs(actual - y[spec.indices("outputs", "ee.position")]).max()
    assert moved > 1e-4  # the torque moves the TCP measurably
    # friction (<= 1.7 N m of 2..30 N m) and the current-loop lag are left out: 20 % of the motion
    assert np.abs(predicted - actual).max() < 0.2 * moved


def test_gravity_hook_matches_the_arm(model):
    g = gravity_hook(model)
    plant = Plant(model)
    y = plant.compute_outputs().copy()
    am = ArmModel.panda()
    ref = am.chain.gravity_torque(am.xs("q").copy(), np.zeros(7))
    assert np.allclose(g(y), ref, atol=1e-9)
