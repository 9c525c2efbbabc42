"""Joint drives: friction, joint stops, the drive's control modes and the current loop.

Scalar `@njit(cache=True, nogil=True)` functions, per joint, SI units (joint side: N m,
rad, rad/s; prismatic joints read N, m, m/s). The arm step (`arm.py`) calls them once per
joint per sub-step. Readable equations:

    friction(dq)  = (Fc + (Fs - Fc) exp(-(dq / vs)^2)) tanh(dq / eps) + Fv dq
    stop(q, dq)   = -K (q - q_hi) - D dq, kept <= 0, when q > q_hi   (mirror below q_lo)
    demand        = torque:   tau_cmd                         (+ g(q) if gravity_comp)
                    position: kp (q_cmd - q) - kd dq          (+ g(q))
                    velocity: kv (dq_cmd - dq) + ki z,  z' = dq_cmd - dq   (+ g(q))
    tau_demand    = clip(demand, -effort, effort)
    current loop  : T tau_m' = tau_demand - tau_m, stepped exactly over h (zero-order hold):
                    tau_m <- tau_demand + (tau_m - tau_demand) exp(-h / T)

The smooth Coulomb term (tanh with `eps`, default 0.02 rad/s) has slope Fs / eps at rest: a
stiff damper the semi-implicit step must resolve; with the Panda's armature (>= 0.05 kg m^2)
and Fs <= 1.7 N m its time constant is >= 0.6 ms, above MAX_SUBSTEP (0.25 ms).
"""

from __future__ import annotations

import math

from numba import njit


@njit(cache=True, nogil=True)
def friction_torque(dq, coulomb, stribeck, stribeck_speed, viscous, smoothing):
    """Joint friction torque (N m) opposing motion: Coulomb + Stribeck + viscous, smooth at 0."""
    r = dq / stribeck_speed
    level = coulomb + (stribeck - coulomb) * math.exp(-r * r)
    return level * math.tanh(dq / smoothing) + viscous * dq


@njit(cache=True, nogil=True)
def stop_torque(q, dq, q_lower, q_upper, stiffness, damping):
    """Joint stop as a stiff spring-damper (N m); zero inside [q_lower, q_upper], never pulls."""
    if q > q_upper:
        t = -stiffness * (q - q_upper) - damping * dq
        return t if t < 0.0 else 0.0
    if q < q_lower:
        t = stiffness * (q_lower - q) - damping * dq
        return t if t > 0.0 else 0.0
    return 0.0


@njit(cache=True, nogil=True)
def drive_demand(mode, q, dq, tau_cmd, q_cmd, dq_cmd, z, g, kp, kd, kv, ki, effort):
    """Torque the drive asks of its current loop (N m), clipped to +-effort.

    mode: 0 torque, 1 position, 2 velocity (anything else: torque). z: velocity-error
    integral (rad). g: gravity torque added by the drive (0 to leave it to the user).
    """
    if mode == 1:
        d = kp * (q_cmd - q) - kd * dq + g
    elif mode == 2:
        d = kv * (dq_cmd - dq) + ki * z + g
    else:
        d = tau_cmd + g
    if d > effort:
        return effort
    if d < -effort:
        return -effort
    return d


@njit(cache=True, nogil=True)
def current_loop(tau_motor, tau_demand, h, time_constant):
    """First-order current (torque) loop stepped exactly over h (s): the new motor torque."""
    return tau_demand + (tau_motor - tau_demand) * math.exp(-h / time_constant)
