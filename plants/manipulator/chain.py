"""A kinematic chain with its work arrays: Python-side convenience around `dynamics`.

`Chain` owns the model table (from a URDF) and one `Workspace`; its methods call the Numba
kernels and never allocate per call except where they return a new array (the `*_new`
helpers used by tests). The real-time path calls the kernels directly (see `arm.py`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plants.manipulator import dynamics as dyn
from plants.manipulator.urdf import KinematicTree, read_urdf

_aba_buf = dyn.aba_buf
REPO_ROOT = Path(__file__).resolve().parents[2]
PANDA_URDF = REPO_ROOT / "configs" / "robots" / "panda.urdf"
#: The Panda's finger joints, locked (closed, 0 m) for the arm's rigid-body model; the
#: gripper's own motion is modelled by `grasp` (finger mass 2 x 0.015 kg, welded to the hand).
PANDA_LOCK = {"panda_finger_joint1": 0.0, "panda_finger_joint2": 0.0}
PANDA_TCP = "panda_hand_tcp"


def load_panda() -> KinematicTree:
    """The shipped Franka Panda: 7 revolute joints, fingers locked at 0 m."""
    return read_urdf(PANDA_URDF, lock=PANDA_LOCK)


class Chain:
    """Model arrays + work arrays of one chain; gravity (m/s^2, world) and armature (kg m^2)."""

    def __init__(self, tree: KinematicTree, armature: np.ndarray | None = None,
                 gravity: np.ndarray | None = None):
        self.tree = tree
        nb = tree.nb
        self.nb = nb
        # one buffer for `aba` from Python (dyn.aba_buf: [model_i | model_f | work]); model_i,
        # model_f and ws.buf (dyn.aba_packed's) and the named arrays are views into it, so
        # writing into chain.f_ext, chain.armature, ... is seen by every path
        self.buf = np.zeros(dyn.buffer_size(nb))
        self.model_i, self.model_f, work = dyn.carve_buffer(self.buf, nb)
        self.model_i[:nb] = tree.parent
        self.model_i[nb:] = tree.joint_type
        self.parent = self.model_i[:nb]
        self.jtype = self.model_i[nb:]
        m = dyn.carve(self.model_f, nb, dyn.MODEL_LAYOUT, dyn.MODEL_TAIL)
        self.E_tree, self.r_tree, self.inertia = m["E_tree"], m["r_tree"], m["inertia"]
        self.armature, self.f_ext, self.gravity = m["armature"], m["f_ext"], m["gravity"]
        self.E_tree[:] = tree.E_tree
        self.r_tree[:] = tree.r_tree
        self.inertia[:] = tree.inertia
        self.armature[:] = 0.0 if armature is None else np.asarray(armature, float)
        self.gravity[:] = dyn.GRAVITY if gravity is None else np.asarray(gravity, float)
        self.ws = dyn.Workspace(nb, work)
        self.T = self.ws.T
        self.tmp = self.ws.tmp
        self.fb = np.zeros((nb, 6))

    def aba(self, q, dq, tau, ddq, f_ext=None):
        """ddq = FD(q, dq, tau, f_ext) (rad/s^2 | m/s^2); f_ext None: this chain's `f_ext`."""
        if f_ext is None:  # the one-buffer call: 5 arguments, the same kernel
            _aba_buf(self.buf, q, dq, tau, ddq)
            return ddq
        w = self.ws
        dyn.aba(self.parent, self.jtype, self.E_tree, self.r_tree, self.inertia, self.armature,
                self.gravity, q, dq, tau, self.f_ext if f_ext is None else f_ext, ddq,
                w.E, w.r, w.v, w.c, w.pA, w.IA, w.U, w.D, w.u, w.acc, self.T, self.tmp)
        return ddq

    def aba_batch(self, Q, dQ, TAU, DDQ, f_ext=None):
        """DDQ[k] = FD(Q[k], dQ[k], TAU[k]) for N states, shape (N, nb), in one kernel call."""
        w = self.ws
        dyn.aba_batch(self.parent, self.jtype, self.E_tree, self.r_tree, self.inertia, self.armature,
                      self.gravity, Q, dQ, TAU, self.f_ext if f_ext is None else f_ext, DDQ,
                      w.E, w.r, w.v, w.c, w.pA, w.IA, w.U, w.D, w.u, w.acc, self.T, self.tmp)
        return DDQ

    def rnea(self, q, dq, ddq, tau, f_ext=None):
        w = self.ws
        dyn.rnea(self.parent, self.jtype, self.E_tree, self.r_tree, self.inertia, self.armature,
                 self.gravity, q, dq, ddq, self.f_ext if f_ext is None else f_ext, tau,
                 w.E, w.r, w.v, w.acc, self.fb, self.tmp)
        return tau

    def gravity_torque(self, q, tau):
        """tau = g(q) (N m): the joint torques that hold the chain still (RNEA, dq = ddq = 0)."""
        z = np.zeros(self.nb)
        return self.rnea(q, z, z, tau)

    def frame(self, link: str, q, pos, J):
        """World position (m) and 6 x nb Jacobian of link frame `link`'s origin."""
        body, _E, r = self.tree.frame(link)
        w = self.ws
        dyn.frame_kinematics(self.parent, self.jtype, self.E_tree, self.r_tree, q, body, r,
                             w.E, w.r, w.Rw, w.pw, pos, J)
        return pos, J

    def energy(self, q, dq):
        out = np.zeros(2)
        w = self.ws
        dyn.energy(self.parent, self.jtype, self.E_tree, self.r_tree, self.inertia, self.armature,
                   self.gravity, q, dq, w.E, w.r, w.v, w.Rw, w.pw, out)
        return out
