"""Test plant for the grown plant contract ("step" form, plants/base.py): resistive heaters
fed by one nonlinear source, its spec built at load time from a small model file.

Scenario: `[plant] model = "tests.plants.array_plant"`, `file = "data/heaters.toml"` (the
model file, a FILE_OPTION: relative to the scenario file). tests/plants/data/heaters.toml is
the reference file; the element ids are the file's (3, 7, 12, 20), so the signals are
`node_3.temp`, `heater_7.duty`, `link_2.g`, grouped as `node.temp[4]`, `heater.duty[4]`, ...

Physics (SI units, time in s):

    R_i(T_i)  = r0_i * (1 + alpha * (T_i - T_amb))             heater resistance, ohm
    on_i      = duty_i * (1 - tripped_i)                       duty 0..1, a trip cuts it
    G         = sum_i on_i / R_i                               load conductance, S
    algebraic: the source voltage V (z[0]) solves, each sub-step,
        f(V) = I_sc - I_0 * (exp(V / V_t) - 1) - G * V = 0     (0 <= V <= V_oc)
      by safeguarded Newton warm-started from the last solution (z carries it)
    P_i       = on_i * V^2 / R_i                               heater power, W
    q_i       = sum over links (a, b, g): +g (T_b - T_a) at a, -g (T_b - T_a) at b, W
    C_i dT_i/dt = P_i + q_i - G_amb,i (T_i - T_amb)

Integration (the plant's own step, no RK4): per sub-step h, solve V, freeze P_i + q_i,
then the ambient part exactly:
    T_inf = T_amb + (P_i + q_i) / G_amb,i;  T_i <- T_inf + (T_i - T_inf) exp(-G_amb,i h / C_i)
The explicit link coupling is stable for h <= C_i / sum_links(g) (we keep half of it) and
the protection timer resolves trip_delay_s / 10, so the model file sets MAX_SUBSTEP:
    max_substep = min(0.5 * min_i C_i / sum_{l at i} g_l, trip_delay_s / 10)

Discrete state (events inside the step, int64): per node `tripped` (0/1) and `over_us`
(microseconds spent above trip_K in a row); a node above trip_K for trip_delay_s trips;
with the `reset` input >= 0.5 a tripped node below reset_K is cleared. `solver.iterations`
holds the Newton iterations of the last solve (a warm start needs fewer).

Parameter randomization hook: a node's size factor s scales its capacity by s and its
ambient conductance by s^(2/3) together (a bigger heater has more surface), link
conductances and cold resistances get their own factors; every draw is positive and
clipped to the bounds (0.3x..3x the file's values).
"""

from __future__ import annotations

import functools
import math
import tomllib
from pathlib import Path

import numpy as np
from numba import njit

from plants.base import PlantModel
from plants.spec import Quantity, SpecBuilder, element_names

OPTIONS = {"file": "model file (TOML: nodes, links, source, protection)"}
FILE_OPTIONS = ("file",)
ALPHA_PER_K = 0.004  # temperature coefficient of the heater resistance, 1/K (nominal)

# layout vector (data[0], int64): counts and offsets into p, y, d
(L_N, L_M, L_P_CAP, L_P_GAMB, L_P_R0, L_P_LINKG, L_P_SCALAR,
 L_Y_TEMP, L_Y_POWER, L_Y_TRIP, L_Y_SCALAR, L_D_TRIP, L_D_OVER, L_D_ITER, L_U_RESET) = range(15)
# scalar parameters, in order from layout[L_P_SCALAR]
S_AMB, S_ISC, S_I0, S_VT, S_TRIP, S_RESET, S_DELAY, S_ALPHA = range(8)


@njit(cache=True, nogil=True)
def solve_supply(v0, g, i_sc, i_0, v_t):
    """V solving I_sc - I_0 (exp(V/V_t) - 1) - g V = 0 on [0, V_oc], Newton from v0 with
    bisection as the safeguard (f is decreasing and concave); returns (V, iterations)."""
    v_oc = v_t * math.log(i_sc / i_0 + 1.0)
    lo, hi = 0.0, v_oc
    v = v0 if (v0 > lo and v0 < hi) else 0.5 * v_oc
    for it in range(1, 101):
        e = i_0 * math.exp(v / v_t)
        f = i_sc - (e - i_0) - g * v
        if f > 0.0:
            lo = v
        else:
            hi = v
        df = -e / v_t - g
        v_new = v - f / df
        if not (v_new > lo and v_new < hi):
            v_new = 0.5 * (lo + hi)
        if abs(v_new - v) <= 1e-12 * (1.0 + abs(v)):
            return v_new, it
        v = v_new
    return v, 100


@njit(cache=True, nogil=True)
def step(t, x, z, d, u, p, dt, n_sub, layout, link_a, link_b, power, flow):
    """Advance by dt seconds (inputs held) in n_sub sub-steps; x temperatures (K), z[0] the
    source voltage (V, warm start), d trips/timers/iterations. Returns t + dt."""
    n, m = layout[L_N], layout[L_M]
    pc, pg, pr, pl, ps = layout[L_P_CAP], layout[L_P_GAMB], layout[L_P_R0], layout[L_P_LINKG], layout[L_P_SCALAR]
    dtr, dov = layout[L_D_TRIP], layout[L_D_OVER]
    t_amb, alpha = p[ps + S_AMB], p[ps + S_ALPHA]
    h = dt / n_sub
    h_us = np.int64(round(h * 1e6))
    delay_us = p[ps + S_DELAY] * 1e6
    reset = u[layout[L_U_RESET]] >= 0.5
    for _ in range(n_sub):
        g_load = 0.0
        for i in range(n):
            on = u[i] * (1 - d[dtr + i])
            r = p[pr + i] * (1.0 + alpha * (x[i] - t_amb))
            power[i] = on / r  # conductance for now
            g_load += power[i]
        v, iters = solve_supply(z[0], g_load, p[ps + S_ISC], p[ps + S_I0], p[ps + S_VT])
        z[0] = v
        d[layout[L_D_ITER]] = iters
        for i in range(n):
            power[i] *= v * v
            flow[i] = 0.0
        for k in range(m):
            a, b = link_a[k], link_b[k]
            q = p[pl + k] * (x[b] - x[a])
            flow[a] += q
            flow[b] -= q
        for i in range(n):
            g_amb = p[pg + i]
            t_inf = t_amb + (power[i] + flow[i]) / g_amb
            x[i] = t_inf + (x[i] - t_inf) * math.exp(-g_amb * h / p[pc + i])
            # protection: events inside the step
            if x[i] > p[ps + S_TRIP]:
                d[dov + i] += h_us
                if d[dov + i] >= delay_us:
                    d[dtr + i] = 1
            else:
                d[dov + i] = 0
            if reset and d[dtr + i] == 1 and x[i] < p[ps + S_RESET]:
                d[dtr + i] = 0
                d[dov + i] = 0
    return t + dt


@njit(cache=True, nogil=True)
def outputs(x, z, d, u, p, y, layout, link_a, link_b, power, flow):
    """Temperatures (K), heater power at the last solved voltage (W), trips (0/1), source
    voltage (V) and current (A), Newton iterations of the last solve."""
    n = layout[L_N]
    pr, ps = layout[L_P_R0], layout[L_P_SCALAR]
    yt, yp, yk, ys = layout[L_Y_TEMP], layout[L_Y_POWER], layout[L_Y_TRIP], layout[L_Y_SCALAR]
    t_amb, alpha = p[ps + S_AMB], p[ps + S_ALPHA]
    v = z[0]
    current = 0.0
    for i in range(n):
        on = u[i] * (1 - d[layout[L_D_TRIP] + i])
        g = on / (p[pr + i] * (1.0 + alpha * (x[i] - t_amb)))
        y[yt + i] = x[i]
        y[yp + i] = g * v * v
        y[yk + i] = d[layout[L_D_TRIP] + i]
        current += g * v
    y[ys] = v
    y[ys + 1] = current
    y[ys + 2] = d[layout[L_D_ITER]]


def randomize(p, rng, spread, *, n, m, pc, pg, pr, pl, lows, highs):
    """One physical draw around the base values in p (relative spread): per node a size
    factor s (capacity x s, ambient conductance x s^(2/3)), per link and per heater
    resistance their own lognormal factors; clipped to the bounds, never negative."""
    for i in range(n):
        s = math.exp(spread * rng.standard_normal())
        p[pc + i] *= s
        p[pg + i] *= s ** (2.0 / 3.0)
        p[pr + i] *= math.exp(spread * rng.standard_normal())
    for k in range(m):
        p[pl + k] *= math.exp(spread * rng.standard_normal())
    np.clip(p, lows, highs, out=p)


def _num(table: dict, key: str, where: str, positive: bool = True) -> float:
    v = table.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise ValueError(f"file: {where}.{key} = {v!r} is not a {'positive ' if positive else ''}number")
    return float(v)


def build(options: dict) -> PlantModel:
    """Read the model file and build spec, data and work (see the module docstring)."""
    if "file" not in options:
        raise ValueError("file: required (the model file, e.g. tests/plants/data/heaters.toml)")
    path = Path(str(options["file"]))
    try:
        model = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"file: cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"file: {path} is not valid TOML: {exc}") from None
    nodes, links = model.get("node", []), model.get("link", [])
    if not nodes:
        raise ValueError(f"file: {path} has no [[node]]")
    ids = [nd.get("id") for nd in nodes]
    if len(set(ids)) != len(ids) or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError(f"file: node ids must be distinct non-negative integers, not {ids}")
    pos = {i: k for k, i in enumerate(ids)}
    cap = np.array([_num(nd, "capacity_J_per_K", f"node {nd['id']}") for nd in nodes])
    gamb = np.array([_num(nd, "g_ambient_W_per_K", f"node {nd['id']}") for nd in nodes])
    r0 = np.array([_num(nd, "r0_ohm", f"node {nd['id']}") for nd in nodes])
    link_ids, la, lb, lg = [], [], [], []
    for ln in links:
        if ln.get("a") not in pos or ln.get("b") not in pos or ln["a"] == ln["b"]:
            raise ValueError(f"file: link {ln.get('id')} joins unknown or equal nodes {ln.get('a')}, {ln.get('b')}")
        link_ids.append(ln["id"])
        la.append(pos[ln["a"]])
        lb.append(pos[ln["b"]])
        lg.append(_num(ln, "g_W_per_K", f"link {ln['id']}"))
    n, m = len(nodes), len(links)
    src, prot = model.get("source", {}), model.get("protection", {})
    amb = _num(model, "ambient_K", "file")
    trip, reset, delay = (_num(prot, k, "protection") for k in ("trip_K", "reset_K", "trip_delay_s"))
    if not reset < trip:
        raise ValueError(f"file: protection.reset_K {reset} must be below trip_K {trip}")

    b = SpecBuilder(str(model.get("name", path.stem)), f"heaters from {path.name}: {n} nodes, {m} links")
    b.array("states", "node.temp", element_names("node", ids, "temp"), unit="K", nominal=amb, low=200.0,
            high=1000.0, description="node temperature")
    b.array("inputs", "heater.duty", element_names("heater", ids, "duty"), unit="1", nominal=0.0, low=0.0,
            high=1.0, description="heater duty cycle")
    u_reset = b.scalar("inputs", Quantity("reset", "1", 0.0, 0.0, 1.0, "clear tripped nodes below reset_K"))
    y_temp = b.array("outputs", "node.temp", element_names("node", ids, "temp"), unit="K", nominal=amb, low=200.0,
                     high=1000.0, description="node temperature").start
    y_pow = b.array("outputs", "node.power", element_names("node", ids, "power"), unit="W", nominal=0.0, low=0.0,
                    high=1e4, description="heater power").start
    y_trip = b.array("outputs", "node.tripped", element_names("node", ids, "tripped"), unit="1", nominal=0.0,
                     low=0.0, high=1.0, description="protection tripped").start
    y_scalar = b.scalar("outputs", Quantity("supply.voltage", "V", 0.0, 0.0, 1e3, "source voltage"))
    b.scalar("outputs", Quantity("supply.current", "A", 0.0, 0.0, 1e3, "source current"))
    b.scalar("outputs", Quantity("solver.iterations", "1", 0.0, 0.0, 100.0, "Newton iterations, last solve"))
    p_cap = b.array("params", "node.capacity", element_names("node", ids, "capacity"), unit="J/K", nominal=cap,
                    low=0.3 * cap, high=3.0 * cap, description="heat capacity").start
    p_gamb = b.array("params", "node.g_ambient", element_names("node", ids, "g_ambient"), unit="W/K",
                     nominal=gamb, low=0.3 * gamb, high=3.0 * gamb, description="conductance to ambient").start
    p_r0 = b.array("params", "node.r0", element_names("node", ids, "r0"), unit="ohm", nominal=r0, low=0.3 * r0,
                   high=3.0 * r0, description="heater resistance at ambient").start
    p_link = b.start("params")
    if m:
        lgv = np.array(lg)
        b.array("params", "link.g", element_names("link", link_ids, "g"), unit="W/K", nominal=lgv, low=0.3 * lgv,
                high=3.0 * lgv, description="link thermal conductance")
    p_scalar = b.start("params")
    for q in (Quantity("ambient", "K", amb, 200.0, 400.0, "ambient temperature"),
              Quantity("source.I_sc", "A", _num(src, "I_sc_A", "source"), 0.0, 1e3, "short-circuit current"),
              Quantity("source.I_0", "A", _num(src, "I_0_A", "source"), 1e-15, 1e-3, "saturation current"),
              Quantity("source.V_t", "V", _num(src, "V_t_V", "source"), 0.01, 100.0, "thermal voltage"),
              Quantity("protection.trip", "K", trip, 200.0, 1000.0, "trip temperature"),
              Quantity("protection.reset", "K", reset, 200.0, 1000.0, "reset temperature"),
              Quantity("protection.delay", "s", delay, 0.0, 3600.0, "trip delay"),
              Quantity("alpha", "1/K", ALPHA_PER_K, 0.0, 0.01, "resistance temperature coefficient")):
        b.scalar("params", q)
    d_trip = b.array("discrete", "node.trip", element_names("node", ids, "trip"), unit="1", nominal=0, low=0,
                     high=1, description="tripped (heater off)").start
    d_over = b.array("discrete", "node.over_us", element_names("node", ids, "over_us"), unit="us", nominal=0,
                     low=0, high=1e15, description="time above trip_K in a row").start
    d_iter = b.scalar("discrete", Quantity("solver.iterations", "1", 0, 0, 100, "Newton iterations, last solve"))
    b.scalar("algebraic", Quantity("supply.voltage", "V", 0.5 * _num(src, "V_t_V", "source"), 0.0, 1e3,
                                   "source voltage (warm start of the next solve)"))

    layout = np.array([n, m, p_cap, p_gamb, p_r0, p_link, p_scalar, y_temp, y_pow, y_trip, y_scalar,
                       d_trip, d_over, d_iter, u_reset], dtype=np.int64)
    proto = b.build()
    hook = functools.partial(randomize, n=n, m=m, pc=p_cap, pg=p_gamb, pr=p_r0, pl=p_link,
                             lows=proto.lows("params"), highs=proto.highs("params"))
    spec = b.build(randomize=hook)
    sum_g = np.zeros(n)
    for k in range(m):
        sum_g[la[k]] += lg[k]
        sum_g[lb[k]] += lg[k]
    coupling = min((0.5 * cap[i] / sum_g[i] for i in range(n) if sum_g[i] > 0), default=math.inf)
    max_substep = min(coupling, delay / 10.0)
    return PlantModel(spec=spec, form="step", step=step, outputs=outputs, max_substep=max_substep,
                      default_substeps=1, time_unit_s=1.0,
                      data=(layout, np.array(la, dtype=np.int64), np.array(lb, dtype=np.int64)),
                      work=(np.zeros(n), np.zeros(n)))
