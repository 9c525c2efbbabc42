"""The grid as a hil plant (`[plant] model = "grid"`): the plant contract's "step" form over
:class:`~plants.grid.network.GridModel`.

Scenario:

    [plant]
    model = "grid"
    case = "grids/case118.m"       # MATPOWER case (FILE_OPTION: relative to the scenario file)
    ratings = "base_flow"          # line ratings: "base_flow" (default) or "case" (RATE_A)
    rating_margin = 1.25           # base_flow: rating = margin * base-case |S| (larger end), MVA
    rating_floor_mva = 100.0       # base_flow: no rating below this (lightly loaded lines)
    ratings_csv = "ratings.csv"    # optional CSV `line,rating_mva` (line = 1-based branch row)
                                   # overriding single lines (FILE_OPTION)

The shipped MATPOWER cases have RATE_A = 0 (no limit), so "base_flow" is the default: every
line gets `max(rating_margin * |S| of the base-case flow, rating_floor_mva)`.

Signals (element ids are the case's: bus numbers, 1-based generator and branch rows):
- inputs: `gen.p_set` (MW), `gen.v_set` (pu), `gen.on` (1 in service, 0 trips the unit),
  `load.scale` (x nominal load), `load.shed` (fraction shed, 0..1), `line.open_cmd` and
  `line.close_cmd` (a latched breaker: a command acts in every step it is 1, and clearing it
  leaves the breaker where it is, so a pulse of one step opens or closes; open wins while both
  are set, so a held open is a lock-out; a close waits for the line's cooldown after a
  protection trip, so a held close recloses after every trip),
  `trafo.tap` (off-nominal ratio of the branches the case gives a ratio != 1).
- outputs: `bus.vm` (pu), `bus.va` (deg), `bus.frequency` (Hz, 0 when dead), `bus.island`
  (root bus index, -1 dead), `gen.p_mw`, `gen.q_mvar`, `gen.on`, `line.p_mw`/`line.q_mvar`
  (from end), `line.i_pu`, `line.loading` (%, |I| / rating), `line.temperature` (deg C),
  `line.closed` (0/1), scalars `grid.frequency` (Hz, load-weighted over energized buses, 0 in
  a blackout), `grid.islands`, `grid.blackout`, `grid.served_mw`, `grid.unserved_mw`,
  `grid.tripped` (lines tripped by protection in the last step), `grid.max_loading` (%), the
  solver's state `grid.pf_status` (0 converged, 1 recovered, 2 distributed slack, 3 collapse after
  continuation), `grid.pf_distributed`, `grid.pf_continuation`, `grid.collapsed`, and the in-plant
  controls' `grid.agc_mw`, `grid.ufls_tripped` (options `agc`, `ufls`: plants/grid/controls.py).
- state: x = conductor temperatures and per-bus island frequency / governor / AGC states
  (indexed by island root); z = bus voltages (Vm pu, Va rad: the Newton warm start) and the
  units' inertial shares (MW); d = breaker status, overflow counters, reclose cooldowns, dead
  (collapsed) bus latches, island labels, unit status, last step's trip count.
- params: per line rating (MVA), r and x (pu; randomized together: the branch admittance stays
  one symmetric series element), thermal time constant (s); per unit inertia H (s) and droop
  (pu); scalars `grid.agc_ki`, `grid.load_damping`, `grid.governor_tg_s`, `grid.freq_trip_hz`,
  `grid.soft_limit`, `grid.hard_limit`, `grid.overflow_allowed_steps`, `grid.cooldown_steps`.

The step is exact in the plant sense (quasi-static flow, exact thermal exponential, internal
RK4 for the frequency): `max_substep` is infinite. The kernels are the methods of a
:class:`GridKernels` object holding one GridModel per built plant; each call loads the whole
state from x, z, d (GridModel.set_state's semantics), so instances sharing the model never see
each other's state and snapshot/restore is exact.

Faults (`FAULTS`): a line trip is `line.open_cmd = 1`, a unit trip `gen.on = 0`, a load step
`load.scale` of a bus (or the group) set to the stepped value.

Safety: the limit family `SAFETY_LIMITS["line_rating"]` (:class:`plants.grid.line_limits.LineFlowLimits`,
`[[safety.projection.plant]] kind = "line_rating"`) gives the wrapper one pair of rows per line, `+-(f_l + sum_g PTDF[l, bus_g] (a_g - u_g)) <= P_max,l` (the
loading's headroom under limit_margin, in MW), with PTDF of the topology the observation
shows (recomputed when a line trips).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from plants.base import OutputWatch, PlantModel
from plants.panels import Panel
from plants.grid.case import Case
from plants.grid.case_files import read_case
from plants.grid.controls import Agc, Ufls
from plants.grid.injections import (bus_generation_q, electrical_generation, island_aggregates,
                                    slack_generation, split_bus_q)
from plants.grid.network import MAX_SUBSTEP_S, GridModel
from plants.grid.newton import _injections
from plants.grid.params import GridParams
from plants.grid.topology import DEAD
from plants.spec import Quantity, SpecBuilder, element_names

OPTIONS = {
    "case": "case file: MATPOWER .m or .mat, PYPOWER .py, pandapower .json",
    "ratings": "line ratings: 'base_flow' (margin x base-case flow, default) or 'case' (RATE_A, all > 0)",
    "rating_margin": "base_flow ratings: rating = margin x base-case |S| in MVA (default 1.25)",
    "rating_floor_mva": "base_flow ratings: lowest rating, MVA (default 100)",
    "ratings_csv": "CSV with columns line,rating_mva (1-based branch row) overriding single lines",
    "limit_margin": "safety rows: keep each line's loading under this fraction of its rating (default 0.95)",
    "blackout_served_fraction": "grid.blackout = 1 when less than this share of the demand is served (default 0.5)",
    "on_blackout": "'warn' (alarm + warning, default) or 'fail' (the run stops, exit code 5) on grid.blackout",
    "on_unserved_load": "'warn' (default) or 'fail' (exit code 6) when grid.unserved_mw exceeds unserved_load_mw",
    "unserved_load_mw": "unserved load (MW, dead buses) that raises the unserved-load alarm (default 0: any)",
    "on_collapse": "'warn' (default) or 'fail' (exit code 7) when an island is latched dead: collapse after continuation",
    "on_distributed_slack": "'warn' (default) or 'fail' (exit code 8) when a power flow converged only with a "
                            "distributed slack (the single-slack solve failed: a large disturbance)",
    "agc": "in-plant AGC: { units = [30], kp = MW/Hz, ki = MW/(Hz s), setpoint = Hz, out_min / out_max = MW } (controls.py)",
    "ufls": "in-plant UFLS: { stages = [{ below = Hz, pickup_s = s, buses = [..], shed = fraction, reset, latch }] }",
}
# Exit codes of `hil run` for the grid's watches (after hil/loop/health.py's 0..4).
EXIT_BLACKOUT = 5
EXIT_UNSERVED_LOAD = 6
EXIT_COLLAPSE = 7
EXIT_DISTRIBUTED_SLACK = 8
FILE_OPTIONS = ("case", "ratings_csv")

# Fault hooks through plant inputs (for the campaign fault library): name -> (input group, value, help).
FAULTS = {
    "line_trip": ("line.open_cmd", 1.0, "open a branch's breaker (hold 1; close_cmd recloses after cooldown)"),
    "gen_trip": ("gen.on", 0.0, "take a unit out of service (its power is lost, governors pick it up)"),
    "load_step": ("load.scale", None, "set a bus's (or every bus's) load multiplier to the stepped value"),
}

_SCALARS = (  # (param name, GridParams field, unit, low, high, description)
    ("grid.agc_ki", "agc_ki", "1/s", 0.0, 10.0, "AGC integral gain, pu power per (pu frequency * s)"),
    ("grid.load_damping", "load_damping", "pu/pu", 0.0, 10.0, "load change per frequency change"),
    ("grid.governor_tg_s", "governor_tg_s", "s", 0.01, 30.0, "governor-turbine time constant"),
    ("grid.freq_trip_hz", "freq_trip_hz", "Hz", 0.1, 10.0, "|f - f0| that blacks an island out"),
    ("grid.soft_limit", "soft_limit", "1", 0.5, 3.0, "loading above which overflow steps count"),
    ("grid.hard_limit", "hard_limit", "1", 0.5, 5.0, "loading that trips at once"),
    ("grid.overflow_allowed_steps", "overflow_allowed_steps", "steps", 0.0, 1000.0,
     "steps above soft_limit before a trip (trips on the next)"),
    ("grid.cooldown_steps", "cooldown_steps", "steps", 0.0, 1000.0, "steps a tripped line stays open"),
)
_INT_SCALARS = {"overflow_allowed_steps", "cooldown_steps"}


def _option_float(options: dict, key: str, default: float, low: float = 0.0) -> float:
    v = options.get(key, default)
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: {v!r} is not a number") from None
    if not (math.isfinite(f) and f > low):
        raise ValueError(f"{key}: {v!r} must be a finite number > {low:g}")
    return f


def line_ratings(case: Case, options: dict, base: GridModel | None = None) -> np.ndarray:
    """Ratings in MVA per branch from the options (see the module docstring). Always > 0.

    base: the case's balanced GridModel (its base-case flows), built here when not given."""
    mode = options.get("ratings", "base_flow")
    if mode == "case":
        r = case.rate_a_mva.astype(np.float64).copy()
        bad = np.flatnonzero(~(r > 0))
        if bad.size:
            raise ValueError(f"ratings: 'case' needs RATE_A > 0 on every branch; branch rows "
                             f"{', '.join(str(i + 1) for i in bad[:8])}{' ...' if bad.size > 8 else ''} have "
                             "none (use ratings = 'base_flow' or a ratings_csv)")
    elif mode == "base_flow":
        margin = _option_float(options, "rating_margin", 1.25)
        floor = _option_float(options, "rating_floor_mva", 100.0)
        o = (base or GridModel(case, GridParams())).out
        s = np.maximum(np.hypot(o["pf_mw"], o["qf_mvar"]), np.hypot(o["pt_mw"], o["qt_mvar"]))
        r = np.maximum(margin * s, floor)
    else:
        raise ValueError(f"ratings: {mode!r} is not 'base_flow' or 'case'")
    path = options.get("ratings_csv")
    if path:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
        for k, row in enumerate(rows, start=2):
            try:
                line, rating = int(row["line"]), float(row["rating_mva"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"ratings_csv: line {k}: needs integer 'line' and number 'rating_mva' "
                                 f"columns, got {row}") from None
            if not 1 <= line <= case.n_branch:
                raise ValueError(f"ratings_csv: line {k}: branch {line} is not in 1..{case.n_branch}")
            if not (math.isfinite(rating) and rating > 0):
                raise ValueError(f"ratings_csv: line {k}: rating {rating} MVA must be > 0")
            r[line - 1] = rating
    return r


class GridKernels:
    """The step/outputs callables of one built grid plant (see the module docstring).

    Index layout (kernel order) in `lay`: slices of x, z, d, u, p, y per group."""

    def __init__(self, case: Case, model: GridModel, spec_layout: dict, trafo_rows: np.ndarray):
        self.case = case
        self.model = model
        self.lay = spec_layout
        self.trafo_rows = trafo_rows
        self._p_seen = None
        self._key = None  # (x, z, d, u, p) after the last step: model.out belongs to them

    # ---- state <-> model ----
    def _load(self, t, x, z, d, u, p) -> None:
        m, st, L, c = self.model, self.model.state, self.lay, self.case
        k = self._key
        # the model already holds this state (the instance that stepped last, unchanged since):
        # only the inputs are new; else the whole state is loaded (GridModel.set_state semantics)
        same = (k is not None and np.array_equal(k[0], x) and np.array_equal(k[1], z) and np.array_equal(k[2], d)
                and np.array_equal(k[4], p))
        if not same:
            self._load_state(t, x, z, d, p)
        st["t_s"][0] = t
        st["gen_on"][:] = np.where(u[L["u.on"]] >= 0.5, 1, 0)
        m.gen_p_set_mw[:] = u[L["u.p_set"]]
        m.gen_v_set_pu[:] = u[L["u.v_set"]]
        m.load_scale[:] = u[L["u.load_scale"]]
        m.load_shed[:] = u[L["u.shed"]]
        m.cmd_open[:] = np.where(u[L["u.open"]] >= 0.5, 1, 0)
        m.cmd_close[:] = np.where(u[L["u.close"]] >= 0.5, 1, 0)
        if self.trafo_rows.size:
            m.tap[self.trafo_rows] = u[L["u.tap"]]
        if not same or not np.array_equal(k[3][L["u.on"]], u[L["u.on"]]) or (
                self.trafo_rows.size and not np.array_equal(k[3][L["u.tap"]], u[L["u.tap"]])):
            m._topology(inherit=False)

    def _load_state(self, t, x, z, d, p) -> None:
        m, st, L, c = self.model, self.model.state, self.lay, self.case
        if self._p_seen is None or not np.array_equal(self._p_seen, p):
            c.rate_a_mva[:] = p[L["p.rating"]]
            c.r_pu[:] = p[L["p.r"]]
            c.x_pu[:] = p[L["p.x"]]
            m.tau_thermal_s[:] = p[L["p.tau"]]
            m.h_s[:] = p[L["p.h"]]
            m.droop_pu[:] = p[L["p.droop"]]
            for k, (_, field_name, *_rest) in enumerate(_SCALARS):
                v = p[L["p.scalars"].start + k]
                setattr(m.p, field_name, int(round(v)) if field_name in _INT_SCALARS else float(v))
            m._topology_version += 1  # impedances may have changed: PTDF cache is stale
            self._p_seen = p.copy()
        st["t_s"][0] = t
        st["temp_c"][:] = x[L["x.temp"]]
        st["dw"][:] = x[L["x.dw"]]
        st["dpm"][:] = x[L["x.dpm"]]
        st["pagc"][:] = x[L["x.pagc"]]
        st["vm"][:] = z[L["z.vm"]]
        st["va"][:] = z[L["z.va"]]
        st["p_share_mw"][:] = z[L["z.share"]]
        st["br_status"][:] = d[L["d.br"]]
        st["overflow_steps"][:] = d[L["d.over"]]
        st["cooldown"][:] = d[L["d.cool"]]
        st["bus_dead"][:] = d[L["d.dead"]]
        st["island"][:] = d[L["d.island"]]
        st["agc_i_mw"][:] = x[L["x.agc"]]
        st["ufls_timer_s"][:] = x[L["x.ufls_timer"]]
        st["ufls_active"][:] = d[L["d.ufls"]]

    def _save(self, x, z, d) -> None:
        st, L = self.model.state, self.lay
        x[L["x.temp"]] = st["temp_c"]
        x[L["x.dw"]] = st["dw"]
        x[L["x.dpm"]] = st["dpm"]
        x[L["x.pagc"]] = st["pagc"]
        z[L["z.vm"]] = st["vm"]
        z[L["z.va"]] = st["va"]
        z[L["z.share"]] = st["p_share_mw"]
        d[L["d.br"]] = st["br_status"]
        d[L["d.over"]] = st["overflow_steps"]
        d[L["d.cool"]] = st["cooldown"]
        d[L["d.dead"]] = st["bus_dead"]
        d[L["d.island"]] = st["island"]
        x[L["x.agc"]] = st["agc_i_mw"]
        x[L["x.ufls_timer"]] = st["ufls_timer_s"]
        d[L["d.ufls"]] = st["ufls_active"]
        d[L["d.gen_on"]] = st["gen_on"]
        d[L["d.tripped"]] = self.model.out["tripped_this_step"][0]

    # ---- the contract's kernels ----
    def step(self, t, x, z, d, u, p, dt, n_sub, *aux):
        """Advance by dt seconds (inputs held; n_sub unused: the step is exact). Returns t + dt."""
        self._load(t, x, z, d, u, p)
        self.model.step(float(dt))
        self._save(x, z, d)
        self._key = (x.copy(), z.copy(), d.copy(), u.copy(), p.copy())
        return t + dt

    def outputs(self, x, z, d, u, p, y, *aux):
        """Write y from the state: the last step's results when (x, z, d, u, p) are what that step
        left, else recomputed from the state (flows, dispatch, slack output; no integration)."""
        k = self._key
        if not (k is not None and np.array_equal(k[0], x) and np.array_equal(k[1], z) and np.array_equal(k[2], d)
                and np.array_equal(k[3], u) and np.array_equal(k[4], p)):
            self._recompute(x, z, d, u, p)
            self._key = None
        self._publish_y(y)

    def _recompute(self, x, z, d, u, p) -> None:
        m, st, c, o = self.model, self.model.state, self.case, self.model.out
        self._key = None
        self._load(0.0, x, z, d, u, p)
        m._effective_scales(0.0)
        m._setpoints(0.0, False)
        island_aggregates(st["island"], o["role"], c.pd_mw, m._load_eff, c.gen_bus, st["gen_on"], m.p_set_eff_mw,
                          m._gen_eff, m.h_s, c.mbase_mva, m.droop_pu, c.pmin_mw, c.pmax_mw, c.base_mva, m._m,
                          m._kgov, m._p_sched, m._p_load)
        m._q_limited[:] = 0
        m._injections()
        m._flows()
        _injections(m.ws.indptr, m.ws.indices, m.ydata, st["vm"], st["va"], m.ws.V, m.ws.I)
        slack_generation(o["role"], c.gen_bus, st["gen_on"], m.ws.V, m.ws.I, c.pd_mw, m._load_eff, c.base_mva,
                         o["p_gen_mw"])
        electrical_generation(st["island"], o["role"], m.ws.V, m.ws.I, c.pd_mw, m._load_eff, c.base_mva, m._p_elec)
        bus_generation_q(o["role"], m.ws.V, m.ws.I, c.qd_mvar, m._load_eff, c.base_mva, m._bus_q)
        split_bus_q(o["role"], c.gen_bus, st["gen_on"], c.qmax_mvar, c.qmin_mvar, m._bus_q, o["q_gen_mvar"])
        o["tripped_this_step"][0] = d[self.lay["d.tripped"]][0]
        m._publish()

    def _publish_y(self, y) -> None:
        o, st, L, c = self.model.out, self.model.state, self.lay, self.case
        y[L["y.vm"]] = o["vm_pu"]
        y[L["y.va"]] = o["va_deg"]
        y[L["y.freq"]] = o["freq_hz"]
        y[L["y.island"]] = o["island"]
        y[L["y.pg"]] = o["p_gen_mw"]
        y[L["y.qg"]] = np.where(st["gen_on"] > 0, o["q_gen_mvar"], 0.0)
        y[L["y.gen_on"]] = st["gen_on"]
        y[L["y.pf"]] = o["pf_mw"]
        y[L["y.qf"]] = o["qf_mvar"]
        y[L["y.i"]] = o["i_pu"]
        y[L["y.loading"]] = 100.0 * o["loading"]
        y[L["y.temp"]] = o["temp_c"]
        y[L["y.closed"]] = o["br_status"]
        live = (o["role"] != DEAD)
        w = c.pd_mw * live
        wsum = w.sum()
        if wsum > 0:
            f = float(w @ o["freq_hz"]) / wsum
        elif live.any():
            f = float(o["freq_hz"][live].mean())
        else:
            f = 0.0
        s = L["y.scalars"].start
        y[s] = f
        y[s + 1] = o["n_islands"][0]
        y[s + 2] = o["blackout"][0]
        y[s + 3] = o["served_load_mw"][0]
        y[s + 4] = o["unserved_load_mw"][0]
        y[s + 5] = o["tripped_this_step"][0]
        y[s + 6] = 100.0 * float(o["loading"].max()) if o["loading"].size else 0.0
        y[s + 7] = o["pf_status"][0]
        y[s + 8] = o["pf_iterations"][0]
        y[s + 9] = o["pf_mismatch_pu"][0]
        y[s + 10] = o["shed_load_mw"][0]
        y[s + 11] = o["served_fraction"][0]
        y[s + 12] = o["dead_buses"][0]
        y[s + 13] = o["collapsed_this_step"][0]
        y[s + 14] = o["distributed_this_step"][0]
        y[s + 15] = o["continuation_this_step"][0]
        y[s + 16] = o["agc_mw"][0]
        y[s + 17] = o["ufls_tripped"][0]


def _ratio_bounds(values: np.ndarray) -> tuple[float, float]:
    """Bounds of a per-unit ratio input (voltage set-point, tap) from the case's own values: the
    usual regulating range [0.8, 1.2] widened to 10 % beyond the case's extremes (case9241pegase
    has a tap of 0.79, case13659pegase 1.58), never below 0.1 (a ratio is positive)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    lo, hi = (float(v.min()), float(v.max())) if v.size else (1.0, 1.0)
    return max(0.1, min(0.8, 0.9 * lo)), max(1.2, 1.1 * hi)


def _randomizer(lay: dict, base_rating: np.ndarray):
    def randomize(p: np.ndarray, rng: np.random.Generator, spread: float) -> None:
        """One physical draw around p: per line one impedance factor for r and x together
        (same X/R, symmetric series admittance), its own rating factor; per unit H and droop;
        every factor lognormal with sigma = spread, values clipped to the bounds (all > 0)."""
        s = max(float(spread), 0.0)
        r, x, rating = lay["p.r"], lay["p.x"], lay["p.rating"]
        nl = r.stop - r.start
        zf = np.clip(np.exp(rng.normal(0.0, s, nl)), 0.5, 2.0)  # the bounds are 0.5x..2x the case's
        p[r] = np.clip(p[r] * zf, lay["r_lo"], lay["r_hi"])
        p[x] = np.clip(p[x] * zf, lay["x_lo"], lay["x_hi"])
        p[rating] = np.clip(p[rating] * np.exp(rng.normal(0.0, s, nl)), 0.5 * base_rating, 2.0 * base_rating)
        for key, lo, hi in (("p.h", 0.5, 20.0), ("p.droop", 0.01, 0.2), ("p.tau", 30.0, 3600.0)):
            sl = lay[key]
            p[sl] = np.clip(p[sl] * np.exp(rng.normal(0.0, s, sl.stop - sl.start)), lo, hi)
    return randomize


def build(options: dict) -> PlantModel:
    """The grid plant for a MATPOWER case (options: see OPTIONS and the module docstring)."""
    path = options.get("case")
    if not path:
        raise ValueError("case: a MATPOWER case file is required (e.g. case = \"grids/case118.m\")")
    if not Path(path).is_file():
        raise ValueError(f"case: {path} is not a file")
    case = read_case(path)
    _option_float(options, "limit_margin", 0.95)
    watches = _watches(options)
    params = GridParams(blackout_served_fraction=_option_fraction(options, "blackout_served_fraction", 0.5))
    agc = Agc(options["agc"], case, params.f0_hz) if options.get("agc") is not None else None
    ufls = Ufls(options["ufls"], case, params.f0_hz) if options.get("ufls") is not None else None
    n, ng, nl = case.n_bus, case.n_gen, case.n_branch
    # The one GridModel of this plant (ordering and symbolic LU are its costly part): its balanced
    # state gives the base-case flows for the ratings and the nominal values, then it steps.
    base = GridModel(case, params)
    base.configure_controls(agc, ufls)
    ratings = line_ratings(case, options, base)
    case.rate_a_mva = ratings.copy()
    base._flows()  # loading against the ratings just set
    st, o = base.state, base.out
    bus_ids = [int(i) for i in case.bus_id]
    gen_ids = list(range(1, ng + 1))
    line_ids = list(range(1, nl + 1))
    trafo_rows = np.flatnonzero(case.tap != 1.0)
    b = SpecBuilder("grid", f"AC grid from {Path(path).name}: {n} buses, {ng} units, {nl} branches")
    lay: dict = {}

    def arr(kind, key, group, prefix, ids, field_name, **kw):
        g = b.array(kind, group, element_names(prefix, ids, field_name), **kw)
        lay[key] = slice(g.start, g.stop)

    f0 = params.f0_hz
    # states
    arr("states", "x.temp", "line.temp_state", "line", line_ids, "temp_state", unit="degC", nominal=st["temp_c"],
        low=-60.0, high=400.0, description="conductor temperature")
    arr("states", "x.dw", "bus.dw", "bus", bus_ids, "dw", unit="pu", nominal=0.0, low=-0.5, high=0.5,
        description="island frequency deviation (read at the island root)")
    big = max(10.0, 2.0 * float(case.pmax_mw.sum()) / case.base_mva)
    arr("states", "x.dpm", "bus.dpm", "bus", bus_ids, "dpm", unit="pu", nominal=0.0, low=-big, high=big,
        description="island governor mechanical power change, system base")
    arr("states", "x.pagc", "bus.pagc", "bus", bus_ids, "pagc", unit="pu", nominal=0.0, low=-big, high=big,
        description="island AGC output, system base")
    # algebraic
    if agc is not None:
        arr("states", "x.agc", "gen.agc_integral", "agc", [int(g) + 1 for g in agc.units], "integral", unit="MW",
            nominal=0.0, low=-1e5, high=1e5, description="in-plant AGC integral of the unit")
    else:
        lay["x.agc"] = slice(0, 0)
    if ufls is not None:
        relay_ids = [f"s{int(k) + 1}_bus{int(case.bus_id[i])}" for k, i in zip(ufls.stage, ufls.bus)]
        arr("states", "x.ufls_timer", "ufls.timer", "ufls", relay_ids, "timer", unit="s", nominal=0.0, low=0.0,
            high=1e9, description="UFLS relay pickup timer")
    else:
        lay["x.ufls_timer"] = slice(0, 0)
    arr("algebraic", "z.vm", "bus.vm_state", "bus", bus_ids, "vm_state", unit="pu", nominal=st["vm"], low=0.0,
        high=3.0, description="bus voltage magnitude (Newton warm start)")
    arr("algebraic", "z.va", "bus.va_state", "bus", bus_ids, "va_state", unit="rad", nominal=st["va"],
        low=-1e3, high=1e3, description="bus voltage angle (Newton warm start)")
    arr("algebraic", "z.share", "gen.p_share", "gen", gen_ids, "p_share", unit="MW", nominal=st["p_share_mw"],
        low=-1e5, high=1e5, description="inertial share of the island imbalance")
    # discrete
    arr("discrete", "d.br", "line.status", "line", line_ids, "status", unit="1", nominal=st["br_status"], low=0,
        high=1, description="breaker closed")
    arr("discrete", "d.over", "line.overflow_steps", "line", line_ids, "overflow_steps", unit="steps", nominal=0,
        low=0, high=1e9, description="consecutive steps above the soft limit")
    arr("discrete", "d.cool", "line.cooldown", "line", line_ids, "cooldown", unit="steps", nominal=0, low=0,
        high=1e9, description="steps until a tripped line may reclose")
    arr("discrete", "d.dead", "bus.dead", "bus", bus_ids, "dead", unit="1", nominal=0, low=0, high=1,
        description="blackout latch (voltage collapse or frequency trip)")
    arr("discrete", "d.island", "bus.island_state", "bus", bus_ids, "island_state", unit="1",
        nominal=st["island"], low=0, high=n - 1, description="island label (root bus index)")
    arr("discrete", "d.gen_on", "gen.status", "gen", gen_ids, "status", unit="1", nominal=st["gen_on"], low=0,
        high=1, description="unit in service")
    if ufls is not None:
        arr("discrete", "d.ufls", "ufls.tripped", "ufls", relay_ids, "tripped", unit="1", nominal=0, low=0, high=1,
            description="UFLS relay tripped (its stage sheds the bus load)")
    else:
        lay["d.ufls"] = slice(0, 0)
    i = b.scalar("discrete", Quantity("grid.tripped_last", "1", 0.0, 0.0, 1e6, "lines tripped in the last step"))
    lay["d.tripped"] = slice(i, i + 1)
    # inputs
    p_lo = np.minimum(case.pmin_mw, 0.0)
    p_hi = np.maximum(case.pmax_mw, p_lo + 1.0)
    arr("inputs", "u.p_set", "gen.p_set", "gen", gen_ids, "p_set", unit="MW",
        nominal=np.clip(base.gen_p_set_mw, p_lo, p_hi), low=p_lo, high=p_hi, description="unit active power setpoint")
    v_lo, v_hi = _ratio_bounds(case.vg_pu)
    arr("inputs", "u.v_set", "gen.v_set", "gen", gen_ids, "v_set", unit="pu", nominal=case.vg_pu, low=v_lo,
        high=v_hi, description="unit voltage setpoint")
    arr("inputs", "u.on", "gen.on", "gen", gen_ids, "on", unit="1", nominal=case.gen_status.astype(float), low=0.0,
        high=1.0, description="unit in service command (0 trips it)")
    arr("inputs", "u.load_scale", "load.scale", "load", bus_ids, "scale", unit="1", nominal=1.0, low=0.0, high=3.0,
        description="load multiplier per bus")
    arr("inputs", "u.shed", "load.shed", "load", bus_ids, "shed", unit="1", nominal=0.0, low=0.0, high=1.0,
        description="fraction of the bus load shed")
    arr("inputs", "u.open", "line.open_cmd", "line", line_ids, "open_cmd", unit="1", nominal=0.0, low=0.0, high=1.0,
        description="breaker open command: opens while 1 (a pulse is enough; clearing it does not close)")
    arr("inputs", "u.close", "line.close_cmd", "line", line_ids, "close_cmd", unit="1", nominal=0.0, low=0.0,
        high=1.0, description="breaker close command: closes while 1 once the cooldown is over (clearing it does not "
        "open)")
    if trafo_rows.size:
        t_lo, t_hi = _ratio_bounds(case.tap[trafo_rows])
        arr("inputs", "u.tap", "trafo.tap", "trafo", [int(r) + 1 for r in trafo_rows], "tap", unit="1",
            nominal=case.tap[trafo_rows], low=t_lo, high=t_hi, description="off-nominal turns ratio")
    else:
        lay["u.tap"] = slice(0, 0)
    # outputs
    arr("outputs", "y.vm", "bus.vm", "bus", bus_ids, "vm", unit="pu", nominal=o["vm_pu"], low=0.0, high=2.0,
        description="bus voltage magnitude (0 when dead)")
    arr("outputs", "y.va", "bus.va", "bus", bus_ids, "va", unit="deg", nominal=o["va_deg"], low=-3600.0,
        high=3600.0, description="bus voltage angle")
    arr("outputs", "y.freq", "bus.frequency", "bus", bus_ids, "frequency", unit="Hz", nominal=f0, low=0.0,
        high=2.0 * f0, description="island frequency at the bus (0 when dead)")
    arr("outputs", "y.island", "bus.island", "bus", bus_ids, "island", unit="1", nominal=o["island"], low=-1.0,
        high=float(n), description="island root bus index (-1 when dead)")
    pq = max(1.0, float(np.abs(case.qmax_mvar).max()), float(np.abs(case.qmin_mvar).max()))
    arr("outputs", "y.pg", "gen.p_mw", "gen", gen_ids, "p_mw", unit="MW", nominal=o["p_gen_mw"],
        low=-2.0 * float(p_hi.max()), high=2.0 * float(p_hi.max()), description="unit active power")
    arr("outputs", "y.qg", "gen.q_mvar", "gen", gen_ids, "q_mvar", unit="MVAr", nominal=0.0, low=-10 * pq,
        high=10 * pq, description="unit reactive power")
    arr("outputs", "y.gen_on", "gen.in_service", "gen", gen_ids, "in_service", unit="1", nominal=st["gen_on"],
        low=0.0, high=1.0, description="unit in service")
    smax = max(1000.0, 10.0 * float(ratings.max()))
    arr("outputs", "y.pf", "line.p_mw", "line", line_ids, "p_mw", unit="MW", nominal=o["pf_mw"], low=-smax,
        high=smax, description="active power at the from end")
    arr("outputs", "y.qf", "line.q_mvar", "line", line_ids, "q_mvar", unit="MVAr", nominal=o["qf_mvar"],
        low=-smax, high=smax, description="reactive power at the from end")
    arr("outputs", "y.i", "line.i_pu", "line", line_ids, "i_pu", unit="pu", nominal=o["i_pu"], low=0.0,
        high=smax / case.base_mva, description="current, larger end, system base")
    arr("outputs", "y.loading", "line.loading", "line", line_ids, "loading", unit="%",
        nominal=100.0 * o["loading"], low=0.0, high=1000.0, description="|I| / rating")
    arr("outputs", "y.temp", "line.temperature", "line", line_ids, "temperature", unit="degC",
        nominal=o["temp_c"], low=-60.0, high=400.0, description="conductor temperature")
    arr("outputs", "y.closed", "line.closed", "line", line_ids, "closed", unit="1", nominal=o["br_status"],
        low=0.0, high=1.0, description="breaker status (1 closed)")
    lay["y.scalars"] = slice(b.start("outputs"), b.start("outputs") + 18)
    for name, unit, nom, lo, hi, desc in (
            ("grid.frequency", "Hz", f0, 0.0, 2 * f0, "load-weighted frequency of the energized buses"),
            ("grid.islands", "1", float(o["n_islands"][0]), 0.0, float(n), "energized islands"),
            ("grid.blackout", "1", 0.0, 0.0, 1.0,
             "1 when no island is energized or less than blackout_served_fraction of the demand is served"),
            ("grid.served_mw", "MW", float(o["served_load_mw"][0]), 0.0, 1e6, "load served"),
            ("grid.unserved_mw", "MW", 0.0, 0.0, 1e6, "load not served (dead buses)"),
            ("grid.tripped", "1", 0.0, 0.0, 1e6, "lines tripped by protection in the last step"),
            ("grid.max_loading", "%", 100.0 * float(o["loading"].max()), 0.0, 1000.0, "highest line loading"),
            ("grid.pf_status", "1", 0.0, 0.0, 3.0,
             "power flow this step: 0 converged, 1 recovered (flat start), 2 converged with distributed slack, "
             "3 collapse after continuation (island(s) latched dead)"),
            ("grid.pf_iterations", "1", 0.0, 0.0, 1e6, "Newton iterations this step (all solves)"),
            ("grid.pf_mismatch_pu", "pu", 0.0, 0.0, 1e6, "largest power mismatch left by the last solve"),
            ("grid.shed_mw", "MW", 0.0, 0.0, 1e6, "load shed on purpose (load.shed)"),
            ("grid.served_fraction", "1", 1.0, 0.0, 1.0, "served / (served + unserved + shed)"),
            ("grid.dead_buses", "1", 0.0, 0.0, float(n), "buses without voltage"),
            ("grid.collapsed", "1", 0.0, 0.0, float(n),
             "islands latched dead this step: collapse after distributed slack and load continuation"),
            ("grid.pf_distributed", "1", 0.0, 0.0, float(n),
             "islands solved with a distributed slack this step (single slack failed)"),
            ("grid.pf_continuation", "1", 0.0, 0.0, float(n),
             "of those, islands that needed load continuation"),
            ("grid.agc_mw", "MW", 0.0, -1e6, 1e6, "in-plant AGC: setpoint change of its units (0 without [plant] agc)"),
            ("grid.ufls_tripped", "1", 0.0, 0.0, 1e6, "in-plant UFLS relays tripped (stage x bus)")):
        b.scalar("outputs", Quantity(name, unit, nom, lo, hi, desc))
    # params
    arr("params", "p.rating", "line.rating", "line", line_ids, "rating", unit="MVA", nominal=ratings,
        low=0.5 * ratings, high=2.0 * ratings, description="thermal rating (|I| at 1 pu)")
    r_lo, r_hi = 0.5 * case.r_pu, 2.0 * case.r_pu + 1e-12
    x_lo = np.where(case.x_pu > 0, 0.5 * case.x_pu, 2.0 * case.x_pu)
    x_hi = np.where(case.x_pu > 0, 2.0 * case.x_pu, 0.5 * case.x_pu) + 1e-12
    lay.update(r_lo=r_lo, r_hi=r_hi, x_lo=x_lo, x_hi=x_hi)
    arr("params", "p.r", "line.r", "line", line_ids, "r", unit="pu", nominal=case.r_pu, low=r_lo, high=r_hi,
        description="series resistance, system base")
    arr("params", "p.x", "line.x", "line", line_ids, "x", unit="pu", nominal=case.x_pu, low=x_lo, high=x_hi,
        description="series reactance, system base")
    arr("params", "p.tau", "line.tau_thermal", "line", line_ids, "tau_thermal", unit="s", nominal=base.tau_thermal_s,
        low=30.0, high=3600.0, description="conductor thermal time constant")
    arr("params", "p.h", "gen.h", "gen", gen_ids, "h", unit="s", nominal=base.h_s, low=0.5, high=20.0,
        description="inertia constant on the unit's MVA base")
    arr("params", "p.droop", "gen.droop", "gen", gen_ids, "droop", unit="pu", nominal=base.droop_pu, low=0.01,
        high=0.2, description="governor droop on the unit's base")
    lay["p.scalars"] = slice(b.start("params"), b.start("params") + len(_SCALARS))
    for name, field_name, unit, lo, hi, desc in _SCALARS:
        b.scalar("params", Quantity(name, unit, float(getattr(params, field_name)), lo, hi, desc))
    spec = b.build(randomize=_randomizer(lay, ratings))
    kernels = GridKernels(case, base, lay, trafo_rows)
    return PlantModel(spec=spec, form="step", step=kernels.step, outputs=kernels.outputs,
                      max_substep=MAX_SUBSTEP_S, default_substeps=1, time_unit_s=1.0, watches=watches,
                      panels=PANELS)


# the dashboard's default panels (plants/panels.py): the voltage profile as a heat map over
# time (normal band 0.95..1.05 pu), line loadings as bars (rating = 100 %), system frequency
PANELS = (
    Panel("Bus voltage magnitude (pu)", ("bus.vm",), kind="heatmap", band=(0.95, 1.05)),
    Panel("Line loading (%)", ("line.loading",), kind="bars", band=(0.0, 100.0)),
    Panel("Frequency", ("grid.frequency",)),
)


def _option_fraction(options: dict, key: str, default: float) -> float:
    v = options.get(key, default)
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: {v!r} is not a number") from None
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"{key}: {v!r} is not in 0..1")
    return f


def _action(options: dict, key: str) -> str:
    v = options.get(key, "warn")
    if v not in ("warn", "fail"):
        raise ValueError(f"{key}: {v!r} is not 'warn' or 'fail'")
    return v


def _watches(options: dict) -> tuple:
    """The loop's watches on the grid's outputs: blackout, unserved load, voltage collapse."""
    unserved = options.get("unserved_load_mw", 0.0)
    try:
        unserved = float(unserved)
    except (TypeError, ValueError):
        raise ValueError(f"unserved_load_mw: {unserved!r} is not a number") from None
    if not (math.isfinite(unserved) and unserved >= 0):
        raise ValueError(f"unserved_load_mw: {unserved!r} must be a finite number >= 0")
    return (
        OutputWatch("blackout", "grid.blackout", 0.5, _action(options, "on_blackout"), EXIT_BLACKOUT,
                    "grid blackout: less than the blackout_served_fraction of the demand served"),
        OutputWatch("unserved_load", "grid.unserved_mw", unserved, _action(options, "on_unserved_load"),
                    EXIT_UNSERVED_LOAD, "unserved load {value} MW (dead buses) above " f"{unserved:g} MW"),
        OutputWatch("voltage_collapse", "grid.collapsed", 0.5, _action(options, "on_collapse"), EXIT_COLLAPSE,
                    "{value} island(s) latched dead: collapse after continuation (the power flow failed from "
                    "warm and flat starts, with single and distributed slack and with load continuation)"),
        OutputWatch("distributed_slack", "grid.pf_distributed", 0.5, _action(options, "on_distributed_slack"),
                    EXIT_DISTRIBUTED_SLACK,
                    "{value} island(s) converged with distributed slack (governor participation) where the "
                    "single-slack power flow failed"),
    )


def kernels_of(model: PlantModel) -> GridKernels:
    """The GridKernels behind a built grid PlantModel (its step is a bound method)."""
    k = getattr(model.step, "__self__", None)
    if not isinstance(k, GridKernels):
        raise ValueError(f"plant {model.name!r} is not a grid plant built by plants.grid.build")
    return k

