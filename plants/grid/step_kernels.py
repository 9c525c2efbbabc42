"""The bookkeeping of ``GridModel.step`` as allocation-free Numba kernels.

Breaker commands, island-state inheritance, warm-start preparation, island frequency and the
output arrays. Kept apart from the physics modules so each of those stays one model.
"""

from __future__ import annotations

import math

from numba import njit

from plants.grid.dynamics import frequency_step
from plants.grid.topology import DEAD


@njit(cache=True, nogil=True)
def apply_commands(cmd_open, cmd_close, br_status, cooldown):
    """Count cooldowns down one step, then apply commands: open wins over close; a close applies
    only once the line's cooldown is 0. Returns True if any branch changed state."""
    changed = False
    for l in range(br_status.shape[0]):
        if cooldown[l] > 0:
            cooldown[l] -= 1
        if cmd_open[l] != 0:
            if br_status[l] != 0:
                changed = True
            br_status[l] = 0
        elif cmd_close[l] != 0 and cooldown[l] == 0 and br_status[l] == 0:
            br_status[l] = 1
            changed = True
    return changed


@njit(cache=True, nogil=True)
def inherit_island_state(island, old_island, old_dw, old_dpm, old_pagc, dw, dpm, pagc):
    """Each new island root takes the state of the old island its root bus belonged to."""
    for i in range(island.shape[0]):
        if island[i] == i:
            src = old_island[i]
            dw[i] = old_dw[src]
            dpm[i] = old_dpm[src]
            pagc[i] = old_pagc[src]


@njit(cache=True, nogil=True)
def prepare_voltages(role, island, slack_of_root, gen_bus, gen_on, v_set_pu, vm, va, flat):
    """Warm start for Newton: a live bus below 0.5 pu (re-energized) or every live bus if ``flat``
    restarts at 1 pu and its slack's angle; generator buses take their voltage setpoint (a setpoint
    that is not finite or outside 0.5..1.5 pu is ignored: the bus keeps its last voltage)."""
    for i in range(role.shape[0]):
        if role[i] != DEAD and (flat or vm[i] < 0.5):
            vm[i] = 1.0
            va[i] = va[slack_of_root[island[i]]]
    for g in range(gen_bus.shape[0]):
        b = gen_bus[g]
        if gen_on[g] != 0 and role[b] != DEAD and math.isfinite(v_set_pu[g]) and 0.5 < v_set_pu[g] < 1.5:
            vm[b] = v_set_pu[g]


@njit(cache=True, nogil=True)
def zero_dead(role, vm, va):
    for i in range(role.shape[0]):
        if role[i] == DEAD:
            vm[i] = 0.0
            va[i] = 0.0


@njit(cache=True, nogil=True)
def island_frequency(island, slack_of_root, m, kgov, p_load, p_elec, p_sched, dw, dpm, pagc, load_damping,
                     min_inertia, tg, ki, f0_hz, freq_trip_hz, dt, bus_dead, x3):
    """Advance every energized island's frequency state by dt; latch islands beyond ``freq_trip_hz``
    as blacked out. Dead islands' states are zeroed. Returns True if an island blacked out."""
    n = island.shape[0]
    blacked = False
    for r in range(n):
        if slack_of_root[r] < 0:
            if island[r] == r:
                dw[r] = 0.0
                dpm[r] = 0.0
                pagc[r] = 0.0
            continue
        mr = m[r] if m[r] > min_inertia else min_inertia
        frequency_step(dw[r], dpm[r], pagc[r], p_elec[r] - p_sched[r], mr, load_damping * p_load[r], kgov[r],
                       tg, ki, dt, x3)
        dw[r] = x3[0]
        dpm[r] = x3[1]
        pagc[r] = x3[2]
        if math.fabs(x3[0]) * f0_hz > freq_trip_hz:
            blacked = True
            for i in range(n):
                if island[i] == r:
                    bus_dead[i] = 1
    return blacked


@njit(cache=True, nogil=True)
def publish(role, island, vm, va, dw, f0_hz, pd_mw, load_scale, gen_on, vm_out, va_deg_out, island_out, freq_out,
            p_gen_mw, served_unserved):
    """Output arrays; dead buses read 0 (island -1). ``served_unserved[0:2]`` = load MW served, not."""
    served = 0.0
    unserved = 0.0
    for i in range(role.shape[0]):
        load = pd_mw[i] * load_scale[i]
        if role[i] == DEAD:
            vm_out[i] = 0.0
            va_deg_out[i] = 0.0
            island_out[i] = -1
            freq_out[i] = 0.0
            unserved += load
        else:
            vm_out[i] = vm[i]
            va_deg_out[i] = va[i] * 180.0 / math.pi
            island_out[i] = island[i]
            freq_out[i] = f0_hz * (1.0 + dw[island[i]])
            served += load
    for g in range(gen_on.shape[0]):
        if gen_on[g] == 0:
            p_gen_mw[g] = 0.0
    served_unserved[0] = served
    served_unserved[1] = unserved


@njit(cache=True, nogil=True)
def effective_scales(load_scale, prof_load, load_shed, gen_scale, prof_gen, load_eff, gen_eff):
    """load_eff = load_scale * profile * (1 - clip(shed, 0, 1)); gen_eff = gen_scale * profile (>= 0).

    A non-finite input reads as nominal (scale 1, no shed): a garbled register never blacks out the grid."""
    for i in range(load_eff.shape[0]):
        shed = load_shed[i] if math.isfinite(load_shed[i]) else 0.0
        shed = min(max(shed, 0.0), 1.0)
        scale = load_scale[i] if math.isfinite(load_scale[i]) else 1.0
        load_eff[i] = max(scale, 0.0) * prof_load[i] * (1.0 - shed)
    for g in range(gen_eff.shape[0]):
        scale = gen_scale[g] if math.isfinite(gen_scale[g]) else 1.0
        gen_eff[g] = max(scale, 0.0) * prof_gen[g]


@njit(cache=True, nogil=True)
def sync_changed(src, dst):
    """Copy src into dst; True if any element differed (a topology change detector)."""
    changed = False
    for i in range(src.shape[0]):
        if dst[i] != src[i]:
            dst[i] = src[i]
            changed = True
    return changed


@njit(cache=True, nogil=True)
def shed_load_mw(pd_mw, load_scale, prof_load, load_shed):
    """MW of load shed on purpose: sum_i pd_i * max(scale_i, 0) * profile_i * clip(shed_i, 0, 1)
    (non-finite inputs read as effective_scales reads them: nominal scale, no shed)."""
    total = 0.0
    for i in range(pd_mw.shape[0]):
        shed = load_shed[i] if math.isfinite(load_shed[i]) else 0.0
        shed = min(max(shed, 0.0), 1.0)
        scale = load_scale[i] if math.isfinite(load_scale[i]) else 1.0
        total += pd_mw[i] * max(scale, 0.0) * prof_load[i] * shed
    return total


@njit(cache=True, nogil=True)
def dead_count(role):
    """Buses without voltage (role DEAD)."""
    n = 0
    for i in range(role.shape[0]):
        if role[i] == DEAD:
            n += 1
    return n
