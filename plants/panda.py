"""The manipulator as a hil plant (`[plant] model = "panda"`): a serial arm read from a URDF
(default: the shipped Franka Panda, configs/robots/panda.urdf) stepped by the Numba kernels of
`plants/manipulator/` ("step" form of the plant contract, plants/base.py).

Disk cache: the cached kernels here compile `dynamics.aba` into themselves, and Numba's cache
checks only this file's stamp, not its callees' files: after a change to
`plants/manipulator/dynamics.py` (e.g. its fast-math flags), delete the stale entries
(`find . -name "*.nb[ic]" -delete`) or they keep the old ABA.

Spec (built from the URDF by `build`, from `plants.manipulator.layout` groups; SI units):
- states: `joint.q[7]` (rad), `joint.dq[7]` (rad/s), `joint.tau_motor[7]` (N m, current-loop
  state), `joint.vel_integral[7]` (rad), gripper width/speed, the object's slide, stick/slip
  mode, held/dropped flags, slip event count and position. Every piece of state (continuous
  or discrete) is in x: z and d are empty, so snapshot/restore is a copy of x and p.
- inputs: `control_mode` (0 torque, 1 position, 2 velocity), `joint.tau_target[7]` (N m, on
  top of the drive's gravity compensation), `joint.q_target[7]` (rad), `joint.dq_target[7]`
  (rad/s), `gripper.width_target` (m), `gripper.force_target` (N per finger).
- outputs: `joint.q[7]`, `joint.dq[7]`, `joint.tau_measured[7]` (link-side torque sensor),
  `joint.tau_command[7]` (what the drive asked its current loop), `gripper.width`,
  `gripper.force`, `contact.force` (Hunt-Crossley normal force per pad, N),
  `contact.tangential_load` (N), `contact.slip` (0/1), `object.held`, `object.dropped`,
  `ee.position[3]` (TCP, world, m), `object.position[3]` (m).
- params: the layout's drive, friction, gripper and object parameters (`joint.kp[7]`,
  `hc_stiffness`, `mu_static`, ...) and `link.mass_scale[7]`: each moving link's mass and
  rotational inertia scaled together (centre of mass kept), which keeps every link's spatial
  inertia physically consistent for any factor > 0 (`ArmModel.scale_links`'s route, applied
  inside the kernel from p, so it is part of the snapshot and randomizable per instance).
  Element names: `joint_3.q`, `link_2.mass_scale`, `ee.position.z`, `object.slide.x`.

Kernels: `step(t, x, z, d, u, p, dt, n_sub, mf0, mi, ints, mf, wf)` copies the model buffer
mf0 (data, shared) into mf (work) with the link inertias scaled by p, then runs `arm.step`
(semi-implicit Euler on the ABA, MAX_SUBSTEP = 0.25 ms: 4 sub-steps per 1 ms period);
`outputs` likewise. Nothing is allocated per call.

Randomization hook (`[gaps.randomize] plant_spread`): link mass scales, object stiffness and
damping (the deformable-grasp gap), object mass, friction (Coulomb and Stribeck scaled
together so breakaway >= Coulomb; viscous; mu_s and mu_k together so mu_k <= mu_s), each a
lognormal factor exp(spread N(0, 1)), clipped to the bounds.

Safety hooks (read by hil.safety through the plant module, no hil import here):
- `SAFETY_LIMITS`: state-dependent linear limits on a torque-mode command, rebuilt from the
  measured q, dq every step (`ee_box`, `joint_position`, `joint_velocity`; see `EnvelopeLimits`).
- `gravity_hook(model)`: g(q) (N m) for a fallback joint PD that compensates gravity itself.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
from numba import njit

from plants.base import PlantModel
from plants.panels import Panel
from plants.manipulator import arm
from plants.manipulator import dynamics as dyn
from plants.manipulator.chain import PANDA_LOCK, PANDA_TCP, PANDA_URDF
from plants.manipulator.layout import INPUT_GROUPS, NJ, OUTPUT_GROUPS, PARAM_GROUPS, STATE_GROUPS, Layout
from plants.manipulator.urdf import read_urdf
from plants.spec import Quantity, SpecBuilder

OPTIONS = {
    "urdf": "URDF file of the arm (default: configs/robots/panda.urdf, the Franka Panda)",
    "tcp": f"link whose origin is the grasp point (default {PANDA_TCP})",
    "lock": "joints welded at a position, {joint = value} (default: the Panda's two finger joints at 0 m)",
}
FILE_OPTIONS = ("urdf",)
MAX_SUBSTEP = arm.MAX_SUBSTEP

# layout group -> spec group name (a.b: per joint `a_<k>.b`; sizes 2/3: `<name>.<axis>`)
_STATE_NAMES = {"q": "joint.q", "dq": "joint.dq", "tau_motor": "joint.tau_motor",
                "vel_integral": "joint.vel_integral", "gripper_width": "gripper.width",
                "gripper_speed": "gripper.speed", "obj_slide": "object.slide",
                "obj_slide_speed": "object.slide_speed", "grasp_stuck": "grasp.stuck",
                "object_held": "object.held", "object_dropped": "object.dropped",
                "slip_events": "grasp.slip_events", "obj_position": "object.position"}
_INPUT_NAMES = {"control_mode": "control_mode", "tau_command": "joint.tau_target", "q_command": "joint.q_target",
                "dq_command": "joint.dq_target", "gripper_width_command": "gripper.width_target",
                "gripper_force_command": "gripper.force_target"}
_OUTPUT_NAMES = {"q": "joint.q", "dq": "joint.dq", "tau_measured": "joint.tau_measured",
                 "tau_command": "joint.tau_command", "gripper_width": "gripper.width",
                 "gripper_force": "gripper.force", "contact_force": "contact.force",
                 "tangential_load": "contact.tangential_load", "slip": "contact.slip",
                 "object_held": "object.held", "object_dropped": "object.dropped",
                 "ee_position": "ee.position", "object_position": "object.position"}
_AXES = {"obj_slide": ("x", "z"), "obj_slide_speed": ("x", "z")}
LINK_SCALE_BOUNDS = (0.5, 2.0)  # link.mass_scale bounds (a factor on mass and inertia)

# ints (data[2]): [nb, p offset of link.mass_scale, mf offset of the link inertias]
I_NB, I_PSCALE, I_INERTIA = range(3)


def _element_names(group: str, n: int, layout_name: str, per_joint: bool) -> list[str]:
    if per_joint:
        head, _, field = group.partition(".")
        return [f"{head}_{k + 1}.{field}" for k in range(n)]
    axes = _AXES.get(layout_name, ("x", "y", "z")[:n])
    return [f"{group}.{a}" for a in axes]


def _add_groups(b: SpecBuilder, kind: str, groups, names: dict | None, L: Layout) -> None:
    for g in groups:
        n = L.size(g)
        name = names[g.name] if names else g.name
        nominal = L.resolve(g.nominal, n)
        low = L.resolve(g.low, n)
        high = L.resolve(g.high, n)
        if g.size == NJ and names is None:
            name = f"joint.{g.name}"
        if g.size == 1:
            b.scalar(kind, Quantity(name, g.unit, float(nominal[0]), float(low[0]), float(high[0]), g.description))
        else:
            b.array(kind, name, _element_names(name, n, g.name, g.size == NJ), unit=g.unit, nominal=nominal,
                    low=low, high=high, description=g.description)


@njit(cache=True, nogil=True)
def _scaled_model(mf0, p, ints, mf):
    """mf = mf0 with body i's spatial inertia times p[link.mass_scale + i]."""
    for k in range(mf0.size):
        mf[k] = mf0[k]
    nb = ints[I_NB]
    ps = ints[I_PSCALE]
    io = ints[I_INERTIA]
    for i in range(nb):
        s = p[ps + i]
        for k in range(36):
            mf[io + 36 * i + k] = mf0[io + 36 * i + k] * s


@njit(cache=True, nogil=True)
def step(t, x, z, d, u, p, dt, n_sub, mf0, mi, ints, mf, wf):
    """Advance the arm by dt (s) in n_sub sub-steps (inputs held); returns t + dt."""
    _scaled_model(mf0, p, ints, mf)
    return arm.step(t, x, u, p, dt, n_sub, mf, mi, wf)


@njit(cache=True, nogil=True)
def outputs(x, z, d, u, p, y, mf0, mi, ints, mf, wf):
    """Write the true outputs y (see the module docstring) from the state."""
    _scaled_model(mf0, p, ints, mf)
    arm.outputs(x, u, p, y, mf, mi, wf)


def _factor(rng, spread: float) -> float:
    return math.exp(spread * rng.standard_normal())


def randomize(p, rng, spread, *, spec, lows, highs) -> None:
    """One physically consistent draw around the base values in p (relative spread, see the
    module docstring); every value clipped to its bounds."""
    def idx(name):
        return spec.indices("params", name)

    for i in idx("link.mass_scale"):
        p[i] *= _factor(rng, spread)
    for name in ("hc_stiffness", "hc_damping", "obj_mass"):
        p[idx(name)] *= _factor(rng, spread)
    f = _factor(rng, spread)
    p[idx("mu_static")] *= f
    p[idx("mu_kinetic")] *= f
    for c, s, v in zip(idx("joint.coulomb"), idx("joint.stribeck"), idx("joint.viscous")):
        f = _factor(rng, spread)
        p[c] *= f
        p[s] *= f
        p[v] *= _factor(rng, spread)
    np.clip(p, lows, highs, out=p)
    mk, ms = idx("mu_kinetic"), idx("mu_static")
    p[mk] = np.minimum(p[mk], p[ms])
    c, s = idx("joint.coulomb"), idx("joint.stribeck")
    p[s] = np.maximum(p[s], p[c])


def _model_parts(options: dict):
    path = Path(str(options.get("urdf", PANDA_URDF)))
    if not path.is_file():
        raise ValueError(f"urdf: no file {path}")
    lock = options.get("lock", PANDA_LOCK)
    if not isinstance(lock, dict) or not all(isinstance(v, (int, float)) for v in lock.values()):
        raise ValueError(f"lock: expected a table joint = position, got {lock!r}")
    tree = read_urdf(path, lock={str(k): float(v) for k, v in lock.items()})
    tcp = str(options.get("tcp", PANDA_TCP))
    try:
        return tree, arm.ArmModel(tree, tcp)
    except KeyError as exc:
        raise ValueError(f"tcp: {exc.args[0]}") from None


def build(options: dict) -> PlantModel:
    """The arm of the `urdf` option as a PlantModel (see the module docstring)."""
    tree, am = _model_parts(options)
    L = am.layout
    nb = tree.nb
    b = SpecBuilder(f"arm_{tree.name}" if tree.name else "arm", f"{nb}-joint arm from {Path(str(options.get('urdf', PANDA_URDF))).name}")
    _add_groups(b, "states", STATE_GROUPS, _STATE_NAMES, L)
    _add_groups(b, "inputs", INPUT_GROUPS, _INPUT_NAMES, L)
    _add_groups(b, "outputs", OUTPUT_GROUPS, _OUTPUT_NAMES, L)
    _add_groups(b, "params", PARAM_GROUPS, None, L)
    p_scale = b.start("params")
    b.array("params", "link.mass_scale", [f"link_{k + 1}.mass_scale" for k in range(nb)], unit="1", nominal=1.0,
            low=LINK_SCALE_BOUNDS[0], high=LINK_SCALE_BOUNDS[1],
            description="factor on the link's mass and rotational inertia together (centre of mass kept)")
    assert b.start("states") == L.n("x") and b.start("outputs") == L.n("y") and p_scale == L.n("p")
    proto = b.build()
    hook = functools.partial(randomize, spec=proto, lows=proto.lows("params"), highs=proto.highs("params"))
    spec = b.build(randomize=hook)
    ints = np.array([nb, p_scale, 12 * nb], dtype=np.int64)
    return PlantModel(spec=spec, form="step", step=step, outputs=outputs, max_substep=MAX_SUBSTEP,
                      default_substeps=1, time_unit_s=1.0, data=(am.mf.copy(), am.mi.copy(), ints),
                      work=(am.mf.copy(), am.wf.copy()), panels=PANELS)


# the dashboard's default panels (plants/panels.py): joint positions, end-effector position
PANELS = (
    Panel("Joint positions (rad)", ("joint.q",)),
    Panel("End-effector position (m)", ("ee.position",)),
    Panel("Joint torques (N m)", ("joint.tau_measured",)),
)


# ---------------------------------------------------------------------------------------
# Safety hooks: linear limits on a torque command, rebuilt every step from the measured state
# ---------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def envelope_views(mf, mi, wf):
    """The arrays `envelope_terms_at` works on, as views of the model buffers mf, mi and the work
    buffer wf (no copy): (parent, jtype, E_tree, r_tree, inertia0, tcp body as a 1-element view,
    tcp_r) and (E, r, v, c, pA, IA, U, D, uu, acc, T, tmp, f_ext, tau, Rw, pw). Carved once by a
    caller that evaluates the terms every step (the shield's compiled fill): carving the ~25
    views per call costs more than a third of the terms themselves (~1.5 us of ~5)."""
    model = arm.model_views(mf, mi)
    work, _ = arm.work_views(wf, mi[0])
    parent, jtype, E_tree, r_tree, inertia0, gravity, tcp_E, tcp_r, ints, xo, uo, po = model
    mv = (parent, jtype, E_tree, r_tree, inertia0, ints[1:2], tcp_r)
    wv = (work[0], work[1], work[2], work[3], work[4], work[5], work[6], work[7], work[8], work[9], work[10],
          work[11], work[14], work[16], work[20], work[21])
    return mv, wv


@njit(cache=True, nogil=True)
def envelope_terms_at(q, dq, mv, wv, armature, g0, pos, J, Minv, ddq0):
    """`envelope_terms` on views carved once by `envelope_views` (the same arithmetic)."""
    parent, jtype, E_tree, r_tree, inertia0, tcp_body, tcp_r = mv
    E, r, v, c, pA, IA, U, D, uu, acc, T, tmp, f_ext, tau, Rw, pw = wv
    nb = q.size
    dyn.frame_kinematics(parent, jtype, E_tree, r_tree, q, tcp_body[0], tcp_r, E, r, Rw, pw, pos, J)
    for i in range(nb):
        tau[i] = 0.0
        for k in range(6):
            f_ext[i, k] = 0.0
    dyn.aba(parent, jtype, E_tree, r_tree, inertia0, armature, g0, q, dq, tau, f_ext, ddq0,
            E, r, v, c, pA, IA, U, D, uu, acc, T, tmp)
    # Minv from the articulated-body quantities that ABA just left at this q (U, D, E, r)
    dyn.minv_after_aba(parent, jtype, E, r, U, D, pA, acc, tmp, Minv)


@njit(cache=True, nogil=True)
def envelope_terms(q, dq, mf, mi, wf, armature, g0, pos, J, Minv, ddq0):
    """At (q, dq): TCP position pos (m), its 6 x nb Jacobian J, the inverse joint-space inertia
    Minv (armature included) and the drift acceleration ddq0 = FD(q, dq, tau = 0) without
    gravity (the drive compensates it in every mode): in torque mode with a gravity-
    compensating drive, ddq ~ ddq0 + Minv tau_target (friction and the current-loop lag left
    out). Uses the work buffer wf as scratch. One ABA (ddq0) and its column passes for Minv
    (`dynamics.minv_after_aba`); checked against Pinocchio (tests/plants/test_panda_envelope.py)."""
    mv, wv = envelope_views(mf, mi, wf)
    envelope_terms_at(q, dq, mv, wv, armature, g0, pos, J, Minv, ddq0)


class _Envelope:
    """The dynamics terms at the last measured (q, dq), shared by the limit families of one
    safety process (computed once per observation whatever the number of families)."""

    def __init__(self, model: PlantModel):
        spec = model.spec
        self.mf0, self.mi, _ = model.data
        self.wf = model.work[1].copy()
        self.nb = int(self.mi[0])
        self.iq = spec.indices("outputs", "joint.q")
        self.idq = spec.indices("outputs", "joint.dq")
        p = spec.nominal("params")
        g = spec.indices("params", "joint.gear_ratio")
        r = spec.indices("params", "joint.rotor_inertia")
        self.armature = p[r] * p[g] ** 2
        self.g0 = np.zeros(3)
        nb = self.nb
        self.pos, self.J = np.zeros(3), np.zeros((6, nb))
        self.Minv, self.ddq0 = np.zeros((nb, nb)), np.zeros(nb)
        self.q, self.dq = np.full(nb, np.nan), np.full(nb, np.nan)

    def update(self, y: np.ndarray) -> None:
        q, dq = y[self.iq], y[self.idq]
        if np.array_equal(q, self.q) and np.array_equal(dq, self.dq):
            return
        self.q[:], self.dq[:] = q, dq
        envelope_terms(self.q, self.dq, self.mf0, self.mi, self.wf, self.armature, self.g0, self.pos, self.J,
                       self.Minv, self.ddq0)


_ENVELOPES: dict[int, _Envelope] = {}


def _num_list(options: dict, key: str, n: int, default=None) -> np.ndarray:
    v = options.get(key, default)
    if v is None:
        raise ValueError(f"{key}: required ({n} numbers)")
    a = np.asarray(v, dtype=float) if not isinstance(v, (int, float)) else np.full(n, float(v))
    if a.shape != (n,) or not np.isfinite(a).all():
        raise ValueError(f"{key}: expected {n} finite numbers, got {v!r}")
    return a


class EnvelopeLimits:
    """State-dependent linear limits `W a <= b` on a torque-mode action (the `joint.tau_target`
    elements among the actions, N m), rebuilt from the measured joint state each step.

    The prediction over a horizon T of a quantity h(q) with rate J_h dq, using
    ddq = ddq0 + Minv tau (`envelope_terms`):
        h(t + T) ~ h + T J_h dq + T^2 / 2 J_h (ddq0 + Minv tau)  <=  h_max
    i.e. the discrete form of the second-order barrier  h'' + (2/T) h' + (2/T^2) (h - h_max) <= 0:
    approaching the limit at speed v leaves a margin of v T, so the command must brake in
    time; the curvature term Jdot dq is left out (second order in dq; keep T short).
    Kinds (options):
      ee_box          low, high: [x, y, z] (m, world) for the TCP; horizon_s (default 0.1)
      joint_position  low, high: 7 values (rad; default the URDF limits shrunk by margin_rad,
                      default 0.05); horizon_s (default 0.1)
      joint_velocity  max: 7 values (rad/s, default 0.9 x the URDF limits); horizon_s
                      (default 0.02): dq + T ddq within +-max
    Rows are in the order low/high per element; `reads` are the outputs they use (q, dq): a
    Bad one makes the rows unknown (the wrapper then fails closed).
    """

    def __init__(self, kind: str, model: PlantModel, action_names, options: dict):
        spec = model.spec
        known = {"ee_box": ("low", "high", "horizon_s"), "joint_position": ("low", "high", "margin_rad", "horizon_s"),
                 "joint_velocity": ("max", "horizon_s")}[kind]
        extra = sorted(set(options) - set(known))
        if extra:
            raise ValueError(f"{extra[0]}: not an option of {kind} (options: {', '.join(known)})")
        self.kind = kind
        key = id(model)
        self.env = _ENVELOPES.get(key) or _ENVELOPES.setdefault(key, _Envelope(model))
        nb = self.env.nb
        tau_names = spec.expand("inputs", "joint.tau_target")
        self.cols = np.array([list(action_names).index(n) if n in action_names else -1 for n in tau_names])
        if (self.cols < 0).all():
            raise ValueError("actions: none of joint.tau_target is an action input (these limits act on a "
                             "torque-mode command)")
        self.n_actions = len(action_names)
        self.reads = np.concatenate([self.env.iq, self.env.idq])
        default_T = {"ee_box": 0.1, "joint_position": 0.1, "joint_velocity": 0.02}[kind]
        self.T = float(options.get("horizon_s", default_T))
        if not (math.isfinite(self.T) and self.T > 0):
            raise ValueError(f"horizon_s: {self.T} is not a positive duration")
        if kind == "ee_box":
            self.lo, self.hi = _num_list(options, "low", 3), _num_list(options, "high", 3)
        elif kind == "joint_position":
            m = float(options.get("margin_rad", 0.05))
            ql = spec.lows("inputs")[spec.indices("inputs", "joint.q_target")]
            qh = spec.highs("inputs")[spec.indices("inputs", "joint.q_target")]
            self.lo = _num_list(options, "low", nb, ql + m)
            self.hi = _num_list(options, "high", nb, qh - m)
        else:
            vmax = spec.highs("inputs")[spec.indices("inputs", "joint.dq_target")]
            self.hi = _num_list(options, "max", nb, 0.9 * vmax)
            if not (self.hi > 0).all():
                raise ValueError("max: every joint's velocity limit must be > 0")
            self.lo = -self.hi
        if not (self.lo < self.hi).all():
            raise ValueError(f"low, high: low must be below high ({self.lo} vs {self.hi})")
        self.m = 2 * self.lo.size
        self._ok = self.cols >= 0
        self._cols = self.cols[self._ok]

    def fill(self, y: np.ndarray, u: np.ndarray, W: np.ndarray, b: np.ndarray) -> None:
        """Write this family's rows: W (m, n_actions) and b (m,), plant units."""
        env = self.env
        env.update(y)
        T = self.T
        if self.kind == "ee_box":
            Jl = env.J[3:]
            h = env.pos + T * (Jl @ env.dq) + 0.5 * T * T * (Jl @ env.ddq0)
            G = 0.5 * T * T * (Jl @ env.Minv)
        elif self.kind == "joint_position":
            h = env.q + T * env.dq + 0.5 * T * T * env.ddq0
            G = 0.5 * T * T * env.Minv
        else:
            h = env.dq + T * env.ddq0
            G = T * env.Minv
        W[:] = 0.0
        ok, cols = self._ok, self._cols
        Gs = G[:, ok]
        W[0::2, cols] = -Gs
        W[1::2, cols] = Gs
        b[0::2] = h - self.lo
        b[1::2] = self.hi - h


KIND_CODES = {"ee_box": 0, "joint_position": 1, "joint_velocity": 2}


@njit(cache=True, nogil=True)
def fill_envelope_rows(y, W, b, iq, idq, mv, wv, armature, g0, pos, J, Minv, ddq0, q, dq,
                       kinds, horizons, lows, highs, cols):
    """The compiled form of `EnvelopeLimits.fill` for several families at once (the in-loop
    shield, hil/loop/shield.py): the envelope terms once at the measured (q, dq), then family f
    (kinds[f]: 0 ee_box, 1 joint_position, 2 joint_velocity; horizon horizons[f] s; limits
    lows[f, :e], highs[f, :e], e = 3 or nb) writes its 2 e rows, low/high per element, after
    the previous family's. W: (rows, n_actions), b: (rows,), plant units (N m in, m, rad, rad/s
    out); cols[j]: the action column of joint j's torque, -1 if not an action. Allocates
    nothing; the same arithmetic as the numpy form (tested to 1e-12). mv, wv: the model and
    work views of `envelope_views`, carved once when the fill is made (`compiled_limits`)."""
    nb = iq.size
    for j in range(nb):
        q[j] = y[iq[j]]
        dq[j] = y[idq[j]]
    envelope_terms_at(q, dq, mv, wv, armature, g0, pos, J, Minv, ddq0)
    for r in range(W.shape[0]):
        for c in range(W.shape[1]):
            W[r, c] = 0.0
    r0 = 0
    for f in range(kinds.size):
        T = horizons[f]
        kind = kinds[f]
        e = 3 if kind == 0 else nb
        for i in range(e):
            if kind == 0:
                h = pos[i]
                jd = 0.0
                jq = 0.0
                for j in range(nb):
                    jd += J[3 + i, j] * dq[j]
                    jq += J[3 + i, j] * ddq0[j]
                h = h + T * jd + 0.5 * T * T * jq
            elif kind == 1:
                h = q[i] + T * dq[i] + 0.5 * T * T * ddq0[i]
            else:
                h = dq[i] + T * ddq0[i]
            for j in range(nb):
                c = cols[j]
                if c < 0:
                    continue
                if kind == 0:
                    g = 0.0
                    for l in range(nb):
                        g += J[3 + i, l] * Minv[l, j]
                    g *= 0.5 * T * T
                elif kind == 1:
                    g = 0.5 * T * T * Minv[i, j]
                else:
                    g = T * Minv[i, j]
                W[r0 + 2 * i, c] = -g
                W[r0 + 2 * i + 1, c] = g
            b[r0 + 2 * i] = h - lows[f, i]
            b[r0 + 2 * i + 1] = highs[f, i] - h
        r0 += 2 * e


def compiled_limits(families):
    """(kernel, args) filling the rows of these EnvelopeLimits families (one model) in one call:
    kernel(y, W, b, *args) (see fill_envelope_rows). The in-loop shield's form of
    SAFETY_LIMITS; ValueError if the families do not share a model and actions."""
    fams = list(families)
    env = fams[0].env
    if any(f.env is not env or not np.array_equal(f.cols, fams[0].cols) for f in fams):
        raise ValueError("compiled limits: families of one model and one action list only")
    nb = env.nb
    lows = np.zeros((len(fams), nb))
    highs = np.zeros((len(fams), nb))
    for i, f in enumerate(fams):
        lows[i, :f.lo.size], highs[i, :f.hi.size] = f.lo, f.hi
    kinds = np.array([KIND_CODES[f.kind] for f in fams], dtype=np.int64)
    horizons = np.array([f.T for f in fams])
    mv, wv = envelope_views(env.mf0, env.mi, env.wf.copy())  # views keep their buffers alive
    args = (env.iq.astype(np.int64), env.idq.astype(np.int64), mv, wv, env.armature,
            env.g0, np.zeros(3), np.zeros((6, nb)), np.zeros((nb, nb)), np.zeros(nb), np.zeros(nb), np.zeros(nb),
            kinds, horizons, lows, highs, fams[0].cols.astype(np.int64))
    return fill_envelope_rows, args


SAFETY_LIMITS_COMPILED = compiled_limits

SAFETY_LIMITS = {kind: (lambda kind: lambda model, actions, options: EnvelopeLimits(kind, model, actions, options))(kind)
                 for kind in ("ee_box", "joint_position", "joint_velocity")}


def gravity_hook(model: PlantModel):
    """A function y -> g(q) (N m, per joint, nominal links) from the measured outputs: the
    gravity compensation of a fallback joint PD, for a drive that does not add it."""
    mf0, mi, _ = model.data
    wf = model.work[1].copy()
    iq = model.spec.indices("outputs", "joint.q")
    q = np.zeros(iq.size)
    out = np.zeros(iq.size)

    def g(y: np.ndarray) -> np.ndarray:
        q[:] = y[iq]
        arm.gravity_torque(q, mf0, mi, wf, out)
        return out.copy()

    return g
