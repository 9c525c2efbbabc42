"""Quasi-static dynamics per step: island frequency, conductor temperature, line protection, flows.

Frequency (per energized island, per unit on the system base ``baseMVA`` and f0)::

    M  d(dw)/dt   = dPm + Pagc - dPL - D dw          M    = sum_g 2 H_g Mbase_g / baseMVA   (pu s)
    Tg d(dPm)/dt  = -dPm - Kgov dw                    Kgov = sum_g Mbase_g / (R_g baseMVA) (pu/pu)
       d(Pagc)/dt = -Ki dw                            D    = d_load * P_load / baseMVA     (pu/pu)

with dw = (f - f0)/f0 and dPL the island's electrical demand beyond the generators' scheduled
power (load + losses - sum P_set, from the power flow of the step, held over the step). The
governor (dPm) and AGC (Pagc) power is shared among the island's governed generators in
proportion to Mbase_g / R_g; the slack bus supplies what the inertial and damping terms cover.
Integrated with RK4 at sub-steps of at most ``min(Tg, M / (D + Kgov)) / 20``; the test compares it
against the matrix-exponential closed form of the same linear system.

Conductor temperature (per line, exact first-order step, loading held over the step)::

    T_ss = T_amb + dT_rated * loading^2;   T <- T_ss + (T - T_ss) exp(-dt / tau)

Protection (Grid2Op semantics): a line whose loading exceeds ``soft`` (1.0 = 100 %) counts one
step of overflow per step (once per step, not per cascade round); it trips when the count
exceeds ``allowed_steps``; loading above ``hard`` (e.g. 2.0) trips at once, in any cascade round;
a conductor above ``temp_trip_c`` trips at once. A tripped line cannot be reclosed for
``cooldown_steps`` steps.
"""

from __future__ import annotations

import math

from numba import njit


@njit(cache=True, nogil=True)
def _freq_rhs(dw, dpm, pagc, dpl, m, d, kgov, tg, ki):
    return ((dpm + pagc - dpl - d * dw) / m, (-dpm - kgov * dw) / tg, -ki * dw)


@njit(cache=True, nogil=True)
def frequency_step(dw, dpm, pagc, dpl, m, d, kgov, tg, ki, dt, state_out):
    """Advance one island's (dw, dPm, Pagc) by dt (s) with constant dPL; writes ``state_out[3]``.

    Units: dw in pu of f0, powers in pu of baseMVA, m in pu*s, tg in s, ki in pu/(pu s).
    Returns the number of RK4 sub-steps used (no allocation).
    """
    tau = m / (d + kgov) if d + kgov > 0.0 else m
    hmax = min(tg, tau) / 20.0
    n = max(1, int(math.ceil(dt / hmax)))
    h = dt / n
    x0, x1, x2 = dw, dpm, pagc
    for _ in range(n):
        a0, a1, a2 = _freq_rhs(x0, x1, x2, dpl, m, d, kgov, tg, ki)
        b0, b1, b2 = _freq_rhs(x0 + 0.5 * h * a0, x1 + 0.5 * h * a1, x2 + 0.5 * h * a2, dpl, m, d, kgov, tg, ki)
        c0, c1, c2 = _freq_rhs(x0 + 0.5 * h * b0, x1 + 0.5 * h * b1, x2 + 0.5 * h * b2, dpl, m, d, kgov, tg, ki)
        e0, e1, e2 = _freq_rhs(x0 + h * c0, x1 + h * c1, x2 + h * c2, dpl, m, d, kgov, tg, ki)
        x0 += h / 6.0 * (a0 + 2.0 * b0 + 2.0 * c0 + e0)
        x1 += h / 6.0 * (a1 + 2.0 * b1 + 2.0 * c1 + e1)
        x2 += h / 6.0 * (a2 + 2.0 * b2 + 2.0 * c2 + e2)
    state_out[0] = x0
    state_out[1] = x1
    state_out[2] = x2
    return n


@njit(cache=True, nogil=True)
def thermal_step(loading, temp_c, t_amb_c, dtemp_rated_k, tau_s, dt):
    """Exact first-order conductor temperature step (deg C) for every line, in place."""
    for l in range(temp_c.shape[0]):
        t_ss = t_amb_c + dtemp_rated_k[l] * loading[l] * loading[l]
        temp_c[l] = t_ss + (temp_c[l] - t_ss) * math.exp(-dt / tau_s[l])


@njit(cache=True, nogil=True)
def protection(loading, temp_c, br_status, overflow_steps, cooldown, count_step, soft, hard,
               allowed_steps, temp_trip_c, cooldown_steps, tripped):
    """Trip overloaded lines in place (see module doc). ``tripped`` (int8) marks lines opened now.

    ``count_step``: True in the first cascade round of a step (overflow counters advance once).
    Returns the number of lines tripped.
    """
    n_trip = 0
    for l in range(loading.shape[0]):
        tripped[l] = 0
        if br_status[l] == 0:
            overflow_steps[l] = 0
            continue
        over = loading[l] > soft
        if count_step:
            overflow_steps[l] = overflow_steps[l] + 1 if over else 0
        if loading[l] > hard or overflow_steps[l] > allowed_steps or temp_c[l] > temp_trip_c:
            br_status[l] = 0
            overflow_steps[l] = 0
            cooldown[l] = cooldown_steps
            tripped[l] = 1
            n_trip += 1
    return n_trip


@njit(cache=True, nogil=True)
def branch_flows(f_bus, t_bus, y4, vm, va, base_mva, rate_a_mva, pf, qf, pt, qt, i_pu, loading):
    """Branch flows (MW, MVAr at each end), current (pu, larger end) and loading (|I| / rating).

    The rating ``rate_a_mva`` is read as the current at 1 pu voltage (I_rated = rate / baseMVA pu),
    so loading = max(|I_f|, |I_t|) * baseMVA / rate; a rating of 0 means unlimited (loading 0).
    """
    for l in range(f_bus.shape[0]):
        f, t = f_bus[l], t_bus[l]
        vf = vm[f] * complex(math.cos(va[f]), math.sin(va[f]))
        vt = vm[t] * complex(math.cos(va[t]), math.sin(va[t]))
        i_f = y4[l, 0] * vf + y4[l, 1] * vt
        i_t = y4[l, 2] * vf + y4[l, 3] * vt
        sf = vf * i_f.conjugate() * base_mva
        st = vt * i_t.conjugate() * base_mva
        pf[l], qf[l], pt[l], qt[l] = sf.real, sf.imag, st.real, st.imag
        i = max(abs(i_f), abs(i_t))
        i_pu[l] = i
        loading[l] = i * base_mva / rate_a_mva[l] if rate_a_mva[l] > 0.0 else 0.0
