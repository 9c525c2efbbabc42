"""Gripper and grasped object: Hunt-Crossley normal contact, Coulomb friction cone, stick/slip.

Geometry: two fingers close symmetrically along the TCP y axis; `w` is the pad distance (m).
An object of width `w_o` (m) between them is compressed by `delta = (w_o - w) / 2` per pad
(m). The normal force per pad is the Hunt-Crossley law (Hunt & Crossley 1975)

    F_n = k delta^n + lambda delta^n delta',   lambda = k * hc_damping,   F_n >= 0

(no pull: a receding pad cannot glue), with delta' = -w' / 2. The pads hold the object by
friction in their plane (TCP x and z): the load they must carry is the object's inertial
force minus its weight, f = m_o (a - g), of which only the components in the pad plane count
(the normal component moves the object between the pads, which this symmetric model leaves
out). The friction cone of two pads: |f_t| <= mu_s * 2 F_n.

- sticking: the object moves with the TCP; the pads carry f_t; slip starts when
  |f_t| > mu_s * 2 F_n (the `slip` output and a `slip_events` count).
- sliding: the object slides along the pads with relative acceleration
  m_o s'' = -f_t - mu_k 2 F_n s'/|s'| (kinetic friction opposing the slide); it sticks again
  when |s'| < stick_speed and the cone holds again; it is lost once |s| > slide_max.

Gripper drive (per finger, closing force positive, N):
    F_g = clip(kp (w - w_cmd) + kd w', -F_max, min(F_cmd, F_max))
    w'' = 2 (F_n - F_g) / m_f     (each finger moves w/2; m_f the effective finger mass, kg)
so a closed grasp squeezes with F_n = F_cmd at rest (force-limited grasp, as the Franka
Hand's `grasp`). Pads stop at w in [0, w_max] (inelastic stop).
"""

from __future__ import annotations

import math

from numba import njit


@njit(cache=True, nogil=True)
def hunt_crossley(delta, delta_rate, stiffness, exponent, damping_ratio):
    """Normal force (N) of one pad: k d^n + (k * damping_ratio) d^n d', zero without overlap or pull."""
    if delta <= 0.0:
        return 0.0
    dn = delta ** exponent
    f = stiffness * dn * (1.0 + damping_ratio * delta_rate)
    return f if f > 0.0 else 0.0


@njit(cache=True, nogil=True)
def gripper_force(w, dw, w_cmd, f_cmd, kp, kd, f_max):
    """Gripper drive force per finger (N, closing positive), limited by the grasp force command."""
    f = kp * (w - w_cmd) + kd * dw
    hi = f_cmd if f_cmd < f_max else f_max
    if hi < 0.0:
        hi = 0.0
    if f > hi:
        return hi
    if f < -f_max:
        return -f_max
    return f


@njit(cache=True, nogil=True)
def slide_step(h, s, ds, load, f_n, mass, mu_k):
    """One semi-implicit step of the sliding object along one pad-plane axis pair.

    s, ds: (2,) slide (m) and its rate (m/s), updated in place. load: (2,) tangential load the
    pads would have to carry (N). Returns nothing; kinetic friction opposes ds (or, from
    rest, the load), and is capped so it cannot reverse the slide within one step.
    """
    cap = mu_k * 2.0 * f_n
    sp = math.sqrt(ds[0] * ds[0] + ds[1] * ds[1])
    if sp > 1e-12:
        d0 = ds[0] / sp
        d1 = ds[1] / sp
    else:
        ln = math.sqrt(load[0] * load[0] + load[1] * load[1])
        if ln > 0.0:
            d0 = -load[0] / ln
            d1 = -load[1] / ln
        else:
            d0 = 0.0
            d1 = 0.0
    # relative acceleration without friction, then friction opposing motion
    for k in range(2):
        dk = d0 if k == 0 else d1
        ds[k] += h * (-load[k] - cap * dk) / mass if mass > 0.0 else 0.0
    # friction cannot reverse the direction of the slide within one step (it stops it)
    if sp > 1e-12 and ds[0] * d0 + ds[1] * d1 < 0.0:
        ln = math.sqrt(load[0] * load[0] + load[1] * load[1])
        if ln <= cap:
            ds[0] = 0.0
            ds[1] = 0.0
    s[0] += h * ds[0]
    s[1] += h * ds[1]
