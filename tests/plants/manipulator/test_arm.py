"""The arm plant step: integrator energy behaviour, friction, drives, stops, torque sensing.

The integrator checks run the plant's own `step` (semi-implicit Euler on ABA, 4 sub-steps of
MAX_SUBSTEP = 0.25 ms per 1 ms period) with friction, drive and stops switched off; energy is
`dynamics.energy` (kinetic incl. rotor armature + potential), checked against Pinocchio's in
test_dynamics via the same model.
"""

import numpy as np
import pytest

from plants.manipulator.arm import DEFAULT_SUBSTEPS, MAX_SUBSTEP, ArmModel, step
from plants.manipulator.chain import Chain, load_panda
from plants.manipulator.layout import MODE_POSITION, MODE_TORQUE, MODE_VELOCITY

DT = 1e-3
# Near the hanging (stable) equilibrium of the Panda with its joint stops removed, found by
# letting the damped arm settle; a kick of 1 rad/s per joint gives ~5 J of kinetic energy
# and joint speeds up to ~6 rad/s.
Q_HANG = np.array([0.0, -3.361, -0.048, -6.782, 0.347, 2.476, 0.679])
KICK = np.array([1.0, -1.0, 1.0, 1.0, -1.0, 1.0, 1.0])


def conservative_arm():
    arm = ArmModel.panda()
    for name in ("coulomb", "stribeck", "viscous", "limit_stiffness", "limit_damping", "gravity_comp"):
        arm.ps(name)[:] = 0.0
    arm.us("control_mode")[:] = MODE_TORQUE
    arm.us("tau_command")[:] = 0.0
    return arm


def energy_of(arm):
    ch = arm.chain
    ch.armature[:] = arm.ps("rotor_inertia") * arm.ps("gear_ratio") ** 2
    return ch.energy(arm.xs("q"), arm.xs("dq")).sum()


def run_energy(arm, seconds, n_sub):
    E = np.empty(int(round(seconds / DT)) + 1)
    E[0] = energy_of(arm)
    for k in range(1, E.size):
        step(0.0, arm.x, arm.u, arm.p, DT, n_sub, arm.mf, arm.mi, arm.wf)
        E[k] = energy_of(arm)
    return E


def test_substep_constants():
    assert MAX_SUBSTEP == 2.5e-4
    assert DEFAULT_SUBSTEPS * MAX_SUBSTEP == pytest.approx(DT)


def test_energy_drift_over_10_s_without_friction_or_input_is_bounded():
    """Measured: max |E - E0| = 0.039 J over 10 s (0.8 % of the 5 J kinetic energy of the kick)."""
    arm = conservative_arm()
    arm.xs("q")[:] = Q_HANG
    arm.xs("dq")[:] = KICK
    E = run_energy(arm, 10.0, DEFAULT_SUBSTEPS)
    assert np.abs(E - E[0]).max() < 0.05


def test_energy_error_stays_bounded_at_1ms_where_explicit_euler_grows():
    """One 1 ms sub-step for 60 s: semi-implicit Euler oscillates (measured max 0.13 J), explicit
    Euler on the same ABA gains energy steadily (measured +8.7 J after 60 s)."""
    arm = conservative_arm()
    arm.xs("q")[:] = Q_HANG
    arm.xs("dq")[:] = KICK
    E = run_energy(arm, 60.0, 1)
    assert np.abs(E - E[0]).max() < 0.2
    # the same system, explicit Euler
    ch = Chain(load_panda(), armature=arm.ps("rotor_inertia") * arm.ps("gear_ratio") ** 2)
    q, dq, tau, ddq = Q_HANG.copy(), KICK.copy(), np.zeros(7), np.zeros(7)
    E0 = ch.energy(q, dq).sum()
    for _ in range(60000):
        ch.aba(q, dq, tau, ddq)
        q += DT * dq
        dq += DT * ddq
    assert ch.energy(q, dq).sum() - E0 > 3.0


def test_energy_drift_of_a_free_fall_from_the_ready_pose_is_stated():
    """The hard case: the unsupported arm falls from the ready pose without joint stops and
    whips its wrist to ~33 rad/s (15x the Panda's limit). Measured max |E - E0| = 1.8 J of 85 J
    (2 %) over 10 s at 4 sub-steps; the error is first order in the sub-step."""
    arm = conservative_arm()
    E = run_energy(arm, 10.0, DEFAULT_SUBSTEPS)
    assert np.abs(E - E[0]).max() < 3.0


def test_friction_dissipates_monotonically():
    arm = conservative_arm()
    fresh = ArmModel.panda()
    for name in ("coulomb", "stribeck", "viscous", "stribeck_speed", "friction_smoothing"):
        arm.ps(name)[:] = fresh.ps(name)
    arm.xs("q")[:] = Q_HANG
    arm.xs("dq")[:] = KICK
    E = run_energy(arm, 5.0, DEFAULT_SUBSTEPS)
    dE = np.diff(E)
    # every 1 ms step loses energy (the integrator's own oscillation, <= 0.02 J over 10 s, is
    # far below the friction power of ~1 W at these speeds); 1e-9 J for round-off
    assert dE.max() < 1e-9
    assert E[-1] < E[0] - 4.0  # most of the kick is gone after 5 s


def hold_ready(arm, seconds):
    n = int(round(seconds / DT))
    for _ in range(n):
        arm.step(DT, DEFAULT_SUBSTEPS)
    return arm.compute_outputs()


def test_torque_mode_with_drive_gravity_compensation_holds_the_arm():
    arm = ArmModel.panda()
    arm.us("control_mode")[:] = MODE_TORQUE
    q0 = arm.xs("q").copy()
    # the drive is already running: its current loop carries g(q0)
    arm.xs("tau_motor")[:] = Chain(load_panda()).gravity_torque(q0, np.zeros(7))
    hold_ready(arm, 1.0)
    assert np.abs(arm.xs("q") - q0).max() < 1e-6
    # without it, the same zero torque command lets the arm fall
    arm2 = ArmModel.panda()
    arm2.ps("gravity_comp")[:] = 0.0
    hold_ready(arm2, 0.3)
    assert np.abs(arm2.xs("q") - q0).max() > 0.05


def test_tau_measured_is_the_gravity_load_at_rest():
    arm = ArmModel.panda()
    hold_ready(arm, 0.5)
    g = Chain(load_panda()).gravity_torque(arm.xs("q"), np.zeros(7))
    np.testing.assert_allclose(arm.ys("tau_measured"), g, atol=1e-6)
    np.testing.assert_allclose(arm.ys("q"), arm.xs("q"))


def test_position_mode_reaches_the_target_within_the_friction_deadband():
    arm = ArmModel.panda()
    arm.us("control_mode")[:] = MODE_POSITION
    target = arm.xs("q") + np.array([0.2, -0.2, 0.2, 0.2, -0.3, 0.3, 0.5])
    arm.us("q_command")[:] = target
    hold_ready(arm, 3.0)
    # PD + Coulomb friction: static error up to stribeck / kp (<= 0.011 rad on joint 7)
    bound = arm.ps("stribeck") / arm.ps("kp") + 1e-4
    assert (np.abs(arm.xs("q") - target) <= bound).all()


def test_velocity_mode_tracks_the_velocity_target():
    arm = ArmModel.panda()
    arm.us("control_mode")[:] = MODE_VELOCITY
    arm.us("dq_command")[:] = [0.1, 0.0, -0.1, 0.0, 0.2, 0.0, -0.3]
    hold_ready(arm, 1.0)
    np.testing.assert_allclose(arm.xs("dq"), arm.us("dq_command"), atol=2e-3)


def test_torque_limit_and_current_loop_lag():
    arm = ArmModel.panda()
    arm.ps("gravity_comp")[:] = 0.0
    arm.us("tau_command")[:] = [0, 0, 0, 0, 0, 0, 30.0]   # joint 7 is limited to 12 N m
    T = arm.ps("current_tau")[0]
    # one step of exactly one time constant: tau_motor = 63 % of the clipped demand
    arm.step(T, 1)
    assert arm.xs("tau_motor")[6] == pytest.approx(12.0 * (1 - np.exp(-1)), rel=1e-12)
    arm.compute_outputs()
    assert arm.ys("tau_command")[6] == 12.0


def test_joint_stop_is_a_stiff_spring():
    """A constant torque into the upper stop of joint 7 settles at q_upper + tau / K."""
    arm = ArmModel.panda()
    arm.xs("q")[6] = arm.ps("q_upper")[6] - 0.01
    arm.us("tau_command")[:] = [0, 0, 0, 0, 0, 0, 10.0]
    hold_ready(arm, 1.5)
    K = arm.ps("limit_stiffness")[0]
    # friction at rest holds up to the Stribeck level: the settled torque lies in tau +- Fs
    pen = arm.xs("q")[6] - arm.ps("q_upper")[6]
    Fs = arm.ps("stribeck")[6]
    assert (10.0 - Fs) / K - 1e-6 <= pen <= (10.0 + Fs) / K + 1e-6
    assert abs(arm.xs("dq")[6]) < 1e-3


NO_ALLOC_SCRIPT = r"""
import numpy as np
from numba import njit
from numba.core.runtime import rtsys
from plants.manipulator.arm import ArmModel, step, outputs
a = ArmModel.panda()
a.xs("object_held")[:] = 1.0
a.xs("gripper_width")[:] = 0.049
a.us("gripper_width_command")[:] = 0.0

@njit
def run(n, x, u, p, y, mf, mi, wf):
    for _ in range(n):
        step(0.0, x, u, p, 1e-3, 4, mf, mi, wf)
        outputs(x, u, p, y, mf, mi, wf)

args = (a.x, a.u, a.p, a.y, a.mf, a.mi, a.wf)
run(1, *args)
s0 = rtsys.get_allocation_stats().alloc
run(1, *args)
s1 = rtsys.get_allocation_stats().alloc
run(500, *args)
s2 = rtsys.get_allocation_stats().alloc
print(s1 - s0, s2 - s1, a.compute_outputs()[0])
"""


def test_step_and_outputs_allocate_nothing_per_call():
    """Numba's own allocation counter (NUMBA_NRT_STATS): 500 steps + outputs inside a compiled
    loop allocate exactly what 1 does (the arguments' boxing), i.e. nothing per step."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, NUMBA_NRT_STATS="1", PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", NO_ALLOC_SCRIPT], capture_output=True, text=True,
                         env=env, cwd=root, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    one, many, _ = out.stdout.split()
    assert int(one) == int(many)


def test_tcp_kinematics_matches_the_chain_and_linearises_the_motion():
    from plants.manipulator.arm import tcp_kinematics
    from plants.manipulator.chain import PANDA_TCP

    arm = ArmModel.panda()
    ch = Chain(load_panda())
    rng = np.random.default_rng(3)
    pos, J = np.zeros(3), np.zeros((6, 7))
    pos2, J2 = np.zeros(3), np.zeros((6, 7))
    for _ in range(20):
        q = rng.uniform(ch.tree.q_lower, ch.tree.q_upper)
        tcp_kinematics(q, arm.mf, arm.mi, arm.wf, pos, J)
        ch.frame(PANDA_TCP, q, pos2, J2)
        np.testing.assert_array_equal(pos, pos2)
        np.testing.assert_array_equal(J, J2)
        # first-order prediction of a 1 ms move at 1 rad/s: error O(dt^2)
        dq = rng.uniform(-1, 1, 7)
        ch.frame(PANDA_TCP, q + dq * 1e-3, pos2, J2)
        np.testing.assert_allclose(pos2, pos + J[3:] @ dq * 1e-3, atol=1e-5)


def test_layout_nominals_lie_within_their_bounds():
    arm = ArmModel.panda()
    L = arm.layout
    for which in ("x", "u", "y", "p"):
        lo, hi = L.bounds(which)
        nom = L.nominal(which)
        bad = np.flatnonzero(~((lo <= nom) & (nom <= hi)))
        assert bad.size == 0, (which, bad)


def test_gravity_torque_on_the_flat_buffers_equals_the_chain_rnea():
    from plants.manipulator.arm import gravity_torque

    arm = ArmModel.panda()
    ch = Chain(load_panda())
    rng = np.random.default_rng(4)
    out, ref = np.zeros(7), np.zeros(7)
    for _ in range(20):
        q = rng.uniform(ch.tree.q_lower, ch.tree.q_upper)
        gravity_torque(q, arm.mf, arm.mi, arm.wf, out)
        np.testing.assert_array_equal(out, ch.gravity_torque(q, ref))


def test_friction_law():
    from plants.manipulator.drive import friction_torque

    Fc, Fs, vs, Fv, eps = 0.5, 0.8, 0.1, 0.2, 0.02
    for v in (0.001, 0.01, 0.05, 0.3, 2.0):
        f = friction_torque(v, Fc, Fs, vs, Fv, eps)
        expected = (Fc + (Fs - Fc) * np.exp(-(v / vs) ** 2)) * np.tanh(v / eps) + Fv * v
        assert f == pytest.approx(expected, rel=1e-14)
        assert friction_torque(-v, Fc, Fs, vs, Fv, eps) == pytest.approx(-f, rel=1e-14)  # opposes motion
    assert friction_torque(0.0, Fc, Fs, vs, Fv, eps) == 0.0
    # Stribeck: breakaway level near rest above the sliding (Coulomb) level
    assert friction_torque(0.06, Fc, Fs, vs, Fv, eps) - Fv * 0.06 > friction_torque(0.5, Fc, Fs, vs, Fv, eps) - Fv * 0.5
