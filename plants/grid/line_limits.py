"""The safety wrapper's state-dependent line limits for the grid plant (`linear_limits(model)`,
used by `[safety.projection] plant_limits = true`, hil/safety/plant_limits.py): PTDF rows of
the topology an observation shows, on each line's loading headroom."""

from __future__ import annotations

import copy

import numpy as np

from plants.base import PlantModel
from plants.grid.network import GridModel
from plants.grid.params import GridParams
from plants.grid.plant import kernels_of


class LineFlowLimits:
    """The wrapper's state-dependent line limits for a grid plant (`linear_limits(model)`).

    Called with the measured outputs y and applied inputs u (plant units, spec order), it
    returns (W, b, names): rows over the plant's inputs with W @ u' <= b for the inputs u' the
    wrapper may apply. Per closed line l (MW, from end), DC sensitivities of the topology in y:

        f_l' = f_l + sum_g PTDF[l, bus_g] * (p_set_g' - p_set_g)      (injection at the unit's
                                                                       bus, taken at its island's slack)
        -P_max,l <= f_l' <= P_max,l,
        P_max,l = |f_l| + (limit_margin - loading_l) * rating_l * v_l    (MW)

    f_l measured (`line.p_mw`), loading_l measured (`line.loading` / 100: |I| of the worse end
    over the rating, line charging and reactive flow included), v_l the lower of the two end
    voltages (pu), p_set_g applied (`gen.p_set`). The loading's headroom is turned into MW
    conservatively: |S| = V |I| moves by at most |dP| for a fixed Q, so the rows keep the
    loading under limit_margin to first order, re-linearized every step (a line above the
    margin gets a row pulling its flow back). Only rows a move inside the inputs' physical box
    could violate are returned. PTDF/LODF are recomputed
    when `line.closed` or `gen.in_service` change (a trip). A signal it reads that is not
    finite (Bad) makes the rows unknown: `unknown(y, u)` says so and the wrapper fails closed.
    `lodf()` gives the current LODF (n_branch x n_branch) for N-1 checks.
    """

    def __init__(self, model: PlantModel):
        k = kernels_of(model)
        self.spec, L = model.spec, k.lay
        self.lay = L
        case = copy.deepcopy(k.case)  # private, at the nominal (operations') parameters: a plant
        nominal = model.spec.nominal("params")  # instance stepped with randomized ones never leaks in
        case.r_pu[:], case.x_pu[:] = nominal[L["p.r"]], nominal[L["p.x"]]
        case.rate_a_mva[:] = nominal[L["p.rating"]]
        self.grid = GridModel(case, GridParams())
        self.margin = float(model.options.get("limit_margin", 0.95)) if model.options else 0.95
        self.rating = model.spec.nominal("params")[L["p.rating"]]
        self.gen_bus = k.case.gen_bus
        self.f_bus, self.t_bus = k.case.f_bus, k.case.t_bus
        self.u_lo = model.spec.lows("inputs")[L["u.p_set"]]
        self.u_hi = model.spec.highs("inputs")[L["u.p_set"]]
        self.n_inputs = model.spec.n_inputs
        self._topo = None
        self._H = None
        names = model.spec.names("outputs")[L["y.pf"]]
        self.line_names = [n.split(".")[0] for n in names]

    def unknown(self, y: np.ndarray, u: np.ndarray) -> bool:
        L = self.lay
        return not (np.isfinite(y[L["y.pf"]]).all() and np.isfinite(y[L["y.loading"]]).all()
                    and np.isfinite(y[L["y.vm"]]).all()
                    and np.isfinite(y[L["y.closed"]]).all() and np.isfinite(y[L["y.gen_on"]]).all()
                    and np.isfinite(u[L["u.p_set"]]).all())

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

    def __call__(self, y: np.ndarray, u: np.ndarray):
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
        G = H[:, self.gen_bus] * gen_on[None, :]                 # (n_line, n_gen) MW per MW
        G[closed == 0, :] = 0.0
        u_set = u[L["u.p_set"]]
        base = f - G @ u_set                                    # flow at p_set' = 0, MW
        span = np.abs(G) @ (self.u_hi - self.u_lo)
        reach = np.abs(f) + span                                # largest |f'| inside the box
        rows = np.flatnonzero((closed == 1) & (reach > pmax) & (np.abs(G).sum(axis=1) > 1e-9))
        m = 2 * rows.size
        W = np.zeros((m, self.n_inputs))
        b = np.zeros(m)
        cols = np.arange(L["u.p_set"].start, L["u.p_set"].stop)
        W[0::2][:, cols] = G[rows]
        W[1::2][:, cols] = -G[rows]
        b[0::2] = pmax[rows] - base[rows]
        b[1::2] = pmax[rows] + base[rows]
        names = [f"{self.line_names[r]}.{s}" for r in rows for s in ("fwd", "rev")]
        return W, b, names


def linear_limits(model: PlantModel) -> LineFlowLimits:
    """The safety wrapper's plant-side linear limits (see LineFlowLimits)."""
    return LineFlowLimits(model)
