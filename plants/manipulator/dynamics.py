"""Rigid-body dynamics of a kinematic tree as Numba kernels over preallocated arrays.

Kernels (all `@njit(cache=True, nogil=True)`, float64, SI units, nothing allocated per call):
- `aba`: forward dynamics, ddq = FD(q, dq, tau, f_ext), by the articulated-body algorithm
  (Featherstone 2008, Table 7.1), with a per-joint armature (reflected rotor inertia) added
  to the joint-space inertia diagonal; `aba_batch` runs it over N states in one call.
- `rnea`: inverse dynamics tau = ID(q, dq, ddq) (Table 5.1); `gravity_torque` is
  rnea(q, 0, 0), the gravity compensation of a fallback PD controller.
- `frame_kinematics`: world position of a point on a body and its 6 x nv geometric Jacobian
  (angular rows 0-2, linear rows 3-5, world coordinates), for a Cartesian workspace box
  linearised each step.
- `energy`: kinetic and potential energy (J), for the integrator's energy-drift check.

The model is the flat table of `urdf.KinematicTree` (bodies parents first, every joint about
or along its local z axis, so the motion subspace S is a unit vector: index 2 for revolute,
5 for prismatic). Spatial vectors are [angular; linear]; `X = [[E, 0], [-E r^, E]]` maps
parent to body coordinates (E: rotation parent -> body; r: body origin in parent
coordinates). Gravity enters as a fictitious base acceleration a_0 = -g (so body
accelerations returned in `acc` include -g: a point's `acc` linear part is a - g).

Work arrays (from `Workspace`): E (nb,3,3), r (nb,3), v, c, pA, U, acc (nb,6), IA (nb,6,6),
D, u (nb). A readable version of the algorithm, in the same notation:

    for i:  X_i = XJ(q_i) XT_i;  v_i = X_i v_p + S dq_i;  c_i = v_i x (S dq_i)
            IA_i = I_i;  pA_i = v_i x* I_i v_i - f_ext_i
    for i reversed:  U = IA_i S;  D = S^T U + armature_i;  u = tau_i - S^T pA_i
            Ia = IA_i - U U^T / D;  pa = pA_i + Ia c_i + U u / D
            IA_p += X_i^T Ia X_i;  pA_p += X_i^T pa
    for i:  a' = X_i a_p + c_i;  ddq_i = (u_i - U^T a') / D_i;  a_i = a' + S ddq_i
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit, types
from numba.core.extending import intrinsic

GRAVITY = np.array([0.0, 0.0, -9.81])  # m/s^2, world frame (Pinocchio's default)


#: Packed layouts for `aba_packed` (one call with 7 arguments instead of 24: from Python, a
#: Numba call pays per argument). Per body, in this order; then the per-chain tail.
MODEL_LAYOUT = (("E_tree", (3, 3)), ("r_tree", (3,)), ("inertia", (6, 6)), ("armature", ()), ("f_ext", (6,)))
MODEL_TAIL = (("gravity", (3,)),)
WORK_LAYOUT = (("E", (3, 3)), ("r", (3,)), ("v", (6,)), ("c", (6,)), ("pA", (6,)), ("IA", (6, 6)), ("U", (6,)),
               ("D", ()), ("u", ()), ("acc", (6,)))
WORK_TAIL = (("T", (6, 3, 3)), ("tmp", (6,)))


def packed_size(nb: int, layout, tail) -> int:
    """Length (float64 elements) of a buffer holding `layout` for nb bodies and then `tail`."""
    return sum(nb * int(np.prod(sh)) for _, sh in layout) + sum(int(np.prod(sh)) for _, sh in tail)


def carve(buf: np.ndarray, nb: int, layout, tail) -> dict:
    """Views into `buf` in the layout's order (C-contiguous, shapes (nb, *shape), then the tail's)."""
    out, o = {}, 0
    for name, sh in layout:
        n = nb * int(np.prod(sh))
        out[name] = buf[o:o + n].reshape((nb, *sh))
        o += n
    for name, sh in tail:
        n = int(np.prod(sh))
        out[name] = buf[o:o + n].reshape(sh)
        o += n
    assert o == buf.size, "buffer size does not match the layout"
    return out


class Workspace:
    """Preallocated work arrays for the kernels of one chain of nb bodies.

    The ABA work arrays (and the T, tmp scratch) are views into one float64 buffer `buf` of
    `packed_size(nb, WORK_LAYOUT, WORK_TAIL)`, in WORK_LAYOUT's order, as `aba_packed` reads
    them (pass `buf` to supply it)."""

    def __init__(self, nb: int, buf: np.ndarray | None = None):
        if buf is None:
            buf = np.zeros(packed_size(nb, WORK_LAYOUT, WORK_TAIL))
        self.buf = buf
        for name, view in carve(buf, nb, WORK_LAYOUT, WORK_TAIL).items():
            setattr(self, name, view)
        # world placement of each body (FK): rotation body -> world, origin in world
        self.Rw = np.zeros((nb, 3, 3))
        self.pw = np.zeros((nb, 3))


@njit(cache=True, nogil=True, inline="always")
def joint_transform(jt, q, Et, rt, E, r):
    """E, r of X_i = XJ(q) XT: rotation parent -> body and body origin in parent coords (m)."""
    if jt == 0:
        cq = math.cos(q)
        sq = math.sin(q)
        for k in range(3):
            e0 = Et[0, k]
            e1 = Et[1, k]
            E[0, k] = cq * e0 + sq * e1
            E[1, k] = -sq * e0 + cq * e1
            E[2, k] = Et[2, k]
            r[k] = rt[k]
    else:
        for k in range(3):
            E[0, k] = Et[0, k]
            E[1, k] = Et[1, k]
            E[2, k] = Et[2, k]
            r[k] = rt[k] + Et[2, k] * q


@njit(cache=True, nogil=True, inline="always")
def motion_to_child(E, r, vp, out):
    """out = X vp for a motion vector: w' = E w, v' = E (v - r x w)."""
    w0, w1, w2 = vp[0], vp[1], vp[2]
    l0 = vp[3] - (r[1] * w2 - r[2] * w1)
    l1 = vp[4] - (r[2] * w0 - r[0] * w2)
    l2 = vp[5] - (r[0] * w1 - r[1] * w0)
    for k in range(3):
        out[k] = E[k, 0] * w0 + E[k, 1] * w1 + E[k, 2] * w2
        out[3 + k] = E[k, 0] * l0 + E[k, 1] * l1 + E[k, 2] * l2


@njit(cache=True, nogil=True, inline="always")
def force_to_parent_add(E, r, f, out):
    """out += X^T f for a force vector: f' = E^T f, n' = E^T n + r x f'."""
    n0 = E[0, 0] * f[0] + E[1, 0] * f[1] + E[2, 0] * f[2]
    n1 = E[0, 1] * f[0] + E[1, 1] * f[1] + E[2, 1] * f[2]
    n2 = E[0, 2] * f[0] + E[1, 2] * f[1] + E[2, 2] * f[2]
    g0 = E[0, 0] * f[3] + E[1, 0] * f[4] + E[2, 0] * f[5]
    g1 = E[0, 1] * f[3] + E[1, 1] * f[4] + E[2, 1] * f[5]
    g2 = E[0, 2] * f[3] + E[1, 2] * f[4] + E[2, 2] * f[5]
    out[0] += n0 + r[1] * g2 - r[2] * g1
    out[1] += n1 + r[2] * g0 - r[0] * g2
    out[2] += n2 + r[0] * g1 - r[1] * g0
    out[3] += g0
    out[4] += g1
    out[5] += g2


@njit(cache=True, nogil=True, inline="always")
def inertia_to_parent_add(E, r, Ia, out, T):
    """out += X^T Ia X for a symmetric 6x6 (articulated) inertia in body coordinates.

    Rotate the 3x3 blocks A, B, C of Ia = [[A, B], [B^T, C]] to parent axes (E^T M E), then
    shift the origin by r (R = r^, R^T = -R):
    A'' = A - B R - (B R)^T - R C R,  B'' = B + R C,  C'' = C.
    T: (6, 3, 3) scratch.
    """
    tA = T[0]
    tB = T[1]
    tC = T[2]
    A = T[3]
    B = T[4]
    C = T[5]
    for i in range(3):
        for j in range(3):
            sa = 0.0
            sb = 0.0
            sc = 0.0
            for k in range(3):
                e = E[k, j]
                sa += Ia[i, k] * e
                sb += Ia[i, 3 + k] * e
                sc += Ia[3 + i, 3 + k] * e
            tA[i, j] = sa
            tB[i, j] = sb
            tC[i, j] = sc
    for i in range(3):
        for j in range(3):
            sa = 0.0
            sb = 0.0
            sc = 0.0
            for k in range(3):
                e = E[k, i]
                sa += e * tA[k, j]
                sb += e * tB[k, j]
                sc += e * tC[k, j]
            A[i, j] = sa
            B[i, j] = sb
            C[i, j] = sc
    rx = r[0]
    ry = r[1]
    rz = r[2]
    BR = tA  # reuse scratch
    RC = tB
    for i in range(3):
        b0 = B[i, 0]
        b1 = B[i, 1]
        b2 = B[i, 2]
        BR[i, 0] = b1 * rz - b2 * ry
        BR[i, 1] = -b0 * rz + b2 * rx
        BR[i, 2] = b0 * ry - b1 * rx
    for j in range(3):
        c0 = C[0, j]
        c1 = C[1, j]
        c2 = C[2, j]
        RC[0, j] = -rz * c1 + ry * c2
        RC[1, j] = rz * c0 - rx * c2
        RC[2, j] = -ry * c0 + rx * c1
    for i in range(3):
        q0 = RC[i, 0]
        q1 = RC[i, 1]
        q2 = RC[i, 2]
        rcr0 = q1 * rz - q2 * ry
        rcr1 = -q0 * rz + q2 * rx
        rcr2 = q0 * ry - q1 * rx
        out[i, 0] += A[i, 0] - BR[i, 0] - BR[0, i] - rcr0
        out[i, 1] += A[i, 1] - BR[i, 1] - BR[1, i] - rcr1
        out[i, 2] += A[i, 2] - BR[i, 2] - BR[2, i] - rcr2
        for j in range(3):
            bb = B[i, j] + RC[i, j]
            out[i, 3 + j] += bb
            out[3 + j, i] += bb
            out[3 + i, 3 + j] += C[i, j]


@njit(cache=True, nogil=True, inline="always")
def cross_force(v, f, out):
    """out = v x* f (spatial force cross product)."""
    w0, w1, w2, l0, l1, l2 = v[0], v[1], v[2], v[3], v[4], v[5]
    out[0] = w1 * f[2] - w2 * f[1] + l1 * f[5] - l2 * f[4]
    out[1] = w2 * f[0] - w0 * f[2] + l2 * f[3] - l0 * f[5]
    out[2] = w0 * f[1] - w1 * f[0] + l0 * f[4] - l1 * f[3]
    out[3] = w1 * f[5] - w2 * f[4]
    out[4] = w2 * f[3] - w0 * f[5]
    out[5] = w0 * f[4] - w1 * f[3]


#: LLVM fast-math flags of `aba`: fused multiply-add, reassociation, reciprocal division and
#: signed-zero freedom let LLVM vectorise the 6x6 products (round-off changes ~1e-13 rad/s^2).
#: Deliberately NOT "nnan"/"ninf": a NaN or inf input still propagates to ddq, so the plant's
#: finiteness checks keep seeing it (fail closed).
ABA_FASTMATH = {"contract", "reassoc", "arcp", "nsz"}


@njit(cache=True, nogil=True, fastmath=ABA_FASTMATH)
def aba(parent, jtype, E_tree, r_tree, inertia, armature, gravity, q, dq, tau, f_ext, ddq,
        E, r, v, c, pA, IA, U, D, u, acc, T, tmp):
    """Forward dynamics by the articulated-body algorithm; writes ddq (rad/s^2 or m/s^2).

    q, dq, tau: joint positions (rad|m), velocities (rad/s|m/s), torques (N m|N), shape (nb,).
    f_ext: (nb, 6) external spatial force on each body, body coordinates, [N m; N].
    armature: (nb,) reflected rotor inertia (kg m^2) added to the joint-space inertia diagonal:
        in ABA it is added to D_i = S^T IA_i S, which is exactly M + diag(armature).
    gravity: (3,) world gravity (m/s^2), the base is the world frame.
    The remaining arguments are the `Workspace` arrays; T (6,3,3) and tmp (6,) scratch.
    On return acc[i] is body i's spatial acceleration (body coordinates) with -g included.
    """
    nb = q.size
    for i in range(nb):
        joint_transform(jtype[i], q[i], E_tree[i], r_tree[i], E[i], r[i])
        p = parent[i]
        vi = v[i]
        if p >= 0:
            motion_to_child(E[i], r[i], v[p], vi)
        else:
            for k in range(6):
                vi[k] = 0.0
        s = 2 if jtype[i] == 0 else 5
        vi[s] += dq[i]
        # c = v x (S dq): only column s of v x . is needed
        ci = c[i]
        qd = dq[i]
        if s == 2:
            ci[0] = vi[1] * qd
            ci[1] = -vi[0] * qd
            ci[2] = 0.0
            ci[3] = vi[4] * qd
            ci[4] = -vi[3] * qd
            ci[5] = 0.0
        else:
            ci[0] = 0.0
            ci[1] = 0.0
            ci[2] = 0.0
            ci[3] = vi[1] * qd
            ci[4] = -vi[0] * qd
            ci[5] = 0.0
        Ii = inertia[i]
        IAi = IA[i]
        for a in range(6):
            acc_ = 0.0
            for b in range(6):
                x = Ii[a, b]
                IAi[a, b] = x
                acc_ += x * vi[b]
            tmp[a] = acc_
        cross_force(vi, tmp, pA[i])
        for k in range(6):
            pA[i, k] -= f_ext[i, k]
    for i in range(nb - 1, -1, -1):
        s = 2 if jtype[i] == 0 else 5
        IAi = IA[i]
        Ui = U[i]
        for k in range(6):
            Ui[k] = IAi[k, s]
        Di = Ui[s] + armature[i]
        D[i] = Di
        ui = tau[i] - pA[i, s]
        u[i] = ui
        p = parent[i]
        if p >= 0:
            inv = 1.0 / Di
            ci = c[i]
            # Ia = IA - U U^T / D (in place: IA[i] is not needed afterwards)
            for a in range(6):
                ua = Ui[a] * inv
                for b in range(6):
                    IAi[a, b] -= ua * Ui[b]
            # pa = pA + Ia c + U u / D
            uu = ui * inv
            for a in range(6):
                acc_ = pA[i, a] + Ui[a] * uu
                for b in range(6):
                    acc_ += IAi[a, b] * ci[b]
                tmp[a] = acc_
            inertia_to_parent_add(E[i], r[i], IAi, IA[p], T)
            force_to_parent_add(E[i], r[i], tmp, pA[p])
    for i in range(nb):
        p = parent[i]
        ai = acc[i]
        if p >= 0:
            motion_to_child(E[i], r[i], acc[p], ai)
        else:
            # a_0 = -g (spatial, world = base coordinates)
            tmp[0] = 0.0
            tmp[1] = 0.0
            tmp[2] = 0.0
            tmp[3] = -gravity[0]
            tmp[4] = -gravity[1]
            tmp[5] = -gravity[2]
            motion_to_child(E[i], r[i], tmp, ai)
        for k in range(6):
            ai[k] += c[i, k]
        s = 2 if jtype[i] == 0 else 5
        Ui = U[i]
        dot = 0.0
        for k in range(6):
            dot += Ui[k] * ai[k]
        qdd = (u[i] - dot) / D[i]
        ddq[i] = qdd
        ai[s] += qdd


@njit(cache=True, nogil=True)
def minv_after_aba(parent, jtype, E, r, U, D, f, acc, tmp, Minv):
    """The inverse joint-space inertia (M + diag(armature))^-1, column by column, from the
    articulated-body quantities `aba` left at the same q: E, r (joint transforms), U = IA S and
    D = S^T IA S + armature depend on q only, so column j is ABA's two cheap passes with zero
    velocity, zero gravity and tau = e_j (no inertia is propagated again: about a tenth of an
    ABA each, against a full ABA per column). f (nb, 6) and acc (nb, 6) are scratch (acc is
    overwritten), tmp (6,). Minv (nb, nb), in 1/(kg m^2) for revolute joints."""
    nb = D.size
    for j in range(nb):
        # bodies after j (parent[i] < i: none of them supports j) see no force in column j:
        # u_i = 0 and nothing reaches their parents, so the bias pass starts at j (the same
        # sums as a pass over all bodies: it only skipped adding zeros)
        for i in range(j + 1):
            for k in range(6):
                f[i, k] = 0.0
        for i in range(j + 1, nb):
            acc[i, 2 if jtype[i] == 0 else 5] = 0.0
        # bias pass: pa_i = f_i + U_i u_i / D_i with u_i = tau_i - S^T f_i (c = 0, no velocity)
        for i in range(j, -1, -1):
            s = 2 if jtype[i] == 0 else 5
            ui = (1.0 if i == j else 0.0) - f[i, s]
            acc[i, s] = ui  # keep u_i (acc is rebuilt below)
            p = parent[i]
            if p >= 0:
                uu = ui / D[i]
                for k in range(6):
                    tmp[k] = f[i, k] + U[i, k] * uu
                force_to_parent_add(E[i], r[i], tmp, f[p])
        # acceleration pass: a_0 = 0 (no gravity), a_i = X a_p, qdd_i = (u_i - U_i . a_i) / D_i
        for i in range(nb):
            s = 2 if jtype[i] == 0 else 5
            ui = acc[i, s]
            p = parent[i]
            if p >= 0:
                motion_to_child(E[i], r[i], acc[p], tmp)
            else:
                for k in range(6):
                    tmp[k] = 0.0
            dot = 0.0
            for k in range(6):
                acc[i, k] = tmp[k]
                dot += U[i, k] * tmp[k]
            qdd = (ui - dot) / D[i]
            Minv[i, j] = qdd
            acc[i, s] += qdd


@njit(cache=True, nogil=True)
def aba_packed(model_i, model_f, work, q, dq, tau, ddq):
    """`aba` on packed buffers: the same kernel, 7 arguments (a cheaper call from Python).

    model_i: int64 [parent (nb); jtype (nb)]; model_f: float64 in MODEL_LAYOUT then MODEL_TAIL
    order (E_tree, r_tree, inertia, armature, f_ext per body; gravity); work: float64 in
    WORK_LAYOUT then WORK_TAIL order. `plants.manipulator.chain.Chain` owns such buffers (its
    named arrays are views into them). Units as `aba`.
    """
    nb = q.size
    parent = model_i[:nb]
    jtype = model_i[nb:2 * nb]
    o = 0
    E_tree = model_f[o:o + 9 * nb].reshape((nb, 3, 3))
    o += 9 * nb
    r_tree = model_f[o:o + 3 * nb].reshape((nb, 3))
    o += 3 * nb
    inertia = model_f[o:o + 36 * nb].reshape((nb, 6, 6))
    o += 36 * nb
    armature = model_f[o:o + nb]
    o += nb
    f_ext = model_f[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    gravity = model_f[o:o + 3]
    o = 0
    E = work[o:o + 9 * nb].reshape((nb, 3, 3))
    o += 9 * nb
    r = work[o:o + 3 * nb].reshape((nb, 3))
    o += 3 * nb
    v = work[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    c = work[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    pA = work[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    IA = work[o:o + 36 * nb].reshape((nb, 6, 6))
    o += 36 * nb
    U = work[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    D = work[o:o + nb]
    o += nb
    u = work[o:o + nb]
    o += nb
    acc = work[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    T = work[o:o + 54].reshape((6, 3, 3))
    o += 54
    tmp = work[o:o + 6]
    aba(parent, jtype, E_tree, r_tree, inertia, armature, gravity, q, dq, tau, f_ext, ddq,
        E, r, v, c, pA, IA, U, D, u, acc, T, tmp)


#: One float64 buffer for `aba_buf`, the cheapest call from Python (5 arguments, no slicing):
#: [parent, jtype (int64 bits, nb each)] [MODEL_LAYOUT, MODEL_TAIL] [WORK_LAYOUT, WORK_TAIL].
def buffer_size(nb: int) -> int:
    """Length (float64 elements) of an `aba_buf` buffer for nb bodies."""
    return 2 * nb + packed_size(nb, MODEL_LAYOUT, MODEL_TAIL) + packed_size(nb, WORK_LAYOUT, WORK_TAIL)


# aba_buf checks the buffer's length in closed form: keep it in step with the layouts
assert all(buffer_size(nb) == 137 * nb + 63 for nb in (1, 7)), "aba_buf's length check is out of date"


def carve_buffer(buf: np.ndarray, nb: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(model_i int64 (2 nb), model_f, work): views into an `aba_buf` buffer, the arrays
    `aba_packed` takes (so both entries read the same memory)."""
    if buf.dtype != np.float64 or buf.ndim != 1 or buf.size != buffer_size(nb) or not buf.flags.c_contiguous:
        raise ValueError(f"aba buffer: a C-contiguous float64 array of buffer_size({nb}) = {buffer_size(nb)} "
                         f"values, not {buf.dtype} of shape {buf.shape}")
    n_model = packed_size(nb, MODEL_LAYOUT, MODEL_TAIL)
    return buf[:2 * nb].view(np.int64), buf[2 * nb:2 * nb + n_model], buf[2 * nb + n_model:]


@intrinsic
def _ptr_f64(typingctx, arr, offset):
    """arr's data pointer + offset items, as float64* (a bitcast; arr is float64)."""
    sig = types.CPointer(types.float64)(arr, offset)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.gep(ary.data, [args[1]])

    return sig, codegen


@intrinsic
def _ptr_i64(typingctx, arr, offset):
    """arr's data pointer + offset items, as int64* (the int64 bits of a float64 buffer)."""
    sig = types.CPointer(types.int64)(arr, offset)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        p = builder.gep(ary.data, [args[1]])
        return builder.bitcast(p, context.get_value_type(types.CPointer(types.int64)))

    return sig, codegen


@njit(cache=True, nogil=True)
def aba_buf(buf, q, dq, tau, ddq):
    """`aba` on one buffer (`buffer_size(nb)`, layout above; `Chain.buf`): the same kernel,
    5 arguments, views taken as raw pointers (no slicing, no reference counting). Units as
    `aba`; q, dq, tau, ddq hold nb values each (nb = q.size), else ValueError.

    The call from Python that is cheapest for Numba to dispatch (pin.aba(model, data, q, v, tau)
    is Pinocchio's): `aba_buf(chain.buf, q, dq, tau, ddq)`; ddq is written, nothing allocated.
    """
    nb = q.size
    if dq.size != nb or tau.size != nb or ddq.size != nb or buf.size != 137 * nb + 63:
        raise ValueError("aba_buf: q, dq, tau and ddq need nb values each and buf buffer_size(nb) = 137 nb + 63")
    parent = carray(_ptr_i64(buf, 0), (nb,))
    jtype = carray(_ptr_i64(buf, nb), (nb,))
    o = 2 * nb
    E_tree = carray(_ptr_f64(buf, o), (nb, 3, 3))
    o += 9 * nb
    r_tree = carray(_ptr_f64(buf, o), (nb, 3))
    o += 3 * nb
    inertia = carray(_ptr_f64(buf, o), (nb, 6, 6))
    o += 36 * nb
    armature = carray(_ptr_f64(buf, o), (nb,))
    o += nb
    f_ext = carray(_ptr_f64(buf, o), (nb, 6))
    o += 6 * nb
    gravity = carray(_ptr_f64(buf, o), (3,))
    o += 3
    E = carray(_ptr_f64(buf, o), (nb, 3, 3))
    o += 9 * nb
    r = carray(_ptr_f64(buf, o), (nb, 3))
    o += 3 * nb
    v = carray(_ptr_f64(buf, o), (nb, 6))
    o += 6 * nb
    c = carray(_ptr_f64(buf, o), (nb, 6))
    o += 6 * nb
    pA = carray(_ptr_f64(buf, o), (nb, 6))
    o += 6 * nb
    IA = carray(_ptr_f64(buf, o), (nb, 6, 6))
    o += 36 * nb
    U = carray(_ptr_f64(buf, o), (nb, 6))
    o += 6 * nb
    D = carray(_ptr_f64(buf, o), (nb,))
    o += nb
    u = carray(_ptr_f64(buf, o), (nb,))
    o += nb
    acc = carray(_ptr_f64(buf, o), (nb, 6))
    o += 6 * nb
    T = carray(_ptr_f64(buf, o), (6, 3, 3))
    o += 54
    tmp = carray(_ptr_f64(buf, o), (6,))
    aba(parent, jtype, E_tree, r_tree, inertia, armature, gravity, q, dq, tau, f_ext, ddq,
        E, r, v, c, pA, IA, U, D, u, acc, T, tmp)


@njit(cache=True, nogil=True)
def aba_batch(parent, jtype, E_tree, r_tree, inertia, armature, gravity, Q, dQ, TAU, f_ext, DDQ,
              E, r, v, c, pA, IA, U, D, u, acc, T, tmp):
    """`aba` over N states in one call: row k of DDQ (N, nb) = FD(Q[k], dQ[k], TAU[k], f_ext).

    Q, dQ, TAU: (N, nb) in the units of `aba`; f_ext (nb, 6) is shared by every state. One
    Python call for N states (a batch of rollouts or a sampling-based planner's candidates),
    serially on the same work arrays; nothing is allocated.
    """
    for k in range(Q.shape[0]):
        aba(parent, jtype, E_tree, r_tree, inertia, armature, gravity, Q[k], dQ[k], TAU[k], f_ext, DDQ[k],
            E, r, v, c, pA, IA, U, D, u, acc, T, tmp)


@njit(cache=True, nogil=True)
def rnea(parent, jtype, E_tree, r_tree, inertia, armature, gravity, q, dq, ddq, f_ext, tau,
         E, r, v, acc, fb, tmp):
    """Inverse dynamics: tau = M(q) ddq + C(q, dq) dq + g(q) - J^T f_ext (N m | N).

    armature (kg m^2) adds armature[i] * ddq[i]; f_ext (nb, 6) body coordinates.
    fb (nb, 6) work: body forces. Same frame conventions as `aba`.
    """
    nb = q.size
    for i in range(nb):
        joint_transform(jtype[i], q[i], E_tree[i], r_tree[i], E[i], r[i])
        p = parent[i]
        s = 2 if jtype[i] == 0 else 5
        vi = v[i]
        ai = acc[i]
        if p >= 0:
            motion_to_child(E[i], r[i], v[p], vi)
            motion_to_child(E[i], r[i], acc[p], ai)
        else:
            for k in range(6):
                vi[k] = 0.0
                tmp[k] = 0.0
            tmp[3] = -gravity[0]
            tmp[4] = -gravity[1]
            tmp[5] = -gravity[2]
            motion_to_child(E[i], r[i], tmp, ai)
        qd = dq[i]
        # a += v x (S qd) + S qdd  (using v before adding S qd: v x S qd is the same)
        if s == 2:
            ai[0] += vi[1] * qd
            ai[1] += -vi[0] * qd
            ai[3] += vi[4] * qd
            ai[4] += -vi[3] * qd
        else:
            ai[3] += vi[1] * qd
            ai[4] += -vi[0] * qd
        ai[s] += ddq[i]
        vi[s] += qd
        Ii = inertia[i]
        for a in range(6):
            acc_ = 0.0
            for b in range(6):
                acc_ += Ii[a, b] * vi[b]
            tmp[a] = acc_
        cross_force(vi, tmp, fb[i])
        for a in range(6):
            acc_ = 0.0
            for b in range(6):
                acc_ += Ii[a, b] * ai[b]
            fb[i, a] += acc_ - f_ext[i, a]
    for i in range(nb - 1, -1, -1):
        s = 2 if jtype[i] == 0 else 5
        tau[i] = fb[i, s] + armature[i] * ddq[i]
        p = parent[i]
        if p >= 0:
            force_to_parent_add(E[i], r[i], fb[i], fb[p])


@njit(cache=True, nogil=True)
def forward_kinematics(parent, jtype, E_tree, r_tree, q, E, r, Rw, pw):
    """World placement of every body: Rw[i] rotation body -> world, pw[i] origin (m)."""
    nb = q.size
    for i in range(nb):
        joint_transform(jtype[i], q[i], E_tree[i], r_tree[i], E[i], r[i])
        p = parent[i]
        if p < 0:
            for a in range(3):
                pw[i, a] = r[i, a]
                for b in range(3):
                    Rw[i, a, b] = E[i, b, a]
        else:
            for a in range(3):
                s_ = pw[p, a]
                for k in range(3):
                    s_ += Rw[p, a, k] * r[i, k]
                pw[i, a] = s_
                for b in range(3):
                    s2 = 0.0
                    for k in range(3):
                        s2 += Rw[p, a, k] * E[i, b, k]
                    Rw[i, a, b] = s2


@njit(cache=True, nogil=True)
def frame_kinematics(parent, jtype, E_tree, r_tree, q, body, point, E, r, Rw, pw, pos, J):
    """World position (m) of `point` (body coordinates, m) on `body`, and its Jacobian.

    J (6, nb): rows 0-2 angular velocity, rows 3-5 linear velocity of the point, world
    coordinates, per unit joint rate (J[:, j] = 0 for joints not supporting `body`).
    """
    forward_kinematics(parent, jtype, E_tree, r_tree, q, E, r, Rw, pw)
    for a in range(3):
        s_ = pw[body, a]
        for k in range(3):
            s_ += Rw[body, a, k] * point[k]
        pos[a] = s_
    for j in range(q.size):
        for a in range(6):
            J[a, j] = 0.0
    j = body
    while j >= 0:
        # joint axis z of body j in world: column 2 of Rw[j]
        zx = Rw[j, 0, 2]
        zy = Rw[j, 1, 2]
        zz = Rw[j, 2, 2]
        if jtype[j] == 0:
            dx = pos[0] - pw[j, 0]
            dy = pos[1] - pw[j, 1]
            dz = pos[2] - pw[j, 2]
            J[0, j] = zx
            J[1, j] = zy
            J[2, j] = zz
            J[3, j] = zy * dz - zz * dy
            J[4, j] = zz * dx - zx * dz
            J[5, j] = zx * dy - zy * dx
        else:
            J[3, j] = zx
            J[4, j] = zy
            J[5, j] = zz
        j = parent[j]


@njit(cache=True, nogil=True)
def energy(parent, jtype, E_tree, r_tree, inertia, armature, gravity, q, dq, E, r, v, Rw, pw, out):
    """out[0] = kinetic energy (J, rotor armature included), out[1] = potential energy (J).

    Potential is -sum m_i g . p_com_i with p_com the world centre of mass of body i.
    """
    forward_kinematics(parent, jtype, E_tree, r_tree, q, E, r, Rw, pw)
    ke = 0.0
    pe = 0.0
    nb = q.size
    for i in range(nb):
        p = parent[i]
        vi = v[i]
        if p >= 0:
            motion_to_child(E[i], r[i], v[p], vi)
        else:
            for k in range(6):
                vi[k] = 0.0
        s = 2 if jtype[i] == 0 else 5
        vi[s] += dq[i]
        Ii = inertia[i]
        for a in range(6):
            acc_ = 0.0
            for b in range(6):
                acc_ += Ii[a, b] * vi[b]
            ke += 0.5 * vi[a] * acc_
        ke += 0.5 * armature[i] * dq[i] * dq[i]
        m = Ii[3, 3]
        if m > 0.0:
            # m c^ = Ii[0:3, 3:6] -> c = (Ii[2,4], Ii[0,5], Ii[1,3]) / m
            cx = Ii[2, 4] / m
            cy = Ii[0, 5] / m
            cz = Ii[1, 3] / m
            for a in range(3):
                pc = pw[i, a] + Rw[i, a, 0] * cx + Rw[i, a, 1] * cy + Rw[i, a, 2] * cz
                pe -= m * gravity[a] * pc
    out[0] = ke
    out[1] = pe
