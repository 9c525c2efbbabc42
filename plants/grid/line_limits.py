"""The safety wrapper's state-dependent line limits for the grid plant: the limit family
`SAFETY_LIMITS["line_rating"]` (`[[safety.projection.plant]] kind = "line_rating"`,
hil/safety/projection.py): PTDF rows of the topology an observation shows, on each line's
loading headroom."""

from __future__ import annotations

import copy
import math

import numpy as np
from numba import njit

from plants.base import PlantModel
from plants.grid.network import GridModel
from plants.grid.params import GridParams
from plants.grid.plant import kernels_of


class LineFlowLimits:
    """Line-rating limits `W a <= b` on the units' set-points among the actions (the plant
    family `line_rating`; options: `margin`, the fraction of each rating to stay under,
    default the plant option `limit_margin`, itself 0.95 by default).

    Per closed line l (MW, from end), DC sensitivities of the topology the observation shows:

        f_l' = f_l + sum_g PTDF[l, bus_g] * (p_set_g' - p_set_g)      (injection at the unit's
                                                                       bus, taken at its island's slack)
        -P_max,l <= f_l' <= P_max,l,
        P_max,l = |f_l| + (margin - loading_l) * rating_l * v_l    (MW)

    f_l measured (`line.p_mw`), loading_l measured (`line.loading` / 100: |I| of the worse end
    over the rating, line charging and reactive flow included), v_l the lower of the two end
    voltages (pu), p_set_g applied (`gen.p_set`); the units that are not actions keep their
    applied set-point (their part is in b). The loading's headroom is turned into MW
    conservatively: |S| = V |I| moves by at most |dP| for a fixed Q, so the rows keep the
    loading under the margin to first order, re-linearized every step (a line above the
    margin gets a row pulling its flow back).

    Fixed shape for the projection: m = 2 x lines, rows `line_<k>.fwd` (f' <= P_max) and
    `line_<k>.rev` (-f' <= P_max) per line in the spec's order; the rows of an open line, of a
    line no action moves, and of a line no move inside the actions' physical box could
    overload are zero (W = 0, b = 0: always held). PTDF is recomputed when `line.closed` or
    `gen.in_service` change (a trip). `reads` are the outputs the rows use (flows, loadings,
    voltages, breaker and unit status): a Bad one makes the rows unknown and the wrapper
    fails closed; `fill` raises ValueError on non-finite input too (the wrapper then holds the
    applied set-points). `lodf()` gives the current LODF (n_branch x n_branch) for N-1 checks.

    N-1 rows (option `contingencies`, a list of 1-based branch rows; `n1_margin`, default 1.0):
    for each listed branch k and each other line l, the flow after k opens, from LODF of the
    observed topology, kept under l's rating as the base rows keep the flow under `margin`:

        f_l|k' = f_l + LODF[l, k] f_k + sum_g (PTDF[l, bus_g] + LODF[l, k] PTDF[k, bus_g]) (a_g - u_g)
        -P_n1,l <= f_l|k' <= P_n1,l,    P_n1,l = |f_l| + (n1_margin - loading_l) * rating_l * v_l

    (the same first-order conversion of loading headroom into MW as the base rows). Rows
    `line_<l>.n1_<k>.fwd` / `.rev` after the base rows, 2 x lines per contingency; zero when k
    is open, when its outage would island the network (no finite LODF: `hil grid n1` confirms
    those with AC), for l = k, and where no move inside the box could overload l after k opens.

    Called as `limits(y, u)` it returns (W, b, names) of the non-zero rows over ALL the
    plant's inputs (built with action_names=None: every input is an action): for analysis.
    """

    def __init__(self, model: PlantModel, action_names=None, options: dict | None = None):
        k = kernels_of(model)
        spec = model.spec
        self.spec, L = spec, k.lay
        self.lay = L
        options = dict(options or {})
        extra = sorted(set(options) - {"margin", "contingencies", "n1_margin"})
        if extra:
            raise ValueError(f"{extra[0]}: not an option of line_rating (options: margin, contingencies, n1_margin)")
        default = float(model.options.get("limit_margin", 0.95)) if model.options else 0.95
        try:
            self.margin = float(options.get("margin", default))
        except (TypeError, ValueError):
            raise ValueError(f"margin: {options['margin']!r} is not a number") from None
        if not (math.isfinite(self.margin) and 0.0 < self.margin <= 1.5):
            raise ValueError(f"margin: {self.margin} is not a fraction of the rating in (0, 1.5]")
        self.action_names = list(spec.names("inputs")) if action_names is None else list(action_names)
        p_set = list(spec.names("inputs")[L["u.p_set"]])
        # action columns that are a unit's set-point, and which unit each one is
        pairs = [(j, p_set.index(a)) for j, a in enumerate(self.action_names) if a in p_set]
        if not pairs:
            raise ValueError("actions: none of gen.p_set is an action input (these limits act on the units' "
                             "set-points)")
        self.cols = np.array([j for j, _ in pairs], dtype=np.intp)
        self.gen_act = np.array([g for _, g in pairs], dtype=np.intp)
        case = copy.deepcopy(k.case)  # private, at the nominal (operations') parameters: a plant
        nominal = spec.nominal("params")  # instance stepped with randomized ones never leaks in
        case.r_pu[:], case.x_pu[:] = nominal[L["p.r"]], nominal[L["p.x"]]
        case.rate_a_mva[:] = nominal[L["p.rating"]]
        self.grid = GridModel(case, GridParams())
        self.rating = nominal[L["p.rating"]]
        self.gen_bus = k.case.gen_bus
        self.f_bus, self.t_bus = k.case.f_bus, k.case.t_bus
        u_lo = spec.lows("inputs")[L["u.p_set"]]
        u_hi = spec.highs("inputs")[L["u.p_set"]]
        self.span_act = (u_hi - u_lo)[self.gen_act]
        self._topo = None
        self._H = None
        self.line_names = [n.split(".")[0] for n in spec.names("outputs")[L["y.pf"]]]
        nl = len(self.line_names)
        self.contingencies = _contingencies(options.get("contingencies", []), nl)
        try:
            self.n1_margin = float(options.get("n1_margin", 1.0))
        except (TypeError, ValueError):
            raise ValueError(f"n1_margin: {options['n1_margin']!r} is not a number") from None
        if not (math.isfinite(self.n1_margin) and 0.0 < self.n1_margin <= 2.0):
            raise ValueError(f"n1_margin: {self.n1_margin} is not a fraction of the rating in (0, 2]")
        self.m = 2 * nl * (1 + len(self.contingencies))
        self.row_names = [f"{ln}.{s}" for ln in self.line_names for s in ("fwd", "rev")]
        self.row_names += [f"{ln}.n1_{k + 1}.{s}" for k in self.contingencies for ln in self.line_names
                           for s in ("fwd", "rev")]
        idx = np.arange(spec.n_outputs)
        self.reads = np.concatenate([idx[L[key]] for key in ("y.pf", "y.loading", "y.vm", "y.closed", "y.gen_on")])

    def unknown(self, y: np.ndarray, u: np.ndarray) -> bool:
        """True if a signal the rows read is not finite (Bad)."""
        return not (np.isfinite(y[self.reads]).all() and np.isfinite(u[self.lay["u.p_set"]]).all())

    def _ptdf(self, closed: np.ndarray, gen_on: np.ndarray) -> np.ndarray:
        topo = np.concatenate([closed, gen_on]).astype(np.int8)
        if self._topo is None or not np.array_equal(topo, self._topo):
            st = self.grid.state
            st["br_status"][:] = closed
            st["gen_on"][:] = gen_on
            self.grid._topology(inherit=False)
            self._H = self.grid.sensitivities()[0]
            self._topo = topo
        return self._H

    def lodf(self) -> np.ndarray:
        return self.grid.sensitivities()[1]

    def fill(self, y: np.ndarray, u: np.ndarray, W: np.ndarray, b: np.ndarray) -> None:
        """Write the rows at this observation: W (m, n_actions), MW per MW; b (m,), MW."""
        L = self.lay
        if self.unknown(y, u):
            raise ValueError("grid line limits: a measured flow, breaker or unit status is Bad (NaN)")
        closed = np.where(y[L["y.closed"]] >= 0.5, 1, 0)
        gen_on = np.where(y[L["y.gen_on"]] >= 0.5, 1, 0)
        H = self._ptdf(closed, gen_on)
        f = y[L["y.pf"]]
        vm = y[L["y.vm"]]
        v = np.minimum(vm[self.f_bus], vm[self.t_bus])
        pmax = np.abs(f) + (self.margin - y[L["y.loading"]] / 100.0) * self.rating * v
        Ga = H[:, self.gen_bus[self.gen_act]] * gen_on[self.gen_act][None, :]   # (n_line, n_act) MW per MW
        Ga[closed == 0, :] = 0.0
        base = f - Ga @ u[L["u.p_set"]][self.gen_act]          # flow at the actions' p_set' = 0, MW
        reach = np.abs(f) + np.abs(Ga) @ self.span_act          # largest |f'| inside the box
        rows = np.flatnonzero((closed == 1) & (reach > pmax) & (np.abs(Ga).sum(axis=1) > 1e-9))
        W[:] = 0.0
        b[:] = 0.0
        W[2 * rows[:, None], self.cols[None, :]] = Ga[rows]
        W[2 * rows[:, None] + 1, self.cols[None, :]] = -Ga[rows]
        b[2 * rows] = pmax[rows] - base[rows]
        b[2 * rows + 1] = pmax[rows] + base[rows]
        if not self.contingencies:
            return
        _, lodf, islanding = self.grid.sensitivities()
        nl = len(self.line_names)
        p_n1 = np.abs(f) + (self.n1_margin - y[L["y.loading"]] / 100.0) * self.rating * v
        for j, k in enumerate(self.contingencies):
            if closed[k] == 0 or islanding[k]:
                continue
            fk = f + lodf[:, k] * f[k]                              # post-outage flows, MW
            Gk = Ga + lodf[:, k][:, None] * Ga[k][None, :]          # their sensitivities, MW per MW
            base_k = fk - Gk @ u[L["u.p_set"]][self.gen_act]
            reach_k = np.abs(fk) + np.abs(Gk) @ self.span_act
            ok = (closed == 1) & (reach_k > p_n1) & (np.abs(Gk).sum(axis=1) > 1e-9)
            ok[k] = False
            rk = np.flatnonzero(ok)
            r0 = 2 * nl * (1 + j)
            W[r0 + 2 * rk[:, None], self.cols[None, :]] = Gk[rk]
            W[r0 + 2 * rk[:, None] + 1, self.cols[None, :]] = -Gk[rk]
            b[r0 + 2 * rk] = p_n1[rk] - base_k[rk]
            b[r0 + 2 * rk + 1] = p_n1[rk] + base_k[rk]

    def __call__(self, y: np.ndarray, u: np.ndarray):
        """(W, b, names) of the non-zero rows, W over this object's actions (all inputs by default)."""
        W = np.zeros((self.m, len(self.action_names)))
        b = np.zeros(self.m)
        self.fill(y, u, W, b)
        keep = np.abs(W).sum(axis=1) > 0.0
        return W[keep], b[keep], [n for n, k in zip(self.row_names, keep) if k]


def _contingencies(value, n_line: int) -> list[int]:
    """0-based branch rows from the option `contingencies` (1-based rows, each once)."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"contingencies: {value!r} is not a list of 1-based branch rows")
    out: list[int] = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= n_line:
            raise ValueError(f"contingencies: {v!r} is not a branch row in 1..{n_line}")
        if v - 1 in out:
            raise ValueError(f"contingencies: branch {v} is listed twice")
        out.append(v - 1)
    return out


@njit(cache=True, nogil=True)
def fill_line_rows(y, u, W, b, H, topo, stale, i_closed, i_gen_on, i_pf, i_load, i_vm, i_pset, f_bus, t_bus,
                   gen_bus_act, gen_act, cols, rating, span_act, margin, Ga):
    """The compiled form of `LineFlowLimits.fill` (base rows; the in-loop shield,
    hil/loop/shield.py): W (2 lines, n_actions) MW per MW, b (2 lines,) MW, from the measured
    outputs y and the applied inputs u, with H the PTDF (n_line x n_bus) of the topology `topo`
    (line closed flags, then unit in-service flags). A topology in y other than `topo` (a trip
    since H was computed), or a non-finite applied set-point: every b is NaN (the shield fails
    closed on unknown limits) and stale[0] = 1 (the caller computes H again: `refresh`).
    margin: (1,). Ga: (n_line, n_act) scratch. Allocates nothing; the numpy form's arithmetic
    (tested to 1e-9)."""
    nl = i_pf.size
    ng = i_gen_on.size
    na = cols.size
    for r in range(W.shape[0]):
        for c in range(W.shape[1]):
            W[r, c] = 0.0
        b[r] = 0.0
    ok = True
    for l in range(nl):
        if (1 if y[i_closed[l]] >= 0.5 else 0) != topo[l]:
            ok = False
    for g in range(ng):
        if (1 if y[i_gen_on[g]] >= 0.5 else 0) != topo[nl + g]:
            ok = False
    for j in range(na):
        if not np.isfinite(u[i_pset[gen_act[j]]]):
            ok = False
    if not ok:
        stale[0] = 1
        for r in range(b.size):
            b[r] = np.nan
        return
    m = margin[0]
    for l in range(nl):
        closed = topo[l] == 1
        f = y[i_pf[l]]
        v = min(y[i_vm[f_bus[l]]], y[i_vm[t_bus[l]]])
        pmax = abs(f) + (m - y[i_load[l]] / 100.0) * rating[l] * v
        base = f
        reach = abs(f)
        tot = 0.0
        for j in range(na):
            g = 0.0
            if closed and topo[nl + gen_act[j]] == 1:
                g = H[l, gen_bus_act[j]]
            Ga[l, j] = g
            base -= g * u[i_pset[gen_act[j]]]
            reach += abs(g) * span_act[j]
            tot += abs(g)
        if closed and reach > pmax and tot > 1e-9:
            for j in range(na):
                W[2 * l, cols[j]] = Ga[l, j]
                W[2 * l + 1, cols[j]] = -Ga[l, j]
            b[2 * l] = pmax - base
            b[2 * l + 1] = pmax + base


def compiled_limits(families):
    """(kernel, args, refresh) for one `line_rating` family: kernel(y, u, W, b, *args) writes
    its rows (fill_line_rows; SAFETY_LIMITS_COMPILED_FORM "y_u": it reads the applied inputs),
    refresh(y) computes the PTDF again for the topology y shows if the kernel flagged it stale
    (Python, milliseconds: the shield's owner calls it after a step on unknown limits, off the
    common path). The N-1
    rows (option contingencies) have no compiled form yet: ValueError."""
    fams = list(families)
    if len(fams) != 1:
        raise ValueError("compiled limits: one line_rating family per shield")
    fam = fams[0]
    if fam.contingencies:
        raise ValueError("contingencies: the N-1 rows have no compiled form yet (the in-loop shield enforces "
                         "the base rows only): use [safety] placement = \"process\" for N-1 limits")
    L, spec = fam.lay, fam.spec
    idx = np.arange(spec.n_outputs)
    idx_u = np.arange(spec.n_inputs)
    nl, ng = len(fam.line_names), int(fam.gen_bus.size)
    topo = np.ones(nl + ng, dtype=np.int64)
    topo[nl:] = (spec.nominal("outputs")[idx[L["y.gen_on"]]] >= 0.5).astype(np.int64)
    topo[:nl] = (spec.nominal("outputs")[idx[L["y.closed"]]] >= 0.5).astype(np.int64)
    H = np.ascontiguousarray(fam._ptdf(topo[:nl].astype(np.int8), topo[nl:].astype(np.int8)), dtype=np.float64)
    stale = np.zeros(1, dtype=np.int64)
    args = (H, topo, stale, idx[L["y.closed"]].astype(np.int64), idx[L["y.gen_on"]].astype(np.int64),
            idx[L["y.pf"]].astype(np.int64), idx[L["y.loading"]].astype(np.int64), idx[L["y.vm"]].astype(np.int64),
            idx_u[L["u.p_set"]].astype(np.int64), fam.f_bus.astype(np.int64), fam.t_bus.astype(np.int64),
            fam.gen_bus[fam.gen_act].astype(np.int64), fam.gen_act.astype(np.int64), fam.cols.astype(np.int64),
            np.asarray(fam.rating, dtype=np.float64).copy(), np.asarray(fam.span_act, dtype=np.float64).copy(),
            np.array([fam.margin]), np.zeros((nl, fam.cols.size)))

    def refresh(y) -> bool:
        """H and topo for the topology y shows (in place) if the kernel flagged them stale; False
        if it did not or y's status signals are Bad."""
        if not stale[0]:
            return False
        closed, gen_on = y[args[3]], y[args[4]]
        if not (np.isfinite(closed).all() and np.isfinite(gen_on).all()):
            return False
        t = np.concatenate([np.where(closed >= 0.5, 1, 0), np.where(gen_on >= 0.5, 1, 0)])
        H[:] = fam._ptdf(t[:nl], t[nl:])
        topo[:] = t
        stale[0] = 0
        return True

    return fill_line_rows, args, refresh


SAFETY_LIMITS_COMPILED = compiled_limits
SAFETY_LIMITS_COMPILED_FORM = "y_u"  # the compiled fill reads the applied inputs: kernel(y, u, W, b, *args)

SAFETY_LIMITS = {"line_rating": lambda model, actions, options: LineFlowLimits(model, actions, options)}
