"""Per-island aggregates and bus injections for one step (Numba, no allocation).

Per island root r (see ``topology.py``), in pu of baseMVA:
``m[r]`` = sum 2 H_g Mbase_g / baseMVA (pu s), ``kgov[r]`` = sum Mbase_g / (R_g baseMVA) over
generators with a governor (R_g > 0 and Pmax > Pmin: a synchronous condenser has none), ``p_sched[r]`` = sum of scheduled generator P, ``p_load[r]``
= island load. Generator electrical output in the power flow (MW)::

    P_g = clip(P_set_g * scale_g + Mbase_g / (R_g Kgov baseMVA) * (dPm + Pagc)[r] * baseMVA, Pmin, Pmax)
          + share_g

``share_g`` is the generator's part of the island's instantaneous imbalance (the power its rotor's
kinetic energy delivers before governors act), shared in proportion to H_g Mbase_g (Mbase_g if
the island has no inertia). It is found by outer iterations around Newton: the slack bus's
output beyond its own dispatch is redistributed over all the island's generators (slack
included) until it is below tolerance; each round multiplies the residual by the slack's share,
so two or three warm Newton solves suffice. Without it the slack bus alone would pick up a lost
500 MW unit and overload the lines around it, which no real system does.
"""

from __future__ import annotations

import math

from numba import njit

from plants.grid.topology import DEAD, ROLE_PQ, ROLE_PV, SLACK


@njit(cache=True, nogil=True)
def island_aggregates(island, role, pd_mw, load_scale, gen_bus, gen_on, p_set_mw, gen_scale, h_s, mbase_mva,
                      droop_pu, pmin_mw, pmax_mw, base_mva, m, kgov, p_sched, p_load):
    """Fill the per-root arrays m, kgov, p_sched, p_load (pu; zero at non-roots and dead islands)."""
    n = island.shape[0]
    for i in range(n):
        m[i] = 0.0
        kgov[i] = 0.0
        p_sched[i] = 0.0
        p_load[i] = 0.0
    for i in range(n):
        if role[i] != DEAD:
            p_load[island[i]] += pd_mw[i] * load_scale[i] / base_mva
    for g in range(gen_bus.shape[0]):
        b = gen_bus[g]
        if gen_on[g] == 0 or role[b] == DEAD:
            continue
        r = island[b]
        m[r] += 2.0 * h_s[g] * mbase_mva[g] / base_mva
        if droop_pu[g] > 0.0 and pmax_mw[g] > pmin_mw[g]:
            kgov[r] += mbase_mva[g] / (droop_pu[g] * base_mva)
        p = p_set_mw[g] * gen_scale[g]
        p_sched[r] += (p if math.isfinite(p) else pmin_mw[g]) / base_mva


@njit(cache=True, nogil=True)
def dispatch(island, role, gen_bus, gen_on, p_set_mw, gen_scale, mbase_mva, droop_pu, pmin_mw, pmax_mw,
             kgov, dpm, pagc, base_mva, p_share_mw, p_gen_mw):
    """Generator electrical P (MW) for the power flow: schedule plus governor/AGC share, clipped."""
    for g in range(gen_bus.shape[0]):
        b = gen_bus[g]
        if gen_on[g] == 0 or role[b] == DEAD:
            p_gen_mw[g] = 0.0
            p_share_mw[g] = 0.0
            continue
        r = island[b]
        p = p_set_mw[g] * gen_scale[g]
        if not math.isfinite(p):
            p = pmin_mw[g]   # a garbled setpoint: the unit goes to its minimum
        if droop_pu[g] > 0.0 and pmax_mw[g] > pmin_mw[g] and kgov[r] > 0.0:
            p += mbase_mva[g] / (droop_pu[g] * base_mva * kgov[r]) * (dpm[r] + pagc[r]) * base_mva
        if p > pmax_mw[g]:
            p = pmax_mw[g]
        if p < pmin_mw[g]:
            p = pmin_mw[g]
        p_gen_mw[g] = p + p_share_mw[g]


@njit(cache=True, nogil=True)
def share_residual(island, role, slack_of_root, gen_bus, gen_on, h_s, mbase_mva, V, I, pd_mw, load_scale, base_mva,
                   p_gen_mw, weight_sum, p_share_mw):
    """Redistribute each island's slack residual (MW) over its generators; returns the largest |residual|.

    residual = solved P of the slack bus's generation - the dispatch of its generators. ``weight_sum``
    (float64, n_bus) is work. ``p_share_mw`` is updated in place (see module doc)."""
    n = island.shape[0]
    for i in range(n):
        weight_sum[i] = 0.0
    for g in range(gen_bus.shape[0]):
        b = gen_bus[g]
        if gen_on[g] != 0 and role[b] != DEAD:
            weight_sum[island[b]] += h_s[g] * mbase_mva[g]
    worst = 0.0
    for r in range(n):
        b = slack_of_root[r]
        if b < 0:
            continue
        target = 0.0
        for g in range(gen_bus.shape[0]):
            if gen_bus[g] == b and gen_on[g] != 0:
                target += p_gen_mw[g]
        actual = (V[b] * I[b].conjugate()).real * base_mva + pd_mw[b] * load_scale[b]
        resid = actual - target
        if abs(resid) > worst:
            worst = abs(resid)
        use_h = weight_sum[r] > 0.0
        total = weight_sum[r]
        if not use_h:
            for g in range(gen_bus.shape[0]):
                if gen_on[g] != 0 and role[gen_bus[g]] != DEAD and island[gen_bus[g]] == r:
                    total += mbase_mva[g]
        if total <= 0.0:
            continue
        for g in range(gen_bus.shape[0]):
            if gen_on[g] != 0 and role[gen_bus[g]] != DEAD and island[gen_bus[g]] == r:
                w = h_s[g] * mbase_mva[g] if use_h else mbase_mva[g]
                p_share_mw[g] += resid * w / total
    return worst


@njit(cache=True, nogil=True)
def bus_injections(role, pd_mw, qd_mvar, load_scale, gen_bus, gen_on, p_gen_mw, base_mva, sbus):
    """Complex bus injection (pu): generation minus scaled load; dead buses 0."""
    for i in range(role.shape[0]):
        if role[i] == DEAD:
            sbus[i] = 0j
        else:
            sbus[i] = -complex(pd_mw[i], qd_mvar[i]) * load_scale[i] / base_mva
    for g in range(gen_bus.shape[0]):
        b = gen_bus[g]
        if gen_on[g] != 0 and role[b] != DEAD:
            sbus[b] += p_gen_mw[g] / base_mva


@njit(cache=True, nogil=True)
def electrical_generation(island, role, V, I, pd_mw, load_scale, base_mva, p_elec):
    """Per-root electrical generation (pu) from a solved flow: sum over buses of P_inj + P_load."""
    n = island.shape[0]
    for i in range(n):
        p_elec[i] = 0.0
    for i in range(n):
        if role[i] != DEAD:
            p_elec[island[i]] += (V[i] * I[i].conjugate()).real + pd_mw[i] * load_scale[i] / base_mva


@njit(cache=True, nogil=True)
def slack_generation(role, gen_bus, gen_on, V, I, pd_mw, load_scale, base_mva, p_gen_mw):
    """Set the first in-service generator of each slack bus to the bus's solved P (MW), others' P kept."""
    for g in range(gen_bus.shape[0]):
        b = gen_bus[g]
        if gen_on[g] == 0 or role[b] != SLACK:
            continue
        p_bus = (V[b] * I[b].conjugate()).real * base_mva + pd_mw[b] * load_scale[b]
        others = 0.0
        first = True
        for h in range(gen_bus.shape[0]):
            if gen_bus[h] == b and gen_on[h] != 0 and h != g:
                others += p_gen_mw[h]
                if h < g:
                    first = False
        if first:
            p_gen_mw[g] = p_bus - others


@njit(cache=True, nogil=True)
def split_bus_q(role, gen_bus, gen_on, qmax_mvar, qmin_mvar, bus_q_mvar, q_gen_mvar):
    """Split each generator bus's reactive generation (MVAr) among its in-service units in proportion
    to their Q ranges (equally when all ranges are zero), as MATPOWER's pfsoln does."""
    for g in range(gen_bus.shape[0]):
        b = gen_bus[g]
        if gen_on[g] == 0 or role[b] == DEAD:
            q_gen_mvar[g] = 0.0
            continue
        total_range = 0.0
        count = 0
        for h in range(gen_bus.shape[0]):
            if gen_bus[h] == b and gen_on[h] != 0:
                total_range += abs(qmax_mvar[h] - qmin_mvar[h])
                count += 1
        if total_range > 0.0:
            q_gen_mvar[g] = bus_q_mvar[b] * abs(qmax_mvar[g] - qmin_mvar[g]) / total_range
        else:
            q_gen_mvar[g] = bus_q_mvar[b] / count


@njit(cache=True, nogil=True)
def bus_generation_q(role, V, I, qd_mvar, load_scale, base_mva, bus_q_mvar):
    """Reactive generation at each bus (MVAr): solved Q injection plus the bus's scaled reactive load."""
    for i in range(role.shape[0]):
        if role[i] == DEAD:
            bus_q_mvar[i] = 0.0
        else:
            bus_q_mvar[i] = (V[i] * I[i].conjugate()).imag * base_mva + qd_mvar[i] * load_scale[i]


@njit(cache=True, nogil=True)
def q_limit_switch(role, gen_bus, gen_on, qmax_mvar, qmin_mvar, bus_q_mvar, q_limited, q_fixed_mvar):
    """PV buses whose reactive generation exceeds the sum of their units' limits become PQ with Q held
    at that limit (MATPOWER's enforce_q_lims, all violators at once, no switching back within a step).
    ``q_limited`` (int8, n_bus) and ``q_fixed_mvar`` record it. Returns the number switched now."""
    switched = 0
    for b in range(role.shape[0]):
        if role[b] != ROLE_PV or q_limited[b] != 0:
            continue
        qmax = 0.0
        qmin = 0.0
        for g in range(gen_bus.shape[0]):
            if gen_bus[g] == b and gen_on[g] != 0:
                qmax += qmax_mvar[g]
                qmin += qmin_mvar[g]
        if bus_q_mvar[b] > qmax + 1e-6:
            q_limited[b] = 1
            q_fixed_mvar[b] = qmax
            switched += 1
        elif bus_q_mvar[b] < qmin - 1e-6:
            q_limited[b] = -1
            q_fixed_mvar[b] = qmin
            switched += 1
    return switched


@njit(cache=True, nogil=True)
def apply_q_limits(q_limited, q_fixed_mvar, base_mva, role, sbus):
    """Q-limited buses: role PQ and their reactive generation (at the limit) added to the injection."""
    for b in range(role.shape[0]):
        if q_limited[b] != 0 and role[b] == ROLE_PV:
            role[b] = ROLE_PQ
        if q_limited[b] != 0 and role[b] == ROLE_PQ:
            sbus[b] += 1j * q_fixed_mvar[b] / base_mva
