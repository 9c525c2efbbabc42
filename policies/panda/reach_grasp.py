"""Demo policies for configs/panda_policy.toml: a scripted reach-and-grasp in torque mode.

Features (meta.json, in order): joint_1..7.q (rad), joint_1..7.dq (rad/s), gripper.width (m),
object.held (0/1), object.position.x/y/z (m). Actions: joint_1..7.tau_target (N m, on top of
the drive's gravity compensation) and gripper.width_target (m).

`ReachGrasp` (v1): phases approach (TCP 0.10 m above the object) -> descend (TCP at the
object's centre) -> close (width target 0; the object is held once the pads reach it) ->
lift (TCP 0.15 m above where the object was). Joint targets come from a damped least-squares
IK on the plant's own kinematics (plants.manipulator.arm.tcp_kinematics), solved once per
phase; the joint reference moves towards the target at `speed` rad/s and a joint PD
(libfranka's impedance gains) tracks it. A phase ends when every joint is within 0.01 rad of
its target and slower than 0.05 rad/s (close: when the object is held and the width settled).
The policy counts observations, `period_s` sim s apart (the policy runner sets it from [policy]
rate_hz: 4 ms at 250 Hz; 1 ms when it answers every 1 kHz step), and holds no clock of its own; it
re-plans when the measured object is more than 5 mm from where it planned for (this also
discards the policy process's warm-up call on the spec's nominal observation).

`RecklessGrasp` (v2, the bad candidate of the rollback drill): the same, with the sign of the
D term flipped (a classic sign error: negative damping), which pumps energy into the joints;
the monitor's joint-speed rule rolls it back.
"""

from __future__ import annotations

import numpy as np

from plants.base import load_plant
from plants.manipulator import arm

KP = np.array([600.0, 600.0, 600.0, 600.0, 250.0, 150.0, 50.0])  # N m/rad
KD = np.array([50.0, 50.0, 50.0, 50.0, 30.0, 25.0, 15.0])        # N m s/rad


class _Kinematics:
    def __init__(self):
        model = load_plant("panda")
        self.mf0, self.mi, _ = model.data
        self.wf = model.work[1].copy()
        self.pos, self.J = np.zeros(3), np.zeros((6, 7))
        spec = model.spec
        self.q_lo = spec.lows("inputs")[spec.indices("inputs", "joint.q_target")]
        self.q_hi = spec.highs("inputs")[spec.indices("inputs", "joint.q_target")]

    def tcp(self, q):
        arm.tcp_kinematics(np.ascontiguousarray(q, dtype=float), self.mf0, self.mi, self.wf, self.pos, self.J)
        return self.pos.copy(), self.J[3:].copy()

    def ik(self, q0, target, iters=200):
        """Joint positions putting the TCP at `target` (m), from q0: damped least squares with a
        pull towards q0 in the null space (keeps the hand's orientation close to q0's)."""
        q = q0.copy()
        for _ in range(iters):
            p, Jl = self.tcp(q)
            e = target - p
            if np.linalg.norm(e) < 1e-5:
                break
            JJt = Jl @ Jl.T + 1e-4 * np.eye(3)
            dq = Jl.T @ np.linalg.solve(JJt, e)
            N = np.eye(7) - Jl.T @ np.linalg.solve(JJt, Jl)
            dq += N @ (0.2 * (q0 - q))
            q = np.clip(q + dq, self.q_lo + 0.05, self.q_hi - 0.05)
        return q


class ReachGrasp:
    """v1: see the module docstring. act(x) -> 8 actions."""

    damping_sign = 1.0
    speed = 0.6  # rad/s, reference ramp
    period_s = 0.001  # sim s between calls (set by hil.policy.runner from [policy] rate_hz)

    def __init__(self):
        self.kin = _Kinematics()
        self.phase = 0
        self.q_ref = None
        self.q_goal = None
        self.settled = 0
        self.grasp_at = None
        self.planned_for = None

    def _goal(self, q, obj):
        above = {0: 0.10, 1: 0.0, 3: 0.15}[self.phase]
        if self.phase == 3:
            obj = self.grasp_at
        return self.kin.ik(q, obj + np.array([0.0, 0.0, above]))

    def act(self, x):
        x = np.asarray(x, dtype=float)
        q, dq, width, held, obj = x[0:7], x[7:14], x[14], x[15], x[16:19]
        if self.q_ref is None:
            self.q_ref = q.copy()
        if self.phase < 2 and self.planned_for is not None and np.abs(obj - self.planned_for).max() > 0.005:
            self.q_goal = None  # the object is elsewhere than planned for (or the first real observation)
        if self.q_goal is None and self.phase != 2:
            self.q_goal = self._goal(q, obj)
            self.planned_for = obj.copy()
        gripper = 0.08
        if self.phase == 2:
            gripper = 0.0
            self.settled = self.settled + 1 if held > 0.5 else 0
            if self.settled * self.period_s >= 0.2 - 1e-9:  # 0.2 s held: the squeeze has settled
                self.phase, self.q_goal, self.settled = 3, None, 0
        else:
            step = self.speed * self.period_s
            self.q_ref += np.clip(self.q_goal - self.q_ref, -step, step)
            at = np.abs(q - self.q_goal).max() < 0.01 and np.abs(dq).max() < 0.05
            if self.phase == 3:
                gripper = 0.0
            elif at:
                if self.phase == 1:
                    self.grasp_at = obj.copy()
                self.phase += 1
                self.q_goal = None
        tau = KP * (self.q_ref - q) - self.damping_sign * KD * dq
        return np.concatenate([tau, [gripper]])


class RecklessGrasp(ReachGrasp):
    """v2: negative damping (a sign error on the D term)."""

    damping_sign = -1.0
