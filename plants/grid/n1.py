"""N-1 security of a grid operating point: every single-branch outage screened with DC
sensitivities (LODF), the critical ones confirmed with the plant's own AC power flow.

Screening (per closed branch k, all lines l at once; AC base-case flows, DC sensitivities)::

    P_l|k  = P_l + LODF[l, k] P_k                       (MW, from end; LODF from sensitivity.py)
    S_l|k  = hypot(P_l|k, Q_l)                          (reactive flow held at its base value)
    loading_l|k = loading_l * S_l|k / |S_l|              (the base loading's |I| / rating scaled by
                                                          the MVA change; hypot(P, Q) / rating when
                                                          the base |S_l| is 0)

An outage is *critical* when its largest estimated post-outage loading (over l != k) is above
``screen_loading`` (default 0.9: a 10 % allowance for the DC approximation's error), or when it
islands the network (LODF has no finite column for a bridge).

Confirmation (AC): the plant's :class:`~plants.grid.network.GridModel` at the operating point,
the branch's breaker opened by its command, one step of 1 ms with protection switched off
(soft and hard limits and the temperature trip out of reach: this is the post-contingency
flow before any protection acts). Each outage starts from the same snapshot. Read back: the
loading of every line (|I| / rating, larger end), unserved load (dead buses), energized
islands and the power-flow status (converged / recovered / collapsed).

Verdict of a confirmed outage: ``overload`` (a line above ``limit_loading``, default 1.0 =
its rating), ``load_loss`` (load left without supply: an island without generation, or a
collapse), else ``secure``. A ``load_loss`` whose dead buses are only the ones the outage
cuts off radially (a branch whose removal separates a part with no generation; no operating
point can serve it) is reported as ``radial`` and does not make the point insecure unless
``radial_is_insecure``. With ``confirm="none"`` a flagged outage stays ``unconfirmed``. The point
is N-1 secure when no outage is ``overload``, ``load_loss`` or ``unconfirmed`` (fail closed).

Units: MW, MVAr, loading as a fraction of the rating (1.0 = 100 %).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from plants.grid.network import PF_STATUS_NAMES, GridModel

SCREEN_LOADING = 0.9      # DC screening threshold (fraction of the rating)
LIMIT_LOADING = 1.0       # AC verdict threshold (fraction of the rating)
CONFIRM_DT_S = 1e-3       # length of the AC step that applies the outage (s): no dynamics to speak of
UNSERVED_TOL_MW = 1e-6
# verdicts that make a point not N-1 secure ("unconfirmed": flagged by DC, not checked with AC: fail closed)
INSECURE = ("overload", "load_loss", "unconfirmed")


@dataclass
class Outage:
    """One single-branch outage (``branch``: 0-based row; ``line`` the 1-based id of the plant)."""

    branch: int
    line: int
    from_bus: int
    to_bus: int
    base_mw: float                   # AC flow on the branch before the outage (from end)
    islanding: bool                  # the branch is a bridge of the closed network
    dc_max_loading: float            # largest DC-estimated post-outage loading (fraction); nan if islanding
    dc_worst_line: int               # 1-based line id of that maximum (0: none)
    critical: bool                   # confirmed with AC (screening flagged it, or confirm="all")
    flagged: bool = False            # the DC screen flagged it (loading above the threshold, or islanding)
    ac_max_loading: float = float("nan")
    ac_worst_line: int = 0
    overloaded_lines: list = field(default_factory=list)   # 1-based ids above limit_loading (AC)
    unserved_mw: float = float("nan")
    islands: int = 0
    pf_status: str = ""
    verdict: str = "screened"        # screened (DC only, below threshold) | unconfirmed (flagged, confirm="none")
    #                                  | secure | radial | overload | load_loss


@dataclass
class N1Result:
    """Outcome of :func:`screen` (``outages`` in branch order; ``secure`` the overall verdict)."""

    case_name: str
    n_branch: int
    screen_loading: float
    limit_loading: float
    base_max_loading: float
    outages: list

    @property
    def insecure(self) -> list:
        return [o for o in self.outages if o.verdict in INSECURE]

    @property
    def secure(self) -> bool:
        return not self.insecure

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "outages"}
        d["secure"] = self.secure
        d["insecure_lines"] = [o.line for o in self.insecure]
        d["confirmed"] = sum(o.critical for o in self.outages)
        d["outages"] = [asdict(o) for o in self.outages]
        return d


def unprotected(model: GridModel) -> GridModel:
    """A private copy of ``model`` (case, parameters, inputs, state) whose protection never acts."""
    m = GridModel(copy.deepcopy(model.case), replace(model.p, soft_limit=1e9, hard_limit=1e9, temp_trip_c=np.inf))
    for name in ("h_s", "droop_pu", "dtemp_rated_k", "tau_thermal_s", "gen_p_set_mw", "gen_v_set_pu", "gen_scale",
                 "load_scale", "load_shed", "tap"):
        getattr(m, name)[:] = getattr(model, name)
    m.set_state(model.get_state())
    m.balance()
    return m


def radial_parts(model: GridModel) -> dict[int, np.ndarray]:
    """Bridges whose removal cuts off a part with no in-service generator: branch -> its buses (bool)."""
    from plants.grid.topology import islands

    c, st = model.case, model.state
    gen_buses = np.zeros(c.n_bus, dtype=bool)
    gen_buses[c.gen_bus[st["gen_on"] > 0]] = True
    parent = np.zeros(c.n_bus, dtype=np.int64)
    lab = np.zeros(c.n_bus, dtype=np.int64)
    out = {}
    br = st["br_status"].copy()
    for k in np.flatnonzero(br > 0):
        br[k] = 0
        islands(c.f_bus, c.t_bus, br, parent, lab)
        br[k] = 1
        a, b = lab[c.f_bus[k]], lab[c.t_bus[k]]
        if a == b:
            continue
        for r in (a, b):
            part = lab == r
            if not gen_buses[part].any():
                out[int(k)] = part
    return out


def dc_screen(model: GridModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimated post-outage loading n_branch x n_branch [l, k], islanding per k, closed per k).

    Column k holds every line's loading after branch k opens (nan for islanding and open k,
    and on the diagonal)."""
    o, st = model.out, model.state
    _, lodf, islanding = model.sensitivities()
    p, q, load = o["pf_mw"], o["qf_mvar"], o["loading"]
    post_p = p[:, None] + lodf * p[None, :]
    s0 = np.hypot(p, q)
    s1 = np.hypot(post_p, q[:, None])
    rating = np.where(model.case.rate_a_mva > 0, model.case.rate_a_mva, np.inf)
    est = np.where(s0[:, None] > 1e-9, load[:, None] * s1 / np.where(s0 > 1e-9, s0, 1.0)[:, None],
                   s1 / rating[:, None])
    closed = st["br_status"] > 0
    est[~closed, :] = 0.0
    est[:, ~closed | islanding] = np.nan
    np.fill_diagonal(est, np.nan)
    return est, islanding, closed


def ac_outage(model: GridModel, snapshot: dict, k: int) -> dict:
    """The AC post-contingency state of opening branch ``k`` (protection off; see module docstring)."""
    model.set_state(snapshot)
    model.cmd_open[:] = 0
    model.cmd_close[:] = 0
    model.cmd_open[k] = 1
    try:
        model.step(CONFIRM_DT_S)
    finally:
        model.cmd_open[k] = 0
    o = model.out
    return {"loading": o["loading"].copy(), "unserved_mw": float(o["unserved_load_mw"][0]),
            "islands": int(o["n_islands"][0]), "pf_status": int(o["pf_status"][0]),
            "dead": o["role"] == 0}


def screen(model: GridModel, *, screen_loading: float = SCREEN_LOADING, limit_loading: float = LIMIT_LOADING,
           confirm: str = "critical", radial_is_insecure: bool = False, case_name: str = "") -> N1Result:
    """N-1 screen of ``model``'s current operating point (the model itself is not changed).

    ``confirm``: "critical" (AC on the outages the DC screen flags), "all" or "none"."""
    if confirm not in ("critical", "all", "none"):
        raise ValueError(f"confirm: {confirm!r} is not 'critical', 'all' or 'none'")
    if not (np.isfinite(screen_loading) and screen_loading > 0):
        raise ValueError(f"screen_loading: {screen_loading!r} must be a finite fraction > 0")
    if not (np.isfinite(limit_loading) and limit_loading > 0):
        raise ValueError(f"limit_loading: {limit_loading!r} must be a finite fraction > 0")
    m = unprotected(model)
    c = m.case
    base_loading = m.out["loading"].copy()
    base_pf_mw = m.out["pf_mw"].copy()   # m.out is overwritten by each AC confirmation
    est, islanding, closed = dc_screen(m)
    radial = radial_parts(m)
    dead_before = m.out["role"] == 0
    snap = m.get_state()
    outages = []
    for k in range(c.n_branch):
        if not closed[k]:
            continue
        col = est[:, k]
        finite = np.isfinite(col)
        worst = int(np.nanargmax(col)) if finite.any() else -1
        dc_max = float(col[worst]) if worst >= 0 else float("nan")
        flagged = bool(islanding[k]) or dc_max > screen_loading
        critical = confirm == "all" or (confirm == "critical" and flagged)
        o = Outage(branch=k, line=k + 1, from_bus=int(c.bus_id[c.f_bus[k]]), to_bus=int(c.bus_id[c.t_bus[k]]),
                   base_mw=float(base_pf_mw[k]), islanding=bool(islanding[k]), dc_max_loading=dc_max,
                   dc_worst_line=worst + 1, critical=critical, flagged=flagged)
        if flagged and not critical:
            o.verdict = "unconfirmed"
        if critical:
            r = ac_outage(m, snap, k)
            load = r["loading"].copy()
            load[k] = 0.0
            w = int(np.argmax(load))
            o.ac_max_loading, o.ac_worst_line = float(load[w]), w + 1
            o.overloaded_lines = [int(i) + 1 for i in np.flatnonzero(load > limit_loading)]
            o.unserved_mw, o.islands = r["unserved_mw"], r["islands"]
            o.pf_status = PF_STATUS_NAMES.get(r["pf_status"], str(r["pf_status"]))
            newly_dead = r["dead"] & ~dead_before
            if o.overloaded_lines:
                o.verdict = "overload"
            elif o.unserved_mw > UNSERVED_TOL_MW or r["pf_status"] == 2:
                cut = radial.get(k)
                only_radial = cut is not None and not (newly_dead & ~cut).any() and r["pf_status"] != 2
                o.verdict = "radial" if only_radial and not radial_is_insecure else "load_loss"
            else:
                o.verdict = "secure"
        outages.append(o)
    m.set_state(snap)
    return N1Result(case_name=case_name, n_branch=c.n_branch, screen_loading=screen_loading,
                    limit_loading=limit_loading, base_max_loading=float(base_loading.max()) if base_loading.size
                    else 0.0, outages=outages)


def operating_point(plant, u: np.ndarray) -> GridModel:
    """A private GridModel of a built grid plant (``plants.grid.build``) at the inputs ``u``
    (the plant's input vector, spec order) and nominal parameters, balanced (slack at rest)."""
    from plants.grid.plant import kernels_of

    k = kernels_of(plant)
    L, spec = k.lay, plant.spec
    p = spec.nominal("params")
    case = copy.deepcopy(k.case)
    case.rate_a_mva[:] = p[L["p.rating"]]
    case.r_pu[:], case.x_pu[:] = p[L["p.r"]], p[L["p.x"]]
    m = GridModel(case, copy.deepcopy(k.model.p))
    m.h_s[:], m.droop_pu[:], m.tau_thermal_s[:] = p[L["p.h"]], p[L["p.droop"]], p[L["p.tau"]]
    m.gen_p_set_mw[:] = u[L["u.p_set"]]
    m.gen_v_set_pu[:] = u[L["u.v_set"]]
    m.load_scale[:] = u[L["u.load_scale"]]
    m.load_shed[:] = u[L["u.shed"]]
    if k.trafo_rows.size:
        m.tap[k.trafo_rows] = u[L["u.tap"]]
    st = m.get_state()
    st["gen_on"][:] = np.where(u[L["u.on"]] >= 0.5, 1, 0)
    st["br_status"][:] = np.where(u[L["u.open"]] >= 0.5, 0, st["br_status"])
    m.set_state(st)
    m.balance()
    return m


def n1_ratings(model: GridModel, case_rate_a_mva: np.ndarray, margin: float = 1.1,
               floor_mva: float = 100.0) -> tuple[np.ndarray, np.ndarray]:
    """Ratings (MVA per branch) under which ``model``'s operating point is N-1 secure, and a bool
    per branch telling which came from the case data (``case_rate_a_mva`` > 0, the file's
    RATE_A, kept as they are: those lines may still be overloaded, which :func:`screen` reports).

    Rule for a branch without a case rating: ``max(margin * I_max * baseMVA, floor_mva)`` where
    I_max (pu) is the largest current the branch carries in the base case and after every
    single-branch outage (AC, protection off, as :func:`screen` confirms them). A rating is the
    current at 1 pu voltage (as ``dynamics.branch_flows`` reads it), so with margin > 1 every
    post-outage loading of these branches stays at or below 1 / margin."""
    if not (np.isfinite(margin) and margin >= 1.0):
        raise ValueError(f"margin: {margin!r} must be a finite number >= 1")
    if not (np.isfinite(floor_mva) and floor_mva > 0):
        raise ValueError(f"floor_mva: {floor_mva!r} must be a finite number > 0 (MVA)")
    m = unprotected(model)
    c = m.case
    i_max = m.out["i_pu"].copy()
    snap = m.get_state()
    for k in np.flatnonzero(snap["br_status"] > 0):
        m.set_state(snap)
        m.cmd_open[k] = 1
        try:
            m.step(CONFIRM_DT_S)
        finally:
            m.cmd_open[k] = 0
        i = m.out["i_pu"].copy()
        i[k] = 0.0
        np.maximum(i_max, i, out=i_max)
    m.set_state(snap)
    case_rate = np.asarray(case_rate_a_mva, dtype=np.float64)
    from_case = case_rate > 0
    derived = np.maximum(margin * i_max * c.base_mva, floor_mva)
    return np.where(from_case, case_rate, derived), from_case
