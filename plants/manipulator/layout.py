"""The arm plant's flat arrays: states, inputs, outputs and parameters as named groups.

Every group has a name, a size (1, the joint count `nb`, or a fixed small number), a unit, a
nominal value (scalar, or one value per element), physical bounds and a description. The
kernels see four float64 arrays (x, u, y, p) and an int64 offset table built here once; the
plant contract (spec from a model file, per-joint array signals) reads `Layout.groups` to
build its spec without knowing the physics. Snapshot = copy of x (and p): every piece of
state, continuous or discrete (stick/slip mode, object held, slip event counter), is in x.

Nominal values for the Panda, and where they come from:
- effort and velocity limits, joint ranges, masses and inertias: the URDF.
- rotor inertia and gear ratio: armature rotor_inertia * gear_ratio^2 = 0.1 kg m^2 (joints
  1-4) and 0.05 kg m^2 (5-7); an assumption of the order of the reflected inertias identified
  for the Panda (Gaz et al., RA-L 2019), to be calibrated on the actual unit.
- friction: Coulomb 0.3-1.3 N m per joint, of the order of the Coulomb terms in Gaz et al.
  (2019); Stribeck peak 1.3 x Coulomb at 0.1 rad/s; viscous 0.1-0.2 N m s/rad.
- drive gains: libfranka's joint impedance example gains (k = 600 ... 50 N m/rad,
  d = 50 ... 15 N m s/rad); current-loop time constant 0.2 ms (~800 Hz bandwidth).
- gripper: Franka Hand, 0.08 m stroke, 70 N continuous grasp force.
- object: a 0.05 m wide soft object (k = 2e5 N/m^1.5, n = 1.5 Hertzian exponent), 0.3 kg,
  rubber-like friction mu_s = 0.8, mu_k = 0.6; all randomizable within the stated bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# control_mode input values
MODE_TORQUE = 0
MODE_POSITION = 1
MODE_VELOCITY = 2

NJ = "nb"  # size marker: one element per joint

#: Franka's "ready" pose (rad), the nominal joint state and position target.
PANDA_READY = [0.0, -0.785398163, 0.0, -2.35619449, 0.0, 1.57079633, 0.785398163]


@dataclass(frozen=True)
class Group:
    """One named block of an array: `size` elements (int, or NJ for one per joint)."""

    name: str
    size: object
    unit: str
    nominal: object
    low: object
    high: object
    description: str


STATE_GROUPS = (
    Group("q", NJ, "rad", PANDA_READY, -np.inf, np.inf, "joint positions (prismatic: m)"),
    Group("dq", NJ, "rad/s", 0.0, -np.inf, np.inf, "joint velocities (prismatic: m/s)"),
    Group("tau_motor", NJ, "N m", 0.0, -np.inf, np.inf,
          "joint-side motor torque, output of the current loop (first-order lag state)"),
    Group("vel_integral", NJ, "rad", 0.0, -np.inf, np.inf,
          "integral of the velocity error of the drive's PI loop (velocity mode)"),
    Group("gripper_width", 1, "m", 0.08, 0.0, 0.08, "distance between the finger pads"),
    Group("gripper_speed", 1, "m/s", 0.0, -np.inf, np.inf, "rate of gripper_width"),
    Group("obj_slide", 2, "m", 0.0, -np.inf, np.inf,
          "object displacement along the pads (TCP x, z) from where it was grasped"),
    Group("obj_slide_speed", 2, "m/s", 0.0, -np.inf, np.inf, "rate of obj_slide"),
    Group("grasp_stuck", 1, "1", 1.0, 0.0, 1.0, "1 while the object sticks to the pads, 0 while it slides"),
    Group("object_held", 1, "1", 0.0, 0.0, 1.0, "1 while the object is held between the fingers"),
    Group("object_dropped", 1, "1", 0.0, 0.0, 1.0, "1 once a held object slid out of the grasp"),
    Group("slip_events", 1, "1", 0.0, 0.0, np.inf, "count of stick -> slip transitions"),
    Group("obj_position", 3, "m", [0.5, 0.0, 0.05], -np.inf, np.inf,
          "object centre, world frame: where it rests until grasped, then where it is held"),
)

INPUT_GROUPS = (
    Group("control_mode", 1, "1", 0.0, 0.0, 2.0, "0 torque, 1 joint position, 2 joint velocity"),
    Group("tau_command", NJ, "N m", 0.0, "-effort", "effort",
          "torque mode: joint torque on top of the drive's gravity compensation"),
    Group("q_command", NJ, "rad", PANDA_READY, "q_lower", "q_upper", "position mode: joint position target"),
    Group("dq_command", NJ, "rad/s", 0.0, "-velocity", "velocity", "velocity mode: joint velocity target"),
    Group("gripper_width_command", 1, "m", 0.08, 0.0, 0.08, "gripper width target"),
    Group("gripper_force_command", 1, "N", 20.0, 0.0, 70.0, "largest squeeze force per finger"),
)

OUTPUT_GROUPS = (
    Group("q", NJ, "rad", PANDA_READY, "q_lower", "q_upper", "joint positions (encoders)"),
    Group("dq", NJ, "rad/s", 0.0, "-velocity", "velocity", "joint velocities"),
    Group("tau_measured", NJ, "N m", 0.0, "-effort", "effort",
          "link-side joint torque sensor: motor torque - friction - rotor inertia x ddq"),
    Group("tau_command", NJ, "N m", 0.0, "-effort", "effort",
          "torque the drive demanded of its current loop (after limits)"),
    Group("gripper_width", 1, "m", 0.08, 0.0, 0.08, "finger pad distance"),
    Group("gripper_force", 1, "N", 0.0, 0.0, 140.0, "gripper drive force per finger (closing +)"),
    Group("contact_force", 1, "N", 0.0, 0.0, np.inf, "normal (Hunt-Crossley) force per pad"),
    Group("tangential_load", 1, "N", 0.0, 0.0, np.inf, "load the pads must hold: |m_o (a - g)| in the pad plane"),
    Group("slip", 1, "1", 0.0, 0.0, 1.0, "1 when tangential_load > mu_s x 2 x contact_force, or sliding"),
    Group("object_held", 1, "1", 0.0, 0.0, 1.0, "object between the fingers"),
    Group("object_dropped", 1, "1", 0.0, 0.0, 1.0, "a held object was lost"),
    Group("ee_position", 3, "m", 0.0, -np.inf, np.inf, "TCP position, world frame"),
    Group("object_position", 3, "m", 0.0, -np.inf, np.inf, "object centre, world frame"),
)

PARAM_GROUPS = (
    Group("gear_ratio", NJ, "1", 100.0, 100.0, 200.0, "motor turns per joint turn"),
    Group("rotor_inertia", NJ, "kg m^2", [1e-5] * 4 + [5e-6] * 3, 5e-6, 1e-4,
          "motor rotor inertia (motor side); armature = rotor_inertia * gear_ratio^2 >= 0.05 kg m^2 "
          "within the bounds, which MAX_SUBSTEP relies on"),
    Group("effort", NJ, "N m", "effort", 0.0, np.inf, "joint-side torque limit of the drive"),
    Group("current_tau", 1, "s", 2e-4, 1e-5, 5e-3, "current-loop first-order time constant"),
    Group("coulomb", NJ, "N m", [0.55, 0.87, 0.64, 1.28, 0.84, 0.30, 0.56], 0.0, 10.0, "Coulomb friction"),
    Group("stribeck", NJ, "N m", [0.72, 1.13, 0.83, 1.66, 1.09, 0.39, 0.73], 0.0, 15.0,
          "static (breakaway) friction, >= coulomb"),
    Group("stribeck_speed", 1, "rad/s", 0.1, 1e-3, 1.0, "Stribeck velocity"),
    Group("viscous", NJ, "N m s/rad", [0.2, 0.2, 0.2, 0.2, 0.1, 0.1, 0.1], 0.0, 10.0, "viscous friction"),
    Group("friction_smoothing", 1, "rad/s", 0.02, 1e-4, 0.5,
          "Coulomb sign smoothed as tanh(dq / friction_smoothing)"),
    Group("q_lower", NJ, "rad", "q_lower", -np.inf, np.inf, "joint lower limit (stop)"),
    Group("q_upper", NJ, "rad", "q_upper", -np.inf, np.inf, "joint upper limit (stop)"),
    Group("limit_stiffness", 1, "N m/rad", 1e4, 0.0, 1e5, "joint stop spring"),
    Group("limit_damping", 1, "N m s/rad", 20.0, 0.0, 200.0, "joint stop damper (pushes out only)"),
    Group("kp", NJ, "N m/rad", [600, 600, 600, 600, 250, 150, 50], 0.0, 5000.0, "position-mode P gain"),
    Group("kd", NJ, "N m s/rad", [50, 50, 50, 50, 30, 25, 15], 0.0, 500.0, "position-mode D gain"),
    Group("kv", NJ, "N m s/rad", [50, 50, 50, 50, 30, 25, 15], 0.0, 500.0, "velocity-mode P gain"),
    Group("ki", NJ, "N m/rad", [200, 200, 200, 200, 100, 80, 50], 0.0, 5000.0, "velocity-mode I gain"),
    Group("gravity_comp", 1, "1", 1.0, 0.0, 1.0, "1: the drive adds g(q) to every mode (as Franka's does)"),
    Group("finger_mass", 1, "kg", 0.1, 0.05, 1.0, "effective mass per finger incl. reflected drive inertia"),
    Group("gripper_kp", 1, "N/m", 2000.0, 0.0, 1e5, "gripper width P gain (force per finger)"),
    Group("gripper_kd", 1, "N s/m", 40.0, 0.0, 1e3, "gripper width D gain"),
    Group("gripper_stroke", 1, "m", 0.08, 0.0, 0.2, "largest pad distance"),
    Group("gripper_force_max", 1, "N", 70.0, 0.0, 140.0, "gripper drive force limit per finger"),
    Group("obj_mass", 1, "kg", 0.3, 0.0, 5.0, "grasped object mass"),
    Group("obj_width", 1, "m", 0.05, 0.0, 0.08, "object width between the pads, undeformed"),
    Group("hc_stiffness", 1, "N/m^n", 2e5, 1e3, 1e7, "Hunt-Crossley k (object stiffness)"),
    Group("hc_exponent", 1, "1", 1.5, 1.0, 2.0, "Hunt-Crossley n (1.5: Hertz)"),
    Group("hc_damping", 1, "s/m", 0.5, 0.0, 20.0, "Hunt-Crossley lambda / k: F = k d^n (1 + (lambda/k) d')"),
    Group("mu_static", 1, "1", 0.8, 0.0, 2.0, "static friction coefficient pad/object"),
    Group("mu_kinetic", 1, "1", 0.6, 0.0, 2.0, "kinetic friction coefficient (<= mu_static)"),
    Group("slide_max", 1, "m", 0.02, 0.0, 0.1, "slide along the pads after which the object is lost"),
    Group("stick_speed", 1, "m/s", 1e-3, 1e-6, 0.1, "slide speed under which a sliding object sticks again"),
    Group("capture_radius", 1, "m", 0.01, 0.0, 0.05,
          "TCP-to-object distance within which closing fingers grasp a resting object"),
)


def _index(groups) -> dict[str, int]:
    return {g.name: i for i, g in enumerate(groups)}


# Group indices into the offset tables (compile-time constants for the kernels).
XI = _index(STATE_GROUPS)
UI = _index(INPUT_GROUPS)
YI = _index(OUTPUT_GROUPS)
PI = _index(PARAM_GROUPS)


class Layout:
    """Offsets of every group for a chain of nb joints; `off[name]` and `size[name]` per array."""

    def __init__(self, nb: int, tree=None):
        self.nb = nb
        self.tree = tree
        self.x = self._offsets(STATE_GROUPS)
        self.u = self._offsets(INPUT_GROUPS)
        self.y = self._offsets(OUTPUT_GROUPS)
        self.p = self._offsets(PARAM_GROUPS)

    def size(self, g: Group) -> int:
        return self.nb if g.size == NJ else int(g.size)

    def _offsets(self, groups) -> dict[str, tuple[int, int]]:
        out, o = {}, 0
        for g in groups:
            n = self.size(g)
            out[g.name] = (o, n)
            o += n
        out["__len__"] = (o, 0)
        return out

    def n(self, which: str) -> int:
        return getattr(self, which)["__len__"][0]

    def sl(self, which: str, name: str) -> slice:
        o, n = getattr(self, which)[name]
        return slice(o, o + n)

    def resolve(self, value, n: int) -> np.ndarray:
        """A group's nominal/bound as n floats: a number, a list, or a URDF field name."""
        if isinstance(value, str):
            sign = -1.0 if value.startswith("-") else 1.0
            field = {"effort": "effort_limit", "velocity": "velocity_limit"}.get(value.lstrip("-"), value.lstrip("-"))
            if self.tree is None:
                raise ValueError(f"{value!r} needs the URDF tree")
            return sign * np.asarray(getattr(self.tree, field), float).copy()
        arr = np.asarray(value, float)
        if arr.ndim == 0:
            return np.full(n, float(arr))
        if arr.size != n:
            raise ValueError(f"nominal of {n} elements expected, got {arr.size}")
        return arr.copy()

    def nominal(self, which: str) -> np.ndarray:
        groups = {"x": STATE_GROUPS, "u": INPUT_GROUPS, "y": OUTPUT_GROUPS, "p": PARAM_GROUPS}[which]
        out = np.zeros(self.n(which))
        for g in groups:
            out[self.sl(which, g.name)] = self.resolve(g.nominal, self.size(g))
        return out

    def bounds(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        groups = {"x": STATE_GROUPS, "u": INPUT_GROUPS, "y": OUTPUT_GROUPS, "p": PARAM_GROUPS}[which]
        lo, hi = np.zeros(self.n(which)), np.zeros(self.n(which))
        for g in groups:
            s = self.sl(which, g.name)
            lo[s] = self.resolve(g.low, self.size(g))
            hi[s] = self.resolve(g.high, self.size(g))
        return lo, hi

    def offsets(self, which: str) -> np.ndarray:
        """int64 offsets in group order: what the kernels index with."""
        groups = {"x": STATE_GROUPS, "u": INPUT_GROUPS, "y": OUTPUT_GROUPS, "p": PARAM_GROUPS}[which]
        return np.array([getattr(self, which)[g.name][0] for g in groups], dtype=np.int64)
