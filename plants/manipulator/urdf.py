"""URDF reader: a serial/tree chain as flat arrays for the Numba kernels.

Reads a URDF with `xml.etree` (revolute, continuous, prismatic and fixed joints; joint
origins `xyz`/`rpy`; joint axes; link inertials with their own origin) and produces a
`KinematicTree`: one row per moving joint ("body"), in an order where every parent comes
before its children. Units are the URDF's: metres, radians, kilograms, kg m^2.

What the reader does to the file's tree, and why:
- **Fixed joints are merged.** A link attached by a fixed joint (or by a joint listed in
  `lock`, e.g. the Panda's two finger joints, held at a given position) is welded to its
  parent: its inertia is added to the parent body's spatial inertia and its children are
  re-attached with the composed transform. Pinocchio's `buildModelFromUrdf` merges fixed
  links the same way, and `buildReducedModel` locks joints the same way, so the two models
  are the same rigid-body system.
- **Every joint axis becomes the local z axis.** A joint with unit axis `a` gets its body
  frame rotated by `R_a` (with `R_a e_z = a`); the tree transform, the inertia and the
  children's origins are re-expressed in that frame. Joint kinematics do not change
  (`R(a, q) = R_a R_z(q) R_a^T`), and the kernels then only need the motion subspace
  `S = e_z` (revolute, angular z) or `S = e_z` linear (prismatic), which saves a 6-vector
  product per joint in every pass.
- **Named frames** (every link, including the merged ones) are kept as (body, rotation,
  translation) so the end effector (`panda_hand_tcp`) resolves to a fixed offset on body 6.

Spatial conventions (Featherstone, *Rigid Body Dynamics Algorithms*, 2008): motion vectors
are [angular; linear], the Plücker transform from frame A to frame B whose origin sits at
`r` (A coordinates) with `v_B = E v_A` is `X = [[E, 0], [-E r^, E]]`.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REVOLUTE = 0
PRISMATIC = 1


class URDFError(ValueError):
    """A URDF the reader cannot turn into a chain; the message names the element."""


@dataclass(frozen=True)
class KinematicTree:
    """A URDF's moving joints as arrays, parents first.

    parent[i]: index of body i's parent body, -1 for the fixed base.
    joint_type[i]: REVOLUTE (0) or PRISMATIC (1); the joint acts about/along local z.
    E_tree[i], r_tree[i]: the joint's fixed placement in the parent body's frame as a
        Plücker transform (rotation E with v_child = E v_parent, origin r in parent
        coordinates, m).
    inertia[i]: 6x6 spatial inertia of body i (all links welded to it) about body i's origin,
        in body coordinates (kg, kg m, kg m^2).
    mass[i], com[i], inertia_com[i]: the same as mass (kg), centre of mass (m, body frame) and
        rotational inertia about the centre of mass (kg m^2, body frame).
    q_lower, q_upper (rad or m), velocity_limit (rad/s or m/s), effort_limit (N m or N):
        from the URDF `<limit>`; +-inf where absent.
    frames: link name -> (body index, E (3x3), r (3,)): the link frame's placement on its
        body (body -1 is the base).
    """

    name: str
    joint_names: tuple[str, ...]
    parent: np.ndarray
    joint_type: np.ndarray
    E_tree: np.ndarray
    r_tree: np.ndarray
    inertia: np.ndarray
    mass: np.ndarray
    com: np.ndarray
    inertia_com: np.ndarray
    q_lower: np.ndarray
    q_upper: np.ndarray
    velocity_limit: np.ndarray
    effort_limit: np.ndarray
    frames: dict = field(default_factory=dict)
    base_mass: float = 0.0

    @property
    def nb(self) -> int:
        return int(self.parent.size)

    def frame(self, link: str) -> tuple[int, np.ndarray, np.ndarray]:
        """(body, E, r) of a link frame; KeyError naming the known links."""
        try:
            return self.frames[link]
        except KeyError:
            raise KeyError(f"no link {link!r} in {self.name} (links: {', '.join(sorted(self.frames))})") from None


def rpy_matrix(roll: float, pitch: float, yaw: float) -> np.ndarray:
    """URDF fixed-axis roll-pitch-yaw: R = Rz(yaw) Ry(pitch) Rx(roll)."""
    cr, sr = math.cos(roll), math.sin(roll)
    cp, sp = math.cos(pitch), math.sin(pitch)
    cy, sy = math.cos(yaw), math.sin(yaw)
    return np.array([
        [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
        [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
        [-sp, cp * sr, cp * cr],
    ])


def axis_to_z(axis: np.ndarray) -> np.ndarray:
    """A rotation R_a with R_a e_z = axis (unit); identity when the axis already is z."""
    a = axis / np.linalg.norm(axis)
    z = np.array([0.0, 0.0, 1.0])
    c = float(a @ z)
    if c > 1.0 - 1e-15:
        return np.eye(3)
    if c < -1.0 + 1e-15:
        return np.diag([1.0, -1.0, -1.0])  # half turn about x
    v = np.cross(z, a)
    s = np.linalg.norm(v)
    k = v / s
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + s * K + (1.0 - c) * (K @ K)


def skew(v: np.ndarray) -> np.ndarray:
    return np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])


def spatial_inertia(mass: float, com: np.ndarray, inertia_com: np.ndarray) -> np.ndarray:
    """6x6 spatial inertia about the frame origin: [[Ic + m c^ c^T, m c^], [m c^T, m 1]]."""
    C = skew(com)
    out = np.zeros((6, 6))
    out[:3, :3] = inertia_com + mass * C @ C.T
    out[:3, 3:] = mass * C
    out[3:, :3] = mass * C.T
    out[3:, 3:] = mass * np.eye(3)
    return out


def _floats(text: str | None, n: int, where: str, default: float = 0.0) -> np.ndarray:
    if text is None:
        return np.full(n, default)
    parts = text.split()
    if len(parts) != n:
        raise URDFError(f"{where}: expected {n} numbers, got {text!r}")
    try:
        return np.array([float(p) for p in parts])
    except ValueError:
        raise URDFError(f"{where}: not numbers: {text!r}") from None


def _origin(el: ET.Element | None, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(R, p) of an <origin>: child-frame axes R and position p in the parent frame."""
    if el is None:
        return np.eye(3), np.zeros(3)
    rpy = _floats(el.get("rpy"), 3, f"{where}.origin.rpy")
    xyz = _floats(el.get("xyz"), 3, f"{where}.origin.xyz")
    return rpy_matrix(*rpy), xyz


def _link_inertial(link: ET.Element) -> tuple[float, np.ndarray, np.ndarray]:
    """(mass, com, inertia about com) in the link frame; zeros for a link without inertial."""
    name = link.get("name")
    inertial = link.find("inertial")
    if inertial is None:
        return 0.0, np.zeros(3), np.zeros((3, 3))
    R, c = _origin(inertial.find("origin"), f"link[{name}].inertial")
    mass_el = inertial.find("mass")
    mass = float(mass_el.get("value", "0")) if mass_el is not None else 0.0
    if not (mass >= 0.0 and math.isfinite(mass)):
        raise URDFError(f"link[{name}].inertial.mass: {mass} is not a mass >= 0")
    I = np.zeros((3, 3))
    iel = inertial.find("inertia")
    if iel is not None:
        g = {k: float(iel.get(k, "0")) for k in ("ixx", "ixy", "ixz", "iyy", "iyz", "izz")}
        I = np.array([[g["ixx"], g["ixy"], g["ixz"]],
                      [g["ixy"], g["iyy"], g["iyz"]],
                      [g["ixz"], g["iyz"], g["izz"]]])
    return mass, c, R @ I @ R.T


def _combine(m1, c1, I1, m2, c2, I2):
    """Two rigid bodies (mass, com, inertia about com, same frame) as one."""
    m = m1 + m2
    if m == 0.0:
        return 0.0, np.zeros(3), np.zeros((3, 3))
    c = (m1 * c1 + m2 * c2) / m
    d1, d2 = c1 - c, c2 - c
    I = I1 + I2 + m1 * (d1 @ d1 * np.eye(3) - np.outer(d1, d1)) + m2 * (d2 @ d2 * np.eye(3) - np.outer(d2, d2))
    return m, c, I


def _axis(j: ET.Element, jn: str, source: str) -> np.ndarray:
    """Unit joint axis (URDF default x when <axis> is absent)."""
    el = j.find("axis")
    axis = _floats(el.get("xyz"), 3, f"joint[{jn}].axis") if el is not None else np.array([1.0, 0.0, 0.0])
    n = float(np.linalg.norm(axis))
    if not n > 0:
        raise URDFError(f"{source}: joint[{jn}].axis is zero")
    return axis / n


def read_urdf(path: str | Path, lock: dict[str, float] | None = None) -> KinematicTree:
    """Read a URDF file into a KinematicTree.

    lock: joint name -> position (rad or m) at which that joint is held fixed (a mimic
    joint's followers are not implied: list each). Unknown names raise URDFError.
    """
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise URDFError(f"{path}: cannot read URDF ({exc})") from None
    return parse_urdf(root, lock, source=str(path))


def parse_urdf(root: ET.Element, lock: dict[str, float] | None = None, source: str = "urdf") -> KinematicTree:
    """KinematicTree from a parsed <robot> element (see `read_urdf`)."""
    lock = dict(lock or {})
    links = {l.get("name"): l for l in root.findall("link")}
    joints = root.findall("joint")
    by_parent: dict[str, list[ET.Element]] = {}
    children = set()
    names = set()
    for j in joints:
        jn = j.get("name")
        names.add(jn)
        p, c = j.find("parent"), j.find("child")
        if p is None or c is None:
            raise URDFError(f"{source}: joint[{jn}] lacks parent or child")
        pl, cl = p.get("link"), c.get("link")
        for ln in (pl, cl):
            if ln not in links:
                raise URDFError(f"{source}: joint[{jn}] refers to unknown link {ln!r}")
        if cl in children:
            raise URDFError(f"{source}: link {cl!r} has two parent joints (not a tree)")
        children.add(cl)
        by_parent.setdefault(pl, []).append(j)
    unknown = set(lock) - names
    if unknown:
        raise URDFError(f"{source}: lock names unknown joint(s) {sorted(unknown)}")
    roots = [n for n in links if n not in children]
    if len(roots) != 1:
        raise URDFError(f"{source}: expected one root link, found {roots}")

    parent: list[int] = []
    jtype: list[int] = []
    E_tree: list[np.ndarray] = []
    r_tree: list[np.ndarray] = []
    body_mci: list[list] = []  # per body: [mass, com, Icom] in body frame
    qlo, qhi, vlim, elim, jnames = [], [], [], [], []
    frames: dict[str, tuple[int, np.ndarray, np.ndarray]] = {}
    base = [0.0, np.zeros(3), np.zeros((3, 3))]

    def weld(body: int, R: np.ndarray, p: np.ndarray, link: ET.Element) -> None:
        """Add `link` (its frame at (R, p) in body coordinates) to body's inertia."""
        m, c, I = _link_inertial(link)
        if m == 0.0:
            return
        target = base if body < 0 else body_mci[body]
        target[:] = _combine(target[0], target[1], target[2], m, R @ c + p, R @ I @ R.T)

    # Depth-first from the root; (body, R, p): the link frame's axes and origin in the body frame.
    stack = [(roots[0], -1, np.eye(3), np.zeros(3))]
    while stack:
        link_name, body, R, p = stack.pop()
        frames[link_name] = (body, R.T.copy(), p.copy())  # E = R^T maps body coords to link coords
        weld(body, R, p, links[link_name])
        for j in reversed(by_parent.get(link_name, [])):
            jn = j.get("name")
            kind = j.get("type")
            child = j.find("child").get("link")
            Ro, po = _origin(j.find("origin"), f"joint[{jn}]")
            R_joint = R @ Ro            # joint frame axes in body coordinates
            p_joint = R @ po + p        # joint frame origin in body coordinates
            if kind == "fixed" or jn in lock:
                if kind not in ("fixed", "revolute", "continuous", "prismatic"):
                    raise URDFError(f"{source}: joint[{jn}]: type {kind!r} not supported")
                if kind != "fixed":
                    axis = _axis(j, jn, source)
                    ql = float(lock[jn])
                    if kind == "prismatic":
                        p_joint = p_joint + R_joint @ (axis * ql)
                    else:
                        K = skew(axis)
                        R_joint = R_joint @ (np.eye(3) + math.sin(ql) * K + (1 - math.cos(ql)) * K @ K)
                stack.append((child, body, R_joint, p_joint))
                continue
            if kind not in ("revolute", "continuous", "prismatic"):
                raise URDFError(f"{source}: joint[{jn}]: type {kind!r} not supported "
                                "(revolute, continuous, prismatic, fixed)")
            axis = _axis(j, jn, source)
            Ra = axis_to_z(axis)
            R_body = R_joint @ Ra      # new body frame axes in the parent body's coordinates
            idx = len(parent)
            parent.append(body)
            jtype.append(PRISMATIC if kind == "prismatic" else REVOLUTE)
            E_tree.append(R_body.T.copy())
            r_tree.append(p_joint.copy())
            body_mci.append([0.0, np.zeros(3), np.zeros((3, 3))])
            lim = j.find("limit")
            if kind == "continuous" or lim is None:
                lo, hi = -math.inf, math.inf
            else:
                lo, hi = float(lim.get("lower", "-inf")), float(lim.get("upper", "inf"))
            qlo.append(lo)
            qhi.append(hi)
            vlim.append(float(lim.get("velocity", "inf")) if lim is not None else math.inf)
            elim.append(float(lim.get("effort", "inf")) if lim is not None else math.inf)
            jnames.append(jn)
            # The child link's frame in the new body frame: axes Ra^T, origin 0.
            stack.append((child, idx, Ra.T.copy(), np.zeros(3)))

    nb = len(parent)
    if nb == 0:
        raise URDFError(f"{source}: no moving joint")
    inertia = np.zeros((nb, 6, 6))
    mass = np.zeros(nb)
    com = np.zeros((nb, 3))
    icom = np.zeros((nb, 3, 3))
    for i, (m, c, I) in enumerate(body_mci):
        mass[i], com[i], icom[i] = m, c, I
        inertia[i] = spatial_inertia(m, c, I)
    return KinematicTree(
        name=root.get("name", "robot"), joint_names=tuple(jnames),
        parent=np.array(parent, dtype=np.int64), joint_type=np.array(jtype, dtype=np.int64),
        E_tree=np.array(E_tree), r_tree=np.array(r_tree), inertia=inertia, mass=mass, com=com,
        inertia_com=icom, q_lower=np.array(qlo), q_upper=np.array(qhi),
        velocity_limit=np.array(vlim), effort_limit=np.array(elim), frames=frames,
        base_mass=float(base[0]),
    )
