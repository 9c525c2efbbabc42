"""Secondary frequency control in the plant: AGC and under-frequency load shedding (UFLS).

The SoftPLC runs both over the wire for HIL (``[[softplc.loops]]`` AGC, ``[[softplc.rules]]``
UFLS stages); these are the same controllers inside the grid's step, so lockstep, gym and
campaign runs have them too. Parameters mirror the SoftPLC's::

    [plant]
    agc = { units = [30], kp = 50.0, ki = 10.0 }          # setpoint (Hz, default f0), out_min /
                                                          # out_max (MW, default the unit's Pmin/Pmax)
    ufls = { stages = [
        { below = 49.7, pickup_s = 0.5, buses = [59, 90, 116], shed = 0.10 },
        { below = 49.5, pickup_s = 0.3, buses = [54, 80, 15], shed = 0.15 },
    ] }                                                   # reset (Hz, default below), latch (default true)

AGC (per listed unit g, 1-based generator rows; a PI block as hil/control/pid.py computes it,
executed once per plant step at its start on the frequency f of the unit's island)::

    e = setpoint - f   (Hz);   I_g += ki e dt (MW; clamped: anti-windup as the PID block)
    P_set,eff,g = clip(P_set,g + kp e + I_g, out_min_g, out_max_g)     (MW)

UFLS (per stage and listed bus, a relay on the frequency of the bus's island, evaluated at the
end of each step): the timer runs while f < below; at ``pickup_s`` the stage trips and sheds
``shed`` (fraction) of the bus load from the next step on; a latched stage stays tripped (as
relays that need an operator to reconnect), an unlatched one releases at f >= reset. Stages
on one bus add up (capped at 1); the load shed is max(load.shed input, UFLS shed). A dead bus's
relay holds (no frequency, no trip).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from plants.grid.topology import DEAD

AGC_KEYS = ("units", "kp", "ki", "setpoint", "out_min", "out_max")
UFLS_KEYS = ("stages",)
STAGE_KEYS = ("below", "pickup_s", "buses", "shed", "reset", "latch")


def _num(where: str, v, low: float | None = None, strict: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise ValueError(f"{where}: {v!r} is not a finite number")
    f = float(v)
    if low is not None and (f <= low if strict else f < low):
        raise ValueError(f"{where}: {v!r} must be {'>' if strict else '>='} {low:g}")
    return f


def _keys(where: str, d, allowed) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a table ({{ ... }}), got {d!r}")
    for k in d:
        if k not in allowed:
            raise ValueError(f"{where}.{k}: unknown key (allowed: {', '.join(allowed)})")


class Agc:
    """Parsed ``[plant] agc``: arrays over the listed units (0-based generator rows)."""

    def __init__(self, opt: dict, case, f0_hz: float):
        _keys("agc", opt, AGC_KEYS)
        units = opt.get("units")
        if not isinstance(units, list) or not units:
            raise ValueError("agc.units: a non-empty list of generator rows (1-based) is required")
        rows = []
        for k, u in enumerate(units):
            if isinstance(u, bool) or not isinstance(u, int) or not 1 <= u <= case.n_gen:
                raise ValueError(f"agc.units[{k}]: {u!r} is not a generator row in 1..{case.n_gen}")
            rows.append(u - 1)
        if len(set(rows)) != len(rows):
            raise ValueError("agc.units: a unit is listed twice")
        self.units = np.array(rows, dtype=np.int64)
        self.kp = _num("agc.kp", opt.get("kp", 0.0), 0.0)
        self.ki = _num("agc.ki", opt.get("ki", 0.0), 0.0)
        if self.kp == 0.0 and self.ki == 0.0:
            raise ValueError("agc.kp / agc.ki: at least one gain must be > 0 (MW per Hz, MW per Hz s)")
        self.setpoint_hz = _num("agc.setpoint", opt.get("setpoint", f0_hz), 0.0, strict=True)
        lo = case.pmin_mw[self.units].astype(np.float64)
        hi = case.pmax_mw[self.units].astype(np.float64)
        if "out_min" in opt:
            lo = np.full(len(rows), _num("agc.out_min", opt["out_min"]))
        if "out_max" in opt:
            hi = np.full(len(rows), _num("agc.out_max", opt["out_max"]))
        if np.any(lo > hi):
            raise ValueError(f"agc.out_min / out_max: out_min {lo.max():g} MW > out_max {hi.min():g} MW")
        self.out_min_mw, self.out_max_mw = lo, hi


class Ufls:
    """Parsed ``[plant] ufls``: one entry per (stage, bus), 0-based bus indices."""

    def __init__(self, opt: dict, case, f0_hz: float):
        _keys("ufls", opt, UFLS_KEYS)
        stages = opt.get("stages")
        if not isinstance(stages, list) or not stages:
            raise ValueError("ufls.stages: a non-empty list of stages ({ below, pickup_s, buses, shed }) is required")
        bus, below, reset, pickup, shed, latch, stage = [], [], [], [], [], [], []
        for s, st in enumerate(stages):
            w = f"ufls.stages[{s}]"
            _keys(w, st, STAGE_KEYS)
            for req in ("below", "buses", "shed"):
                if req not in st:
                    raise ValueError(f"{w}.{req}: required")
            b = _num(f"{w}.below", st["below"], 0.0, strict=True)
            if not b < f0_hz:
                raise ValueError(f"{w}.below: {b:g} Hz must be below the nominal {f0_hz:g} Hz")
            r = _num(f"{w}.reset", st.get("reset", b), 0.0, strict=True)
            if r < b:
                raise ValueError(f"{w}.reset: {r:g} Hz must be >= below ({b:g} Hz)")
            p = _num(f"{w}.pickup_s", st.get("pickup_s", 0.0), 0.0)
            f = _num(f"{w}.shed", st["shed"], 0.0, strict=True)
            if f > 1.0:
                raise ValueError(f"{w}.shed: {f:g} is a fraction of the bus load, in (0, 1]")
            lt = st.get("latch", True)
            if not isinstance(lt, bool):
                raise ValueError(f"{w}.latch: {lt!r} is not true or false")
            buses = st["buses"]
            if not isinstance(buses, list) or not buses:
                raise ValueError(f"{w}.buses: a non-empty list of bus numbers is required")
            if len(set(buses)) != len(buses):
                raise ValueError(f"{w}.buses: a bus is listed twice")
            for k, num in enumerate(buses):
                try:
                    idx = case.bus_index(num) if isinstance(num, int) and not isinstance(num, bool) else None
                except (KeyError, ValueError, IndexError):
                    idx = None
                if idx is None:
                    raise ValueError(f"{w}.buses[{k}]: {num!r} is not a bus number of the case")
                bus.append(idx), below.append(b), reset.append(r), pickup.append(p), shed.append(f)
                latch.append(lt), stage.append(s)
        self.bus = np.array(bus, dtype=np.int64)
        self.below_hz = np.array(below)
        self.reset_hz = np.array(reset)
        self.pickup_s = np.array(pickup)
        self.shed = np.array(shed)
        self.latch = np.array(latch, dtype=np.bool_)
        self.stage = np.array(stage, dtype=np.int64)
        self.n_stages = len(stages)


@njit(cache=True, nogil=True)
def agc_setpoints(units, kp, ki, setpoint_hz, out_min, out_max, gen_bus, gen_on, role, island, dw, f0_hz, p_set_in,
                  integral, dt, advance, p_set_eff):
    """P setpoints the dispatch uses (MW): the inputs, with the AGC's units moved (module doc).

    ``advance``: integrate over dt (the step); False only evaluates (outputs between steps).
    A unit out of service, on a dead bus or with a non-finite setpoint holds its integral."""
    for g in range(p_set_in.shape[0]):
        p_set_eff[g] = p_set_in[g]
    for k in range(units.shape[0]):
        g = units[k]
        b = gen_bus[g]
        base = p_set_in[g]
        if gen_on[g] == 0 or role[b] == DEAD or not math.isfinite(base):
            continue
        e = setpoint_hz - f0_hz * (1.0 + dw[island[b]])
        p = kp * e
        if advance:
            cand = integral[k] + ki * e * dt
            rest = base + p
            if e > 0 and rest + cand > out_max[k]:
                cand = max(integral[k], out_max[k] - rest)
            elif e < 0 and rest + cand < out_min[k]:
                cand = min(integral[k], out_min[k] - rest)
            integral[k] = min(max(cand, out_min[k] - base), out_max[k] - base)
        p_set_eff[g] = min(max(base + p + integral[k], out_min[k]), out_max[k])


@njit(cache=True, nogil=True)
def ufls_relays(bus, below_hz, reset_hz, pickup_s, latch, role, island, dw, f0_hz, timer_s, active, dt):
    """Advance every UFLS relay by dt on its bus's island frequency; returns the number tripped now."""
    tripped = 0
    for e in range(bus.shape[0]):
        b = bus[e]
        if role[b] == DEAD:
            continue
        f = f0_hz * (1.0 + dw[island[b]])
        if active[e] != 0:
            if not latch[e] and f >= reset_hz[e]:
                active[e] = 0
                timer_s[e] = 0.0
            continue
        if f < below_hz[e]:
            timer_s[e] += dt
            if timer_s[e] >= pickup_s[e] - 1e-12:
                active[e] = 1
                tripped += 1
        else:
            timer_s[e] = 0.0
    return tripped


@njit(cache=True, nogil=True)
def combined_shed(load_shed, bus, shed, active, ufls_bus, shed_eff):
    """shed_eff = max(clip(load_shed, 0, 1) (non-finite: 0), min(1, sum of the tripped stages' fractions
    at the bus)); ``ufls_bus`` (n_bus) receives the UFLS part. Returns the number of tripped relays."""
    n_active = 0
    for i in range(shed_eff.shape[0]):
        ufls_bus[i] = 0.0
    for e in range(bus.shape[0]):
        if active[e] != 0:
            ufls_bus[bus[e]] += shed[e]
            n_active += 1
    for i in range(shed_eff.shape[0]):
        s = load_shed[i]
        s = min(max(s, 0.0), 1.0) if math.isfinite(s) else 0.0
        shed_eff[i] = max(s, min(ufls_bus[i], 1.0))
    return n_active
