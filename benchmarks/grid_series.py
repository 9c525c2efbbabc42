"""Batches of AC power flows on case118: a load time series and the N-1 of all 186 branches,
hil's compiled batch loops (plants/grid/batch.py) against lightsim2grid's `TimeSeriesCPP` and
`ContingencyAnalysisCPP`.

A separate script from grid_speed.py (which times one solve per call): here one call is a whole
batch, and both peers are the lightsim2grid classes built for batches. It reuses grid_peers.py's
case loading and hand-over: lightsim2grid builds case118 from pandapower's network, and its own
solver-order Ybus, Sbus and bus types are handed unchanged to hil.

Fairness (benchmarks/README.md):
- Peer path: `TimeSeriesCPP(LSGrid)` fed with `modify_gen_p/modify_sgen_p/modify_load_p/q`
  + `compute(V0, max_iter, tol)` (the documented setter API; `TimeSerie` is its grid2op wrapper
  around the same object; NR_KLU, its default), and `ContingencyAnalysisCPP(LSGrid)` with
  `add_all_n1()` + `compute(V_base, max_iter, tol)` (`ContingencyAnalysis` is its grid2op wrapper),
  one thread (`nb_thread = 1`, hil is single-threaded too).
- Identical work: the same injections (loads rounded to 1/64 MW, exact in lightsim2grid's inputs),
  the same start (series: flat start at step 0, then each step from the previous answer; N-1:
  every outage from the base case's answer), the same tolerance and max iterations.
  Timed on both sides: handing the T x n_load load arrays over (lightsim2grid's setters; hil's
  argument) and the whole batch. Outside the timer on both sides: the network model (LSGrid's
  per-branch admittances `yac_*`, which hil reads as its branch stamps; hil's ordering and
  symbolic LU) and reading the voltages back.
- Outages without an answer: lightsim2grid does not solve an outage that disconnects the grid,
  and reports an outage whose Newton fails as not converged (neither is in `converged_mask`);
  hil reports ISLANDED (no slack reachable) or its Newton status. The two sets of unsolved
  outages are checked to be identical and excluded from the answer comparison on both sides
  (their time stays in both totals); case118 has 9, all islanding, and no Newton failure.
  Where Newton fails (case300: 16 outages) each side gives up its own way (hil at its divergence
  test, lightsim2grid at its own), so the totals are not identical work: the JSON says
  ``identical_work: false`` and the N-1 goal is not counted as met.
- Answers: complex voltages of every step / every solved outage agree within ``AGREE_PU``, and
  the from-end active flow of every branch in every solved outage (hil's from its voltages and
  the stamps, lightsim2grid's `compute_power_flows`) within ``AGREE_FLOW_MW``, checked before any
  figure is printed.
- hil's Python loop (NewtonWorkspace.solve called per step, Sbus built in NumPy: what a user
  without the batch entry writes) is timed beside them for information (no goal).
- Iterations: lightsim2grid reports ~5 % more Newton iterations (one KLU refactorization each)
  on the series and ~7 % more on the N-1 than hil at the same tolerance; `us_per_iteration`
  separates that from the cost of one iteration.
- Timing: benchmarks/fair.py (blocks interleaved, order rotated, >= 3 repeats), process CPU time.

Last stdout line: JSON {series: {...}, n1: {...}, goals, goals_met, goal_met, headline}.
Usage: python benchmarks/grid_series.py [--quick] [--steps 1000] [--case case118]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fair import PROCESS, interleaved, ratio  # noqa: E402
from grid_peers import MAX_ITER, TOL_PU, HilSide, build_problem, load_scales  # noqa: E402

from plants.grid.batch import ISLANDED, solve_outages, solve_series  # noqa: E402
from plants.grid.newton import CONVERGED, STATUS_NAMES, NewtonWorkspace, bus_flags  # noqa: E402

AGREE_PU = 1e-6       # both stop at max |F| < TOL_PU = 1e-8; their voltages then agree to ~1e-9
STATUS = {**STATUS_NAMES, ISLANDED: "islanded"}
AGREE_FLOW_MW = 1e-3  # from-end active flows (MW) per branch and outage; seen ~1e-7
GOALS = dict(series_ratio_lightsim2grid_over_hil=1.0, n1_ratio_lightsim2grid_over_hil=1.0)


def solver_stats(computer) -> dict:
    """lightsim2grid's own KLU counters (evidence that its symbolic analysis and first
    factorization are kept and later solves only refactorize)."""
    st = computer.get_linear_solver_stats()
    return {k: int(getattr(st, k)) for k in ("nb_factorize", "nb_refactorize", "nb_refactorize_failed",
                                             "nb_fallback_factorize") if hasattr(st, k)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _hil_base(p):
    ws = NewtonWorkspace.for_pattern(p.ybus.indptr, p.ybus.indices)
    free_va, free_vm = bus_flags(p.n, p.ref, p.pv, p.pq)
    return ws, np.ascontiguousarray(p.ybus.data), free_va, free_vm


def series(p, steps: int, repeats: int, blocks: int, seed: int = 11) -> dict:
    """T warm-started steps, every load moving 1-2 % per step (grid_peers.load_scales)."""
    from lightsim2grid.timeSerie import TimeSeriesCPP

    scales = load_scales(len(p.load_p_mw), steps, seed)
    lp = np.empty((steps, len(p.load_p_mw)))
    lq = np.empty_like(lp)
    for k in range(steps):
        lp[k], lq[k] = p.loads(scales[k])
    gen_p = np.tile([g.target_p_mw for g in p.grid.get_generators()], (steps, 1))
    sgen_p = np.zeros((steps, len(list(p.grid.get_static_generators()))))
    ts = TimeSeriesCPP(p.grid)
    ts.nb_thread = 1
    v0_me = np.ones(p.grid.total_bus(), dtype=complex)
    v0_me[p.me_of_solver] = p.v_flat

    def lightsim():
        ts.modify_gen_p(gen_p)
        ts.modify_sgen_p(sgen_p)
        ts.modify_load_p(lp)
        ts.modify_load_q(lq)
        ts.compute(v0_me, MAX_ITER, TOL_PU)

    ws, ydata, free_va, free_vm = _hil_base(p)
    sbus_fixed = p.sbus(np.zeros_like(p.load_p_mw), np.zeros_like(p.load_q_mvar))
    vm, va = np.empty(p.n), np.empty(p.n)
    res = {}

    def hil():
        vm[:] = np.abs(p.v_flat)
        va[:] = np.angle(p.v_flat)
        res["out"] = solve_series(ws, ydata, sbus_fixed, p.load_bus, lp, lq, p.sn_mva, vm, va, free_va, free_vm,
                                  TOL_PU, MAX_ITER)

    py = HilSide(p)                     # hil without the batch entry: NewtonWorkspace.solve per step from Python

    def hil_python_loop():
        py.reset(p.v_flat)
        for k in range(steps):
            py.set_loads(lp[k], lq[k])
            py.solve(TOL_PU)
        res["py_last"] = py.voltage()

    lightsim()
    hil()
    hil_python_loop()
    if ts.get_status() != 1:
        raise RuntimeError(f"lightsim2grid TimeSeriesCPP failed after {ts.nb_solved()} steps")
    hvm, hva, hstatus, hiter = res["out"]
    if (hstatus != CONVERGED).any():
        raise RuntimeError(f"hil series: {int((hstatus != CONVERGED).sum())} steps did not converge")
    v_ls = np.asarray(ts.get_voltages())[:, p.me_of_solver]
    dv = float(np.abs(hvm * np.exp(1j * hva) - v_ls).max())
    if dv > AGREE_PU:
        raise AssertionError(f"series: hil and lightsim2grid disagree by {dv:.2e} pu")
    dv_py = float(np.abs(res["py_last"] - hvm[-1] * np.exp(1j * hva[-1])).max())
    if dv_py > 1e-12:
        raise AssertionError(f"series: hil's batch and its Python loop disagree by {dv_py:.2e} pu")
    t = interleaved({"hil": hil, "lightsim2grid": lightsim, "hil_python_loop": hil_python_loop},
                    {"hil": steps, "lightsim2grid": steps, "hil_python_loop": steps}, blocks, repeats,
                    clock=PROCESS, warmup=False)
    ls_iter = np.asarray(ts.get_row_nb_iter())
    per_it = {"hil": float(t["hil"]["median"] * steps / hiter.sum()),
              "lightsim2grid": float(t["lightsim2grid"]["median"] * steps / ls_iter.sum())}
    return {"steps": steps, "repeats": repeats, "blocks": blocks, "tol_pu": TOL_PU, "us_per_step": t,
            "ratio_lightsim2grid_over_hil": ratio(t["lightsim2grid"], t["hil"]),
            "ratio_lightsim2grid_over_hil_python_loop": ratio(t["lightsim2grid"], t["hil_python_loop"]),
            "us_per_iteration": per_it, "max_dv_pu": dv,
            "iterations_median": {"hil": float(np.median(hiter)), "lightsim2grid": float(np.median(ls_iter))},
            "iterations_total": {"hil": int(hiter.sum()), "lightsim2grid": int(ls_iter.sum())},
            "lightsim2grid_klu": solver_stats(ts), "lightsim2grid_own_total_time_s_last_call": float(ts.total_time())}


def branch_stamps(p) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(pos (n_branch, 4) Ybus data positions, y4 (n_branch, 4) pu stamps, names) of LSGrid's lines
    then trafos (ContingencyAnalysis's branch order), from LSGrid's own per-branch admittances."""
    solver_of_me = np.full(p.grid.total_bus(), -1, dtype=np.int64)
    solver_of_me[p.me_of_solver] = np.arange(p.n)
    ybus = p.ybus
    elems = [("line", e) for e in p.grid.get_lines()] + [("trafo", e) for e in p.grid.get_trafos()]
    pos = np.empty((len(elems), 4), dtype=np.int64)
    y4 = np.empty((len(elems), 4), dtype=np.complex128)
    names = []

    def at(i, j):
        row = ybus.indices[ybus.indptr[i]:ybus.indptr[i + 1]]
        k = int(np.searchsorted(row, j))
        if k >= len(row) or row[k] != j:
            raise KeyError(f"Ybus has no entry ({i}, {j})")
        return ybus.indptr[i] + k

    for b, (kind, e) in enumerate(elems):
        f, t = solver_of_me[e.bus1_id], solver_of_me[e.bus2_id]
        if f < 0 or t < 0 or not e.connected_global:
            raise ValueError(f"{kind} {e.id}: not connected in the base case")
        pos[b] = (at(f, f), at(f, t), at(t, f), at(t, t))
        y4[b] = (e.yac_11, e.yac_12, e.yac_21, e.yac_22)
        names.append(f"{kind}{e.id}")
    # the stamps must rebuild Ybus: off-diagonals exactly, the diagonal up to the bus shunts
    rebuilt = np.zeros(ybus.nnz, dtype=complex)
    np.add.at(rebuilt, pos.ravel(), y4.ravel())
    diag = np.array([at(i, i) for i in range(p.n)])
    off = np.ones(ybus.nnz, dtype=bool)
    off[diag] = False
    err = float(np.abs(rebuilt[off] - ybus.data[off]).max())
    if err > 1e-9 * float(np.abs(ybus.data).max()):
        raise AssertionError(f"LSGrid's branch admittances do not rebuild its Ybus (off-diagonal error {err:.2e})")
    return pos, y4, names


def _flow_mismatch_mw(p, ca, pos, y4, hvm, hva, ok) -> float:
    """Largest |P_from| difference (MW) over every branch of every solved outage: hil's from-end flow
    P = Re(V_f conj(Yff V_f + Yft V_t)) * sn_mva from its voltages and the stamps (the outaged
    branch carries 0) against lightsim2grid's own ``compute_power_flows``."""
    ls_p = np.asarray(ca.compute_power_flows())
    f = np.array([p.ybus.indices[k] for k in pos[:, 0]])           # (f, f) entry: column = from bus
    t = np.array([p.ybus.indices[k] for k in pos[:, 1]])           # (f, t) entry: column = to bus
    worst = 0.0
    for c in np.flatnonzero(ok):
        v = hvm[c] * np.exp(1j * hva[c])
        pf = (v[f] * np.conj(y4[:, 0] * v[f] + y4[:, 1] * v[t])).real * p.sn_mva
        pf[c] = 0.0
        worst = max(worst, float(np.abs(pf - ls_p[c]).max()))
    return worst


def n1(p, repeats: int, blocks: int) -> dict:
    """The AC power flow of every single-branch outage from the base case's answer."""
    from lightsim2grid.contingencyAnalysis import ContingencyAnalysisCPP

    ws, ydata, free_va, free_vm = _hil_base(p)
    vm0, va0 = np.abs(p.v_flat).copy(), np.angle(p.v_flat).copy()
    if ws.solve(ydata, p.sbus0, vm0, va0, free_va, free_vm, TOL_PU, MAX_ITER) != CONVERGED:
        raise RuntimeError("hil: base case did not converge")
    pos, y4, names = branch_stamps(p)
    branches = np.arange(len(pos))
    v_base_me = np.ones(p.grid.total_bus(), dtype=complex)
    v_base_me[p.me_of_solver] = vm0 * np.exp(1j * va0)
    ca = ContingencyAnalysisCPP(p.grid)
    ca.nb_thread = 1
    ca.add_all_n1()
    res = {}

    def lightsim():
        ca.compute(v_base_me, MAX_ITER, TOL_PU)

    def hil():
        res["out"] = solve_outages(ws, ydata, pos, y4, branches, p.sbus0, vm0, va0, free_va, free_vm, TOL_PU,
                                   MAX_ITER)

    lightsim()
    hil()
    hvm, hva, hstatus, hiter = res["out"]
    v_ls = np.asarray(ca.get_voltages())
    if v_ls.shape[0] != len(branches):
        raise AssertionError(f"ContingencyAnalysis has {v_ls.shape[0]} contingencies, hil {len(branches)}")
    ls_ok = np.asarray(ca.converged_mask(), dtype=bool)
    hil_ok = hstatus == CONVERGED
    if not np.array_equal(ls_ok, hil_ok):
        diff = np.where(ls_ok != hil_ok)[0]
        raise AssertionError(f"N-1: solved outages differ: {[(names[c], int(hstatus[c]), bool(ls_ok[c])) for c in diff]}")
    failed = [(names[c], STATUS[int(hstatus[c])]) for c in np.flatnonzero(~hil_ok & (hstatus != ISLANDED))]
    v_hil = hvm[hil_ok] * np.exp(1j * hva[hil_ok])
    dv = float(np.abs(v_hil - v_ls[hil_ok][:, p.me_of_solver]).max())
    if dv > AGREE_PU:
        raise AssertionError(f"N-1: hil and lightsim2grid disagree by {dv:.2e} pu")
    dp = _flow_mismatch_mw(p, ca, pos, y4, hvm, hva, hil_ok)
    if dp > AGREE_FLOW_MW:
        raise AssertionError(f"N-1: branch flows of hil and lightsim2grid disagree by {dp:.2e} MW")
    t = interleaved({"hil": hil, "lightsim2grid": lightsim}, {"hil": len(branches), "lightsim2grid": len(branches)},
                    blocks, repeats, clock=PROCESS, warmup=False)
    ls_iter = np.asarray(ca.get_row_nb_iter())
    per_it = {"hil": float(t["hil"]["median"] * len(branches) / hiter[hil_ok].sum()),
              "lightsim2grid": float(t["lightsim2grid"]["median"] * len(branches) / ls_iter[ls_ok].sum())}
    return {"us_per_iteration": per_it, "outages": len(branches), "solved": int(hil_ok.sum()),
            "islanding_excluded": [names[c] for c in np.flatnonzero(hstatus == ISLANDED)],
            "not_converged_excluded": failed, "identical_work": not failed, "tol_pu": TOL_PU,
            "repeats": repeats, "blocks": blocks, "us_per_outage": t,
            "ms_all_outages": {k: v["median"] * len(branches) / 1e3 for k, v in t.items()},
            "ratio_lightsim2grid_over_hil": ratio(t["lightsim2grid"], t["hil"]), "max_dv_pu": dv,
            "max_dp_flow_mw": dp,
            "iterations_total": {"hil": int(hiter[hil_ok].sum()), "lightsim2grid": int(ls_iter[ls_ok].sum())},
            "lightsim2grid_klu": solver_stats(ca), "lightsim2grid_own_total_time_s_last_call": float(ca.total_time())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run (fewer steps and blocks; not published)")
    ap.add_argument("--steps", type=int, default=1000, help="time-series steps (1-2 %% load moves per step)")
    ap.add_argument("--case", default="case118", help="case118 (pandapower's) or a MATPOWER case name (grid_peers.CASES)")
    args = ap.parse_args()
    steps = 100 if args.quick else args.steps
    blocks = 2 if args.quick else 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = build_problem(args.case)
    s = series(p, steps, 3, blocks)
    log(f"hil from a Python loop (NewtonWorkspace.solve per step, informational): "
        f"{s['us_per_step']['hil_python_loop']['median']:.2f} us/step (LSGrid TimeSeriesCPP / it "
        f"{s['ratio_lightsim2grid_over_hil_python_loop']:.2f}); per Newton iteration: {s['us_per_iteration']}")
    log(f"{args.case} series of {steps} steps: hil {s['us_per_step']['hil']['median']:.2f} us/step, lightsim2grid "
        f"TimeSeriesCPP {s['us_per_step']['lightsim2grid']['median']:.2f} us/step (ratio {s['ratio_lightsim2grid_over_hil']:.2f}); "
        f"iterations {s['iterations_total']}; max |dV| {s['max_dv_pu']:.1e} pu; lightsim2grid KLU {s['lightsim2grid_klu']}")
    c = n1(p, 3, blocks)
    log(f"{args.case} N-1 ({c['outages']} branches, {c['solved']} solved; excluded on both: islanding "
        f"{c['islanding_excluded']}, not converged {c['not_converged_excluded']}): hil {c['ms_all_outages']['hil']:.2f} ms, lightsim2grid ContingencyAnalysisCPP "
        f"{c['ms_all_outages']['lightsim2grid']:.2f} ms (ratio {c['ratio_lightsim2grid_over_hil']:.2f}); "
        f"iterations {c['iterations_total']}; max |dV| {c['max_dv_pu']:.1e} pu; lightsim2grid KLU {c['lightsim2grid_klu']}")
    goals_met = {"series_ratio_lightsim2grid_over_hil": s["ratio_lightsim2grid_over_hil"] >= GOALS["series_ratio_lightsim2grid_over_hil"],
                 "n1_ratio_lightsim2grid_over_hil": c["identical_work"]
                 and c["ratio_lightsim2grid_over_hil"] >= GOALS["n1_ratio_lightsim2grid_over_hil"]}
    headline = [
        {"figure": f"{args.case} time series ({steps} steps, loads 1-2 %/step), per step, process CPU",
         "hil": s["us_per_step"]["hil"]["median"], "peer": s["us_per_step"]["lightsim2grid"]["median"],
         "peer_name": "lightsim2grid TimeSeriesCPP", "ratio": s["ratio_lightsim2grid_over_hil"], "unit": "us",
         "goal": GOALS["series_ratio_lightsim2grid_over_hil"], "met": goals_met["series_ratio_lightsim2grid_over_hil"]},
        {"figure": f"{args.case} N-1, all {c['outages']} branches AC, process CPU", "hil": c["ms_all_outages"]["hil"],
         "peer": c["ms_all_outages"]["lightsim2grid"], "peer_name": "lightsim2grid ContingencyAnalysisCPP",
         "ratio": c["ratio_lightsim2grid_over_hil"], "unit": "ms", "goal": GOALS["n1_ratio_lightsim2grid_over_hil"],
         "met": goals_met["n1_ratio_lightsim2grid_over_hil"]}]
    print(json.dumps({"case": args.case, "series": s, "n1": c, "goals": GOALS, "goals_met": goals_met,
                      "goal_met": all(goals_met.values()), "headline": headline, "quick": args.quick}))


if __name__ == "__main__":
    main()
