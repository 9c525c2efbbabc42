"""Gripper and grasped object: Hunt-Crossley law, squeeze equilibrium, friction cone, slip."""

import numpy as np
import pytest

from plants.manipulator import arm as arm_mod
from plants.manipulator.arm import DEFAULT_SUBSTEPS, ArmModel, evaluate
from plants.manipulator.chain import Chain, PANDA_TCP, load_panda
from plants.manipulator.grasp import hunt_crossley
from plants.manipulator.layout import MODE_POSITION

DT = 1e-3
G = 9.81


@pytest.mark.parametrize("k, n, ratio", [(2e5, 1.5, 0.5), (1e6, 1.0, 0.0), (5e4, 2.0, 3.0)])
def test_hunt_crossley_matches_its_closed_form(k, n, ratio):
    lam = k * ratio
    for delta in np.linspace(1e-5, 3e-3, 13):
        for rate in (-0.05, -0.01, 0.0, 0.02, 0.1):
            expected = max(0.0, k * delta ** n + lam * delta ** n * rate)
            assert hunt_crossley(delta, rate, k, n, ratio) == pytest.approx(expected, rel=1e-13, abs=1e-300)
    assert hunt_crossley(0.0, 1.0, k, n, ratio) == 0.0          # no overlap, no force
    assert hunt_crossley(-1e-3, 1.0, k, n, ratio) == 0.0
    if ratio > 0:
        # a pad receding faster than 1/ratio would pull: clamped to zero, never negative
        assert hunt_crossley(1e-3, -2.0 / ratio, k, n, ratio) == 0.0


def grasping_arm(obj_mass, force, held=True):
    """Panda in position mode at the ready pose (TCP pointing down: the object's weight lies in
    the pad plane), drive running, the object squeezed at its static equilibrium."""
    arm = ArmModel.panda()
    arm.us("control_mode")[:] = MODE_POSITION
    arm.xs("tau_motor")[:] = Chain(load_panda()).gravity_torque(arm.xs("q"), np.zeros(7))
    arm.ps("obj_mass")[:] = obj_mass
    arm.us("gripper_width_command")[:] = 0.0
    arm.us("gripper_force_command")[:] = force
    k, n = arm.ps("hc_stiffness")[0], arm.ps("hc_exponent")[0]
    arm.xs("gripper_width")[:] = arm.ps("obj_width")[0] - 2.0 * (force / k) ** (1.0 / n)
    arm.xs("object_held")[:] = 1.0 if held else 0.0
    arm.xs("grasp_stuck")[:] = 1.0
    return arm


def capacity_mass(arm, force):
    """Heaviest object the two pads hold against gravity: 2 mu_s F_n / g (kg)."""
    return 2.0 * arm.ps("mu_static")[0] * force / G


def test_squeeze_settles_at_the_commanded_force_and_the_hertz_compression():
    arm = grasping_arm(0.3, 25.0)
    arm.xs("gripper_width")[:] = arm.ps("obj_width")[0]  # touching, not yet squeezed
    for _ in range(500):
        arm.step(DT, DEFAULT_SUBSTEPS)
    arm.compute_outputs()
    k, n = arm.ps("hc_stiffness")[0], arm.ps("hc_exponent")[0]
    assert arm.ys("contact_force")[0] == pytest.approx(25.0, rel=1e-4)
    expected_width = arm.ps("obj_width")[0] - 2.0 * (25.0 / k) ** (1.0 / n)
    assert arm.ys("gripper_width")[0] == pytest.approx(expected_width, abs=1e-7)
    assert arm.ys("slip")[0] == 0.0


def test_tangential_load_is_the_object_inertial_force_minus_weight():
    """Against Pinocchio: m_o (a_tcp - g) in the TCP x/z axes, a_tcp the classical acceleration
    of the TCP for the ABA's ddq (the held object is in the TCP body's inertia)."""
    pin = pytest.importorskip("pinocchio")
    from tests.plants.manipulator.test_dynamics import PANDA_LOCK, PANDA_URDF
    full = pin.buildModelFromUrdf(str(PANDA_URDF))
    model = pin.buildReducedModel(full, [full.getJointId(n) for n in PANDA_LOCK], pin.neutral(full))
    data = model.createData()
    fid = model.getFrameId(PANDA_TCP)
    arm = grasping_arm(0.8, 30.0)
    arm.us("control_mode")[:] = 0
    rng = np.random.default_rng(0)
    work = arm.work
    ddq, aux = work[15], work[24]
    for _ in range(50):
        arm.xs("q")[:] = rng.uniform(-1.5, 1.5, 7)
        arm.xs("dq")[:] = rng.uniform(-2, 2, 7)
        arm.xs("tau_motor")[:] = rng.uniform(-10, 10, 7)
        evaluate(arm.x, arm.u, arm.p, arm.model, work, arm.gq)
        q, dq = arm.xs("q"), arm.xs("dq")
        pin.forwardKinematics(model, data, q, dq, ddq)
        pin.updateFramePlacements(model, data)
        a = pin.getFrameClassicalAcceleration(model, data, fid, pin.LOCAL).linear
        g_local = data.oMf[fid].rotation.T @ np.array([0, 0, -G])
        load = 0.8 * (a - g_local)
        np.testing.assert_allclose([aux[arm_mod.A_LOAD0], aux[arm_mod.A_LOAD1]], load[[0, 2]], atol=1e-9)


@pytest.mark.parametrize("fraction, slips", [(0.95, False), (1.05, True)])
def test_grasp_holds_inside_the_friction_cone_and_slips_outside(fraction, slips):
    force = 10.0
    arm = grasping_arm(1.0, force)
    arm.ps("obj_mass")[:] = fraction * capacity_mass(arm, force)
    for _ in range(1000):
        arm.step(DT, DEFAULT_SUBSTEPS)
    arm.compute_outputs()
    if slips:
        assert arm.xs("slip_events")[0] >= 1
        assert arm.ys("object_dropped")[0] == 1.0 and arm.ys("object_held")[0] == 0.0
    else:
        assert arm.xs("slip_events")[0] == 0
        assert arm.ys("object_held")[0] == 1.0 and arm.ys("slip")[0] == 0.0
        assert np.abs(arm.xs("obj_slide")).max() == 0.0


def test_slip_starts_at_the_predicted_weight():
    """Object mass ramped at 0.5 kg/s: the first slip happens at m* = 2 mu_s F_n / g (+-1 %)."""
    force = 10.0
    arm = grasping_arm(1.2, force)
    m_star = capacity_mass(arm, force)
    onset = None
    for k in range(2000):
        arm.ps("obj_mass")[:] = 1.2 + 0.5 * k * DT
        arm.step(DT, DEFAULT_SUBSTEPS)
        if arm.xs("slip_events")[0] > 0:
            onset = arm.ps("obj_mass")[0]
            break
    assert onset is not None
    assert onset == pytest.approx(m_star, rel=0.01)


def test_slip_starts_at_the_predicted_inertial_load():
    """Weight + inertial load: ramping the vertical acceleration of the whole cell (equivalently
    |g|, since the pads carry m (a - g)) slips a 0.7 m* object at |a - g| = 2 mu_s F_n / m."""
    force = 10.0
    arm = grasping_arm(1.0, force)
    m = 0.7 * capacity_mass(arm, force)
    arm.ps("obj_mass")[:] = m
    predicted = 2.0 * arm.ps("mu_static")[0] * force / m     # m/s^2
    gravity = arm.model[5]
    onset = None
    try:
        for k in range(3000):
            gravity[2] = -(G + 3.0 * k * DT)                 # +3 m/s^2 per second
            arm.step(DT, DEFAULT_SUBSTEPS)
            if arm.xs("slip_events")[0] > 0:
                onset = -gravity[2]
                break
    finally:
        gravity[2] = -G
    assert onset is not None
    assert onset == pytest.approx(predicted, rel=0.01)


def test_closing_fingers_at_the_object_grasp_it_and_lifting_carries_it():
    arm = ArmModel.panda()
    arm.us("control_mode")[:] = MODE_POSITION
    arm.xs("tau_motor")[:] = Chain(load_panda()).gravity_torque(arm.xs("q"), np.zeros(7))
    arm.compute_outputs()
    tcp = arm.ys("ee_position").copy()
    arm.xs("obj_position")[:] = tcp                       # object resting at the open fingers
    arm.us("gripper_width_command")[:] = 0.0
    arm.us("gripper_force_command")[:] = 20.0
    for _ in range(300):
        arm.step(DT, DEFAULT_SUBSTEPS)
    arm.compute_outputs()
    assert arm.ys("object_held")[0] == 1.0
    assert arm.ys("contact_force")[0] == pytest.approx(20.0, rel=1e-3)
    # lift: joint 2 and 4 move the TCP up; the object goes with it
    arm.us("q_command")[:] = arm.xs("q") + np.array([0, -0.2, 0, 0.2, 0, 0, 0])
    for _ in range(1500):
        arm.step(DT, DEFAULT_SUBSTEPS)
    arm.compute_outputs()
    assert arm.ys("object_held")[0] == 1.0
    assert arm.ys("object_position")[2] > tcp[2] + 0.02
    np.testing.assert_allclose(arm.ys("object_position"), arm.ys("ee_position"), atol=1e-9)


def test_a_miss_grasps_nothing():
    arm = ArmModel.panda()
    arm.compute_outputs()
    arm.xs("obj_position")[:] = arm.ys("ee_position") + np.array([0.05, 0, 0])
    arm.us("gripper_width_command")[:] = 0.0
    for _ in range(300):
        arm.step(DT, DEFAULT_SUBSTEPS)
    arm.compute_outputs()
    assert arm.ys("object_held")[0] == 0.0
    assert arm.ys("gripper_width")[0] < 1e-4 and arm.ys("contact_force")[0] == 0.0
