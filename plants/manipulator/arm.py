"""The arm plant step: drives, friction, stops, ABA, gripper and object, sub-stepped.

`step(t, x, u, p, dt, n_sub, mf, mi, wf)` advances the flat state x (layout in
`layout.STATE_GROUPS`) by dt seconds with the inputs u held, in n_sub sub-steps of
h = dt / n_sub <= MAX_SUBSTEP; `outputs(x, u, p, y, mf, mi, wf)` writes y. Both are
`@njit(cache=True, nogil=True)` and allocate nothing: mf/mi (the model: tree table, TCP,
gravity, layout offsets) and wf (work) are flat preallocated buffers built once by
`ArmModel`, viewed inside the kernel as tuples of shaped arrays.

Disk cache: the cached kernels here compile `dynamics.aba` into themselves, and Numba's cache
checks only this file's stamp, not its callees' files: after a change to
`plants/manipulator/dynamics.py` (e.g. its fast-math flags), delete the stale entries
(`find . -name "*.nb[ic]" -delete`) or they keep the old ABA.

Integrator: semi-implicit (symplectic) Euler on the ABA accelerations,

    ddq = FD(q, dq, tau(q, dq, tau_m));  dq <- dq + h ddq;  q <- q + h dq

Why: explicit Euler multiplies the energy of every undamped mode by (1 + (w h)^2) per step,
so an undamped 7-DoF chain at 1 kHz gains energy without bound (it diverges within a minute
of simulated time); RK4 costs 4 ABA per sub-step and still drifts (dissipatively) on long
runs. Semi-implicit Euler is symplectic for a separable Hamiltonian: its energy error stays
bounded and oscillates instead of growing (tests/plants/manipulator/test_arm.py measures it
on the Panda over 10 s), at one ABA per sub-step. Its stability limit for a mode of
frequency w is h < 2 / w; damping terms (friction, drive D gains, stops) are explicit and
need h < 2 m / d. MAX_SUBSTEP = 0.25 ms keeps the stiffest nominal modes inside with margin:
joint stops (1e4 N m/rad on >= 0.05 kg m^2: w = 450 rad/s, h < 4.4 ms), the smoothed Coulomb
term (slope 1.7 / 0.02 = 85 N m s/rad on 0.05 kg m^2: h < 1.2 ms), position-mode gains
(600 N m/rad, 50 N m s/rad), the finger contact (k = 1e7 N/m^1.5 squeezed at 140 N on
0.05 kg fingers: w = 1.9e3 rad/s, h < 1.0 ms), and the object slide (no stiffness).
The current loop (first-order lag) is stepped exactly and is stable for any h.

Order within a sub-step (all forces from the state at the sub-step's start, then update):
1. drive demand (mode, gains, gravity compensation g(q) computed once per step, as the
   robot controller does at 1 kHz), clipped to the effort limit;
2. joint torque = tau_motor - friction(dq) + stop(q, dq);
3. object coupling: a sticking object is a point mass added to the TCP body's inertia; a
   sliding object pulls on the hand with the kinetic friction force (external force);
4. ABA -> ddq and body accelerations; the pads' tangential load from the TCP point's
   acceleration (gravity included);
5. stick/slip transitions and the slide; gripper fingers; velocity-mode integral
   (conditional integration: frozen while the demand saturates); current loop; joints.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from plants.manipulator import dynamics as dyn
from plants.manipulator.drive import current_loop, drive_demand, friction_torque, stop_torque
from plants.manipulator.grasp import gripper_force, hunt_crossley, slide_step
from plants.manipulator.layout import PI, UI, XI, YI, Layout

MAX_SUBSTEP = 2.5e-4  # s, see the module docstring
DEFAULT_SUBSTEPS = 4  # per 1 ms loop period

# group indices as module constants (Numba freezes global ints)
PI_CAPTURE_RADIUS = PI["capture_radius"]
PI_COULOMB = PI["coulomb"]
PI_CURRENT_TAU = PI["current_tau"]
PI_EFFORT = PI["effort"]
PI_FINGER_MASS = PI["finger_mass"]
PI_FRICTION_SMOOTHING = PI["friction_smoothing"]
PI_GEAR_RATIO = PI["gear_ratio"]
PI_GRAVITY_COMP = PI["gravity_comp"]
PI_GRIPPER_FORCE_MAX = PI["gripper_force_max"]
PI_GRIPPER_KD = PI["gripper_kd"]
PI_GRIPPER_KP = PI["gripper_kp"]
PI_GRIPPER_STROKE = PI["gripper_stroke"]
PI_HC_DAMPING = PI["hc_damping"]
PI_HC_EXPONENT = PI["hc_exponent"]
PI_HC_STIFFNESS = PI["hc_stiffness"]
PI_KD = PI["kd"]
PI_KI = PI["ki"]
PI_KP = PI["kp"]
PI_KV = PI["kv"]
PI_LIMIT_DAMPING = PI["limit_damping"]
PI_LIMIT_STIFFNESS = PI["limit_stiffness"]
PI_MU_KINETIC = PI["mu_kinetic"]
PI_MU_STATIC = PI["mu_static"]
PI_OBJ_MASS = PI["obj_mass"]
PI_OBJ_WIDTH = PI["obj_width"]
PI_Q_LOWER = PI["q_lower"]
PI_Q_UPPER = PI["q_upper"]
PI_ROTOR_INERTIA = PI["rotor_inertia"]
PI_SLIDE_MAX = PI["slide_max"]
PI_STICK_SPEED = PI["stick_speed"]
PI_STRIBECK = PI["stribeck"]
PI_STRIBECK_SPEED = PI["stribeck_speed"]
PI_VISCOUS = PI["viscous"]
UI_CONTROL_MODE = UI["control_mode"]
UI_DQ_COMMAND = UI["dq_command"]
UI_GRIPPER_FORCE_COMMAND = UI["gripper_force_command"]
UI_GRIPPER_WIDTH_COMMAND = UI["gripper_width_command"]
UI_Q_COMMAND = UI["q_command"]
UI_TAU_COMMAND = UI["tau_command"]
XI_DQ = XI["dq"]
XI_GRASP_STUCK = XI["grasp_stuck"]
XI_GRIPPER_SPEED = XI["gripper_speed"]
XI_GRIPPER_WIDTH = XI["gripper_width"]
XI_OBJ_POSITION = XI["obj_position"]
XI_OBJ_SLIDE = XI["obj_slide"]
XI_OBJ_SLIDE_SPEED = XI["obj_slide_speed"]
XI_OBJECT_DROPPED = XI["object_dropped"]
XI_OBJECT_HELD = XI["object_held"]
XI_Q = XI["q"]
XI_SLIP_EVENTS = XI["slip_events"]
XI_TAU_MOTOR = XI["tau_motor"]
XI_VEL_INTEGRAL = XI["vel_integral"]
YI_CONTACT_FORCE = YI["contact_force"]
YI_DQ = YI["dq"]
YI_EE_POSITION = YI["ee_position"]
YI_GRIPPER_FORCE = YI["gripper_force"]
YI_GRIPPER_WIDTH = YI["gripper_width"]
YI_OBJECT_DROPPED = YI["object_dropped"]
YI_OBJECT_HELD = YI["object_held"]
YI_OBJECT_POSITION = YI["object_position"]
YI_Q = YI["q"]
YI_SLIP = YI["slip"]
YI_TANGENTIAL_LOAD = YI["tangential_load"]
YI_TAU_COMMAND = YI["tau_command"]
YI_TAU_MEASURED = YI["tau_measured"]

# aux work slots (algebraic quantities of the last evaluation)
A_FN = 0        # normal force per pad, N
A_FG = 1        # gripper drive force per finger, N
A_LOAD0 = 2     # tangential load, TCP x, N
A_LOAD1 = 3     # tangential load, TCP z, N
A_FRIC0 = 4     # friction the pads exert on a sliding object, TCP x, N
A_FRIC1 = 5     # ... TCP z, N
A_PX = 6        # object position on the TCP body (body coordinates), m
A_PY = 7
A_PZ = 8
N_AUX = 16


@njit(cache=True, nogil=True)
def _seg(a, off, gi, n):
    o = off[gi]
    return a[o:o + n]


@njit(cache=True, nogil=True)
def evaluate(x, u, p, model, work, gq):
    """Forces and accelerations at the current state (nothing integrated).

    Writes work: tau_dem (drive demand, N m), fric (N m), ddq (rad/s^2), acc/v (ABA), aux
    (grasp forces). gq: gravity torque the drive adds (N m).
    """
    parent, jtype, E_tree, r_tree, inertia0, gravity, tcp_E, tcp_r, ints, xo, uo, po = model
    (E, r, v, c, pA, IA, U, D, uu, acc, T, tmp, inertia, armature, f_ext, ddq, tau_j,
     tau_dem, fric, fb, Rw, pw, pos, J, aux, load, sl) = work
    nb = ints[0]
    tb = ints[1]
    q = _seg(x, xo, XI_Q, nb)
    dq = _seg(x, xo, XI_DQ, nb)
    tau_m = _seg(x, xo, XI_TAU_MOTOR, nb)
    z = _seg(x, xo, XI_VEL_INTEGRAL, nb)
    mode = int(u[uo[UI_CONTROL_MODE]])
    tau_cmd = _seg(u, uo, UI_TAU_COMMAND, nb)
    q_cmd = _seg(u, uo, UI_Q_COMMAND, nb)
    dq_cmd = _seg(u, uo, UI_DQ_COMMAND, nb)
    G = _seg(p, po, PI_GEAR_RATIO, nb)
    Jr = _seg(p, po, PI_ROTOR_INERTIA, nb)
    eff = _seg(p, po, PI_EFFORT, nb)
    Fc = _seg(p, po, PI_COULOMB, nb)
    Fs = _seg(p, po, PI_STRIBECK, nb)
    Fv = _seg(p, po, PI_VISCOUS, nb)
    qlo = _seg(p, po, PI_Q_LOWER, nb)
    qhi = _seg(p, po, PI_Q_UPPER, nb)
    kp = _seg(p, po, PI_KP, nb)
    kd = _seg(p, po, PI_KD, nb)
    kv = _seg(p, po, PI_KV, nb)
    ki = _seg(p, po, PI_KI, nb)
    vs = p[po[PI_STRIBECK_SPEED]]
    eps = p[po[PI_FRICTION_SMOOTHING]]
    Klim = p[po[PI_LIMIT_STIFFNESS]]
    Dlim = p[po[PI_LIMIT_DAMPING]]
    for i in range(nb):
        armature[i] = Jr[i] * G[i] * G[i]
        tau_dem[i] = drive_demand(mode, q[i], dq[i], tau_cmd[i], q_cmd[i], dq_cmd[i], z[i], gq[i],
                                  kp[i], kd[i], kv[i], ki[i], eff[i])
        fric[i] = friction_torque(dq[i], Fc[i], Fs[i], vs, Fv[i], eps)
        tau_j[i] = tau_m[i] - fric[i] + stop_torque(q[i], dq[i], qlo[i], qhi[i], Klim, Dlim)
        for k in range(6):
            f_ext[i, k] = 0.0
    # --- object coupling
    held = x[xo[XI_OBJECT_HELD]] > 0.5
    stuck = x[xo[XI_GRASP_STUCK]] > 0.5
    m_o = p[po[PI_OBJ_MASS]]
    s = _seg(x, xo, XI_OBJ_SLIDE, 2)
    ds = _seg(x, xo, XI_OBJ_SLIDE_SPEED, 2)
    # object point on the TCP body: tcp_r + E_tcp^T (s_x, 0, s_z)
    for a in range(3):
        aux[A_PX + a] = tcp_r[a] + tcp_E[0, a] * s[0] + tcp_E[2, a] * s[1]
    px = aux[A_PX]
    py = aux[A_PY]
    pz = aux[A_PZ]
    # the bodies' inertias from the model (parameters may have been randomized), the held
    # object added below
    for i in range(nb):
        for a in range(6):
            for b in range(6):
                inertia[i, a, b] = inertia0[i, a, b]
    # gripper and normal force
    w = x[xo[XI_GRIPPER_WIDTH]]
    dw = x[xo[XI_GRIPPER_SPEED]]
    f_n = 0.0
    if held:
        delta = 0.5 * (p[po[PI_OBJ_WIDTH]] - w)
        f_n = hunt_crossley(delta, -0.5 * dw, p[po[PI_HC_STIFFNESS]], p[po[PI_HC_EXPONENT]],
                            p[po[PI_HC_DAMPING]])
    aux[A_FN] = f_n
    aux[A_FG] = gripper_force(w, dw, u[uo[UI_GRIPPER_WIDTH_COMMAND]], u[uo[UI_GRIPPER_FORCE_COMMAND]],
                              p[po[PI_GRIPPER_KP]], p[po[PI_GRIPPER_KD]], p[po[PI_GRIPPER_FORCE_MAX]])
    aux[A_FRIC0] = 0.0
    aux[A_FRIC1] = 0.0
    if held and stuck:
        # point mass m_o at p: [[m p^ p^T, m p^], [m p^T, m 1]]
        I6 = inertia[tb]
        I6[0, 0] += m_o * (py * py + pz * pz)
        I6[1, 1] += m_o * (px * px + pz * pz)
        I6[2, 2] += m_o * (px * px + py * py)
        I6[0, 1] -= m_o * px * py
        I6[1, 0] -= m_o * px * py
        I6[0, 2] -= m_o * px * pz
        I6[2, 0] -= m_o * px * pz
        I6[1, 2] -= m_o * py * pz
        I6[2, 1] -= m_o * py * pz
        # m p^ = m [[0,-pz,py],[pz,0,-px],[-py,px,0]]
        I6[0, 4] -= m_o * pz
        I6[0, 5] += m_o * py
        I6[1, 3] += m_o * pz
        I6[1, 5] -= m_o * px
        I6[2, 3] -= m_o * py
        I6[2, 4] += m_o * px
        I6[4, 0] -= m_o * pz
        I6[5, 0] += m_o * py
        I6[3, 1] += m_o * pz
        I6[5, 1] -= m_o * px
        I6[3, 2] -= m_o * py
        I6[4, 2] += m_o * px
        for k in range(3):
            I6[3 + k, 3 + k] += m_o
    elif held:
        # kinetic friction on the object opposes its slide (from rest: opposes the last load)
        cap = p[po[PI_MU_KINETIC]] * 2.0 * f_n
        sp = math.sqrt(ds[0] * ds[0] + ds[1] * ds[1])
        if sp > 1e-12:
            aux[A_FRIC0] = -cap * ds[0] / sp
            aux[A_FRIC1] = -cap * ds[1] / sp
        else:
            ln = math.sqrt(load[0] * load[0] + load[1] * load[1])
            if ln > 0.0:
                aux[A_FRIC0] = cap * load[0] / ln
                aux[A_FRIC1] = cap * load[1] / ln
        # reaction on the hand: -friction, at p, body coordinates
        F0 = -(tcp_E[0, 0] * aux[A_FRIC0] + tcp_E[2, 0] * aux[A_FRIC1])
        F1 = -(tcp_E[0, 1] * aux[A_FRIC0] + tcp_E[2, 1] * aux[A_FRIC1])
        F2 = -(tcp_E[0, 2] * aux[A_FRIC0] + tcp_E[2, 2] * aux[A_FRIC1])
        f_ext[tb, 0] = py * F2 - pz * F1
        f_ext[tb, 1] = pz * F0 - px * F2
        f_ext[tb, 2] = px * F1 - py * F0
        f_ext[tb, 3] = F0
        f_ext[tb, 4] = F1
        f_ext[tb, 5] = F2
    dyn.aba(parent, jtype, E_tree, r_tree, inertia, armature, gravity, q, dq, tau_j, f_ext, ddq,
            E, r, v, c, pA, IA, U, D, uu, acc, T, tmp)
    # tangential load on the pads: m_o (a_p - g), a_p the classical acceleration of p
    if held:
        at = acc[tb]
        vt = v[tb]
        w0, w1, w2 = vt[0], vt[1], vt[2]
        vp0 = vt[3] + w1 * pz - w2 * py
        vp1 = vt[4] + w2 * px - w0 * pz
        vp2 = vt[5] + w0 * py - w1 * px
        ap0 = at[3] + at[1] * pz - at[2] * py + w1 * vp2 - w2 * vp1
        ap1 = at[4] + at[2] * px - at[0] * pz + w2 * vp0 - w0 * vp2
        ap2 = at[5] + at[0] * py - at[1] * px + w0 * vp1 - w1 * vp0
        load[0] = m_o * (tcp_E[0, 0] * ap0 + tcp_E[0, 1] * ap1 + tcp_E[0, 2] * ap2)
        load[1] = m_o * (tcp_E[2, 0] * ap0 + tcp_E[2, 1] * ap1 + tcp_E[2, 2] * ap2)
    else:
        load[0] = 0.0
        load[1] = 0.0
    aux[A_LOAD0] = load[0]
    aux[A_LOAD1] = load[1]


@njit(cache=True, nogil=True)
def gravity_comp(x, p, model, work, gq):
    """gq = g(q) (N m) times the gravity_comp flag: the drive's gravity model."""
    parent, jtype, E_tree, r_tree, inertia0, gravity, tcp_E, tcp_r, ints, xo, uo, po = model
    (E, r, v, c, pA, IA, U, D, uu, acc, T, tmp, inertia, armature, f_ext, ddq, tau_j,
     tau_dem, fric, fb, Rw, pw, pos, J, aux, load, sl) = work
    nb = ints[0]
    q = _seg(x, xo, XI_Q, nb)
    flag = p[po[PI_GRAVITY_COMP]]
    if flag <= 0.0:
        for i in range(nb):
            gq[i] = 0.0
        return
    for i in range(nb):
        tau_dem[i] = 0.0  # zero velocity / acceleration vector (scratch)
        for k in range(6):
            f_ext[i, k] = 0.0
    dyn.rnea(parent, jtype, E_tree, r_tree, inertia0, tau_dem, gravity, q, tau_dem, tau_dem, f_ext, gq,
             E, r, v, acc, fb, tmp)
    for i in range(nb):
        gq[i] *= flag


@njit(cache=True, nogil=True)
def step_views(t, x, u, p, dt, n_sub, model, work, gq):
    """`step` on the model/work tuples of views (see `model_views`, `work_views`)."""
    parent, jtype, E_tree, r_tree, inertia0, gravity, tcp_E, tcp_r, ints, xo, uo, po = model
    (E, r, v, c, pA, IA, U, D, uu, acc, T, tmp, inertia, armature, f_ext, ddq, tau_j,
     tau_dem, fric, fb, Rw, pw, pos, J, aux, load, sl) = work
    nb = ints[0]
    h = dt / n_sub
    gravity_comp(x, p, model, work, gq)
    q = _seg(x, xo, XI_Q, nb)
    dq = _seg(x, xo, XI_DQ, nb)
    tau_m = _seg(x, xo, XI_TAU_MOTOR, nb)
    z = _seg(x, xo, XI_VEL_INTEGRAL, nb)
    s = _seg(x, xo, XI_OBJ_SLIDE, 2)
    ds = _seg(x, xo, XI_OBJ_SLIDE_SPEED, 2)
    dq_cmd = _seg(u, uo, UI_DQ_COMMAND, nb)
    eff = _seg(p, po, PI_EFFORT, nb)
    mode = int(u[uo[UI_CONTROL_MODE]])
    Tc = p[po[PI_CURRENT_TAU]]
    m_o = p[po[PI_OBJ_MASS]]
    m_f = p[po[PI_FINGER_MASS]]
    mu_s = p[po[PI_MU_STATIC]]
    mu_k = p[po[PI_MU_KINETIC]]
    w_max = p[po[PI_GRIPPER_STROKE]]
    ix_w = xo[XI_GRIPPER_WIDTH]
    ix_dw = xo[XI_GRIPPER_SPEED]
    ix_st = xo[XI_GRASP_STUCK]
    ix_held = xo[XI_OBJECT_HELD]
    for _ in range(n_sub):
        evaluate(x, u, p, model, work, gq)
        held = x[ix_held] > 0.5
        f_n = aux[A_FN]
        # --- grasp: stick / slip, slide, loss
        if held:
            ln = math.sqrt(load[0] * load[0] + load[1] * load[1])
            cone = mu_s * 2.0 * f_n
            if x[ix_st] > 0.5:
                if ln > cone:
                    x[ix_st] = 0.0
                    x[xo[XI_SLIP_EVENTS]] += 1.0
            else:
                slide_step(h, s, ds, load, f_n, m_o, mu_k)
                sp = math.sqrt(ds[0] * ds[0] + ds[1] * ds[1])
                if sp < p[po[PI_STICK_SPEED]] and ln <= cone:
                    x[ix_st] = 1.0
                    ds[0] = 0.0
                    ds[1] = 0.0
                if math.sqrt(s[0] * s[0] + s[1] * s[1]) > p[po[PI_SLIDE_MAX]]:
                    x[ix_held] = 0.0
                    x[xo[XI_OBJECT_DROPPED]] = 1.0
                    x[ix_st] = 1.0
                    s[0] = 0.0
                    s[1] = 0.0
                    ds[0] = 0.0
                    ds[1] = 0.0
        # --- gripper fingers (semi-implicit), inelastic stops at 0 and w_max
        dw = x[ix_dw] + h * 2.0 * (f_n - aux[A_FG]) / m_f
        w = x[ix_w] + h * dw
        if w < 0.0:
            w = 0.0
            dw = 0.0
        elif w > w_max:
            w = w_max
            dw = 0.0
        x[ix_w] = w
        x[ix_dw] = dw
        # --- drives and joints
        for i in range(nb):
            if mode == 2 and abs(tau_dem[i]) < eff[i]:
                z[i] += h * (dq_cmd[i] - dq[i])
            tau_m[i] = current_loop(tau_m[i], tau_dem[i], h, Tc)
            dq[i] += h * ddq[i]
            q[i] += h * dq[i]
    # --- grasp acquisition and object position (once per step)
    _object_kinematics(x, p, model, work)
    return t + dt


@njit(cache=True, nogil=True)
def _tcp_position(x, model, work):
    """TCP world position (m) into work `pos` (and body placements into Rw, pw)."""
    parent, jtype, E_tree, r_tree, inertia0, gravity, tcp_E, tcp_r, ints, xo, uo, po = model
    (E, r, v, c, pA, IA, U, D, uu, acc, T, tmp, inertia, armature, f_ext, ddq, tau_j,
     tau_dem, fric, fb, Rw, pw, pos, J, aux, load, sl) = work
    nb = ints[0]
    tb = ints[1]
    q = _seg(x, xo, XI_Q, nb)
    dyn.forward_kinematics(parent, jtype, E_tree, r_tree, q, E, r, Rw, pw)
    for a in range(3):
        acc_ = pw[tb, a]
        for k in range(3):
            acc_ += Rw[tb, a, k] * tcp_r[k]
        pos[a] = acc_


@njit(cache=True, nogil=True)
def _object_kinematics(x, p, model, work):
    """Grasp a resting object within reach of closed fingers; move a held one with the TCP."""
    parent, jtype, E_tree, r_tree, inertia0, gravity, tcp_E, tcp_r, ints, xo, uo, po = model
    (E, r, v, c, pA, IA, U, D, uu, acc, T, tmp, inertia, armature, f_ext, ddq, tau_j,
     tau_dem, fric, fb, Rw, pw, pos, J, aux, load, sl) = work
    tb = ints[1]
    _tcp_position(x, model, work)
    o = xo[XI_OBJ_POSITION]
    ix_held = xo[XI_OBJECT_HELD]
    if x[ix_held] > 0.5:
        s = _seg(x, xo, XI_OBJ_SLIDE, 2)
        for a in range(3):
            # TCP x / z axes in world: Rw[tb] @ tcp_E[0, :] and Rw[tb] @ tcp_E[2, :]
            ex = 0.0
            ez = 0.0
            for k in range(3):
                ex += Rw[tb, a, k] * tcp_E[0, k]
                ez += Rw[tb, a, k] * tcp_E[2, k]
            x[o + a] = pos[a] + ex * s[0] + ez * s[1]
    elif x[xo[XI_OBJECT_DROPPED]] < 0.5:
        d0 = pos[0] - x[o]
        d1 = pos[1] - x[o + 1]
        d2 = pos[2] - x[o + 2]
        if (math.sqrt(d0 * d0 + d1 * d1 + d2 * d2) < p[po[PI_CAPTURE_RADIUS]]
                and x[xo[XI_GRIPPER_WIDTH]] < p[po[PI_OBJ_WIDTH]]):
            x[ix_held] = 1.0
            x[xo[XI_GRASP_STUCK]] = 1.0
            for k in range(2):
                x[xo[XI_OBJ_SLIDE] + k] = 0.0
                x[xo[XI_OBJ_SLIDE_SPEED] + k] = 0.0


@njit(cache=True, nogil=True)
def outputs_views(x, u, p, y, model, work, gq):
    """`outputs` on the model/work tuples of views."""
    parent, jtype, E_tree, r_tree, inertia0, gravity, tcp_E, tcp_r, ints, xo, uo, po = model
    (E, r, v, c, pA, IA, U, D, uu, acc, T, tmp, inertia, armature, f_ext, ddq, tau_j,
     tau_dem, fric, fb, Rw, pw, pos, J, aux, load, sl) = work
    nb = ints[0]
    yo = ints[2:]
    gravity_comp(x, p, model, work, gq)
    evaluate(x, u, p, model, work, gq)
    q = _seg(x, xo, XI_Q, nb)
    dq = _seg(x, xo, XI_DQ, nb)
    tau_m = _seg(x, xo, XI_TAU_MOTOR, nb)
    for i in range(nb):
        y[yo[YI_Q] + i] = q[i]
        y[yo[YI_DQ] + i] = dq[i]
        y[yo[YI_TAU_MEASURED] + i] = tau_m[i] - fric[i] - armature[i] * ddq[i]
        y[yo[YI_TAU_COMMAND] + i] = tau_dem[i]
    y[yo[YI_GRIPPER_WIDTH]] = x[xo[XI_GRIPPER_WIDTH]]
    y[yo[YI_GRIPPER_FORCE]] = aux[A_FG]
    f_n = aux[A_FN]
    y[yo[YI_CONTACT_FORCE]] = f_n
    ln = math.sqrt(load[0] * load[0] + load[1] * load[1])
    y[yo[YI_TANGENTIAL_LOAD]] = ln
    held = x[xo[XI_OBJECT_HELD]] > 0.5
    sliding = x[xo[XI_GRASP_STUCK]] < 0.5
    y[yo[YI_SLIP]] = 1.0 if held and (sliding or ln > p[po[PI_MU_STATIC]] * 2.0 * f_n) else 0.0
    y[yo[YI_OBJECT_HELD]] = 1.0 if held else 0.0
    y[yo[YI_OBJECT_DROPPED]] = x[xo[XI_OBJECT_DROPPED]]
    _tcp_position(x, model, work)
    for a in range(3):
        y[yo[YI_EE_POSITION] + a] = pos[a]
        y[yo[YI_OBJECT_POSITION] + a] = x[xo[XI_OBJ_POSITION] + a]


N_XG = len(XI)
N_UG = len(UI)
N_PG = len(PI)
N_YG = len(YI)


def model_sizes(nb: int) -> tuple[int, int]:
    """(float, int) lengths of the flat model buffers `mf`, `mi` for nb joints."""
    return nb * 48 + 15, 2 + N_YG + 2 * nb + N_XG + N_UG + N_PG


def work_size(nb: int) -> int:
    """Length of the flat work buffer `wf` for nb joints."""
    return nb * (9 + 3 + 6 * 4 + 36 + 2 + 6 + 36 + 1 + 6 + 4 + 6 + 9 + 3 + 6 + 1) + 54 + 6 + 3 + N_AUX + 4


@njit(cache=True, nogil=True)
def model_views(mf, mi):
    """The model tuple as views of the flat buffers (no copy):
    (parent, jtype, E_tree, r_tree, inertia0, gravity, tcp_E, tcp_r, ints, xo, uo, po), with
    ints = [nb, tcp body, y offsets...]."""
    nb = mi[0]
    ints = mi[0:2 + N_YG]
    o = 2 + N_YG
    parent = mi[o:o + nb]
    o += nb
    jtype = mi[o:o + nb]
    o += nb
    xo = mi[o:o + N_XG]
    o += N_XG
    uo = mi[o:o + N_UG]
    o += N_UG
    po = mi[o:o + N_PG]
    f = 0
    E_tree = mf[f:f + 9 * nb].reshape((nb, 3, 3))
    f += 9 * nb
    r_tree = mf[f:f + 3 * nb].reshape((nb, 3))
    f += 3 * nb
    inertia0 = mf[f:f + 36 * nb].reshape((nb, 6, 6))
    f += 36 * nb
    gravity = mf[f:f + 3]
    f += 3
    tcp_E = mf[f:f + 9].reshape((3, 3))
    f += 9
    tcp_r = mf[f:f + 3]
    return (parent, jtype, E_tree, r_tree, inertia0, gravity, tcp_E, tcp_r, ints, xo, uo, po)


@njit(cache=True, nogil=True)
def work_views(wf, nb):
    """The work tuple (27 arrays) and gq as views of the flat work buffer (no copy)."""
    o = 0
    E = wf[o:o + 9 * nb].reshape((nb, 3, 3))
    o += 9 * nb
    r = wf[o:o + 3 * nb].reshape((nb, 3))
    o += 3 * nb
    v = wf[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    c = wf[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    pA = wf[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    IA = wf[o:o + 36 * nb].reshape((nb, 6, 6))
    o += 36 * nb
    U = wf[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    D = wf[o:o + nb]
    o += nb
    uu = wf[o:o + nb]
    o += nb
    acc = wf[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    T = wf[o:o + 54].reshape((6, 3, 3))
    o += 54
    tmp = wf[o:o + 6]
    o += 6
    inertia = wf[o:o + 36 * nb].reshape((nb, 6, 6))
    o += 36 * nb
    armature = wf[o:o + nb]
    o += nb
    f_ext = wf[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    ddq = wf[o:o + nb]
    o += nb
    tau_j = wf[o:o + nb]
    o += nb
    tau_dem = wf[o:o + nb]
    o += nb
    fric = wf[o:o + nb]
    o += nb
    fb = wf[o:o + 6 * nb].reshape((nb, 6))
    o += 6 * nb
    Rw = wf[o:o + 9 * nb].reshape((nb, 3, 3))
    o += 9 * nb
    pw = wf[o:o + 3 * nb].reshape((nb, 3))
    o += 3 * nb
    pos = wf[o:o + 3]
    o += 3
    J = wf[o:o + 6 * nb].reshape((6, nb))
    o += 6 * nb
    aux = wf[o:o + N_AUX]
    o += N_AUX
    load = wf[o:o + 2]
    o += 2
    sl = wf[o:o + 2]
    o += 2
    gq = wf[o:o + nb]
    work = (E, r, v, c, pA, IA, U, D, uu, acc, T, tmp, inertia, armature, f_ext, ddq, tau_j,
            tau_dem, fric, fb, Rw, pw, pos, J, aux, load, sl)
    return work, gq


@njit(cache=True, nogil=True)
def step(t, x, u, p, dt, n_sub, mf, mi, wf):
    """Advance x in place by dt (s) in n_sub semi-implicit Euler sub-steps; returns t + dt.

    x, u, p: flat state, input and parameter arrays (`layout`); mf (float64), mi (int64):
    the flat model (`ArmModel.mf`, `.mi`); wf: the flat work buffer. Nothing is allocated:
    the kernel works on views of these buffers, and a Python caller pays for unboxing nine
    arguments only.
    """
    model = model_views(mf, mi)
    work, gq = work_views(wf, mi[0])
    return step_views(t, x, u, p, dt, n_sub, model, work, gq)


@njit(cache=True, nogil=True)
def outputs(x, u, p, y, mf, mi, wf):
    """Write y (layout.OUTPUT_GROUPS) from the state: true, noise-free values."""
    model = model_views(mf, mi)
    work, gq = work_views(wf, mi[0])
    outputs_views(x, u, p, y, model, work, gq)


class ArmModel:
    """The arm plant's model and work tuples for one instance, plus its layout.

    tree: a `urdf.KinematicTree`; tcp: the link whose origin is the grasp point (its y axis is
    the finger axis). x, u, p, y: the instance's arrays (nominal values).
    """

    def __init__(self, tree, tcp: str):
        from plants.manipulator.chain import Chain

        self.tree = tree
        self.layout = Layout(tree.nb, tree)
        L = self.layout
        body, Etcp, rtcp = tree.frame(tcp)
        if body < 0:
            raise ValueError(f"TCP link {tcp!r} is on the fixed base")
        nb = tree.nb
        nf, ni = model_sizes(nb)
        self.mf = np.zeros(nf)
        self.mi = np.concatenate([np.array([nb, body], dtype=np.int64), L.offsets("y"), tree.parent,
                                  tree.joint_type, L.offsets("x"), L.offsets("u"), L.offsets("p")])
        assert self.mi.size == ni
        ch = Chain(tree)
        self.chain = ch
        self.mf[:] = np.concatenate([tree.E_tree.ravel(), tree.r_tree.ravel(), tree.inertia.ravel(),
                                     ch.gravity, np.asarray(Etcp).ravel(), np.asarray(rtcp).ravel()])
        self.wf = np.zeros(work_size(nb))
        #: views of mf/mi and wf (shared memory): model[5] is gravity (m/s^2, world), work[15] ddq,
        #: work[24] aux (A_* slots)
        self.model = model_views(self.mf, self.mi)
        self.work, self.gq = work_views(self.wf, nb)
        self.x = L.nominal("x")
        self.u = L.nominal("u")
        self.p = L.nominal("p")
        self.y = np.zeros(L.n("y"))
        self.t = 0.0

    @classmethod
    def panda(cls) -> "ArmModel":
        from plants.manipulator.chain import PANDA_TCP, load_panda

        return cls(load_panda(), PANDA_TCP)

    def scale_links(self, mass_scale) -> None:
        """Randomize the links physically: body i's mass and rotational inertia both scaled by
        mass_scale[i] > 0 (centre of mass kept). A positive multiple of a physically consistent
        spatial inertia stays consistent (positive definite, triangle inequalities hold), so
        any scale in (0, inf) gives a valid arm; the drive's gravity model follows (it reads the
        same model buffer, as a controller with an identified payload model would)."""
        scale = np.asarray(mass_scale, dtype=float)
        if scale.shape != (self.tree.nb,) or not (np.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError(f"mass_scale: expected {self.tree.nb} finite factors > 0, got {mass_scale!r}")
        self.model[4][:] = self.tree.inertia * scale[:, None, None]

    def step(self, dt: float, n_sub: int | None = None) -> None:
        """Advance by dt (s); n_sub defaults to ceil(dt / MAX_SUBSTEP)."""
        if n_sub is None:
            n_sub = max(1, math.ceil(dt / MAX_SUBSTEP * (1 - 1e-12)))
        self.t = step(self.t, self.x, self.u, self.p, dt, n_sub, self.mf, self.mi, self.wf)

    def compute_outputs(self) -> np.ndarray:
        outputs(self.x, self.u, self.p, self.y, self.mf, self.mi, self.wf)
        return self.y

    def xs(self, name):
        return self.x[self.layout.sl("x", name)]

    def us(self, name):
        return self.u[self.layout.sl("u", name)]

    def ps(self, name):
        return self.p[self.layout.sl("p", name)]

    def ys(self, name):
        return self.y[self.layout.sl("y", name)]


@njit(cache=True, nogil=True)
def tcp_kinematics(q, mf, mi, wf, pos, J):
    """TCP world position (m) and its 6 x nb world Jacobian (rows: angular, then linear
    velocity) at joint positions q: what a Cartesian workspace box is linearised with,
    `p(q + dq dt) ~ p(q) + J[3:] dq dt`. Uses the work buffer's kinematics scratch only."""
    model = model_views(mf, mi)
    work, gq = work_views(wf, mi[0])
    parent, jtype, E_tree, r_tree, inertia0, gravity, tcp_E, tcp_r, ints, xo, uo, po = model
    E = work[0]
    r = work[1]
    Rw = work[20]
    pw = work[21]
    dyn.frame_kinematics(parent, jtype, E_tree, r_tree, q, ints[1], tcp_r, E, r, Rw, pw, pos, J)


@njit(cache=True, nogil=True)
def gravity_torque(q, mf, mi, wf, out):
    """out = g(q) (N m): the joint torques holding the arm still at q (RNEA with dq = ddq = 0,
    the model's link inertias, no payload): the gravity compensation of a fallback joint PD
    `tau = kp (q_ref - q) - kd dq + g(q)`. Uses the work buffer's dynamics scratch (not to be
    called concurrently with `step` on the same buffers)."""
    model = model_views(mf, mi)
    work, gq = work_views(wf, mi[0])
    parent, jtype, E_tree, r_tree, inertia0, gravity, tcp_E, tcp_r, ints, xo, uo, po = model
    nb = ints[0]
    zeros = work[17]  # tau_dem scratch
    f_ext = work[14]
    for i in range(nb):
        zeros[i] = 0.0
        for k in range(6):
            f_ext[i, k] = 0.0
    dyn.rnea(parent, jtype, E_tree, r_tree, inertia0, zeros, gravity, q, zeros, zeros, f_ext, out,
             work[0], work[1], work[2], work[9], work[19], work[11])
