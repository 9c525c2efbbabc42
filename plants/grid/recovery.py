"""What the grid step does when the warm-started single-slack Newton fails (rare; may allocate).

In this order, each stage only if the previous one failed:

1. single slack from a flat start (every island at once)                        -> PF_RECOVERED
2. distributed slack (``distributed_slack.py``) from the warm start, every island -> PF_DISTRIBUTED
3. island by island, from a flat start: single slack; else distributed slack; else distributed slack
   with load continuation: the injections scaled by s = 1/k, 2/k, ..., 1 (k =
   ``GridParams.continuation_steps``), each solve warm-started from the last, a failed step bisected
   (at most ``continuation_steps`` bisections). An island that still fails is latched dead:
   "collapse after continuation"                                                   -> PF_COLLAPSED

A distributed-slack solution is folded into the units' shares (``p_share_mw``) so the dispatch
reproduces it with the slack bus at its own schedule: the next step's warm start converges with
the single slack, and the frequency model sees the same generation.
"""

from __future__ import annotations

import numpy as np

from plants.grid.distributed_slack import fold_lambda, participation
from plants.grid.newton import CONVERGED

# The step's power-flow outcome (out["pf_status"], worst over the step's solves):
PF_CONVERGED = 0     # every solve converged from the warm start
PF_RECOVERED = 1     # a solve failed from the warm start and converged (single slack) from a flat start
PF_DISTRIBUTED = 2   # single slack failed; converged with a distributed slack (with continuation if needed)
PF_COLLAPSED = 3     # an island failed every way, continuation included, and was latched dead
PF_STATUS_NAMES = {PF_CONVERGED: "converged", PF_RECOVERED: "recovered (flat start)",
                   PF_DISTRIBUTED: "converged with distributed slack", PF_COLLAPSED: "collapse after continuation"}


def _ds(model, free_va, free_vm, roots, scale: float = 1.0, reset: bool = True) -> int:
    """One distributed-slack Newton over the islands ``roots`` (bool per root bus); returns its status."""
    st, c, p, ds = model.state, model.case, model.p, model.dsw
    role = model.out["role"]
    participation(st["island"], role, c.gen_bus, st["gen_on"], c.mbase_mva, model.droop_pu, c.pmin_mw, c.pmax_mw,
                  ds.w_gen, ds.alpha, ds.w_sum)
    ds.ds_root[:] = roots
    if reset:
        ds.lam[:] = 0.0
    status = ds.solve(model.ws, model.ydata, model.sbus, st["vm"], st["va"], free_va, free_vm, st["island"],
                      model._slack_of_root, p.tol_pu, 2 * p.max_iter, scale)
    model.out["pf_mismatch_pu"][0] = model.ws.stats[1]
    return status


def _fold(model, roots) -> None:
    """Shares <- shares + w_g lambda_r for the islands ``roots``; injections rebuilt from them."""
    st, c, ds = model.state, model.case, model.dsw
    ds.lam[~roots] = 0.0
    fold_lambda(st["island"], c.gen_bus, ds.w_gen, ds.lam, c.base_mva, st["p_share_mw"])
    ds.lam[:] = 0.0
    model._injections()


def _continuation(model, free_va, free_vm, roots, members) -> tuple[bool, int]:
    """Load continuation with distributed slack from the island's flat start (see module doc)."""
    st, p = model.state, model.p
    vm, va = st["vm"], st["va"]
    k = p.continuation_steps
    s_ok, s_try, iters, bisections = 0.0, 1.0 / k, 0, 0
    model.dsw.lam[:] = 0.0
    vm_ok, va_ok, lam_ok = vm[members].copy(), va[members].copy(), model.dsw.lam.copy()
    while True:
        status = _ds(model, free_va, free_vm, roots, s_try, reset=False)
        iters += int(model.ws.stats[0])
        if status == CONVERGED:
            if s_try >= 1.0:
                return True, iters
            s_ok = s_try
            vm_ok[:], va_ok[:], lam_ok[:] = vm[members], va[members], model.dsw.lam
            s_try = min(1.0, s_ok + 1.0 / k)
            continue
        vm[members], va[members], model.dsw.lam[:] = vm_ok, va_ok, lam_ok
        bisections += 1
        if bisections > k:
            return False, iters
        s_try = 0.5 * (s_ok + s_try)


def recover(model) -> int:
    """The failure path of ``GridModel._solve`` (see module doc). Returns Newton iterations spent."""
    st, p, o = model.state, model.p, model.out
    vm, va = st["vm"], st["va"]
    model._prepare_voltages(flat=True)
    status = model.ws.solve(model.ydata, model.sbus, vm, va, model._free_va, model._free_vm, p.tol_pu, 2 * p.max_iter)
    iters = int(model.ws.stats[0])
    o["pf_mismatch_pu"][0] = model.ws.stats[1]
    if status == CONVERGED:
        return iters
    live_roots = model._slack_of_root >= 0
    vm[:], va[:] = model._vm0, model._va0
    status = _ds(model, model._free_va, model._free_vm, live_roots)
    iters += int(model.ws.stats[0])
    if status == CONVERGED:
        _fold(model, live_roots)
        o["pf_status"][0] = max(o["pf_status"][0], PF_DISTRIBUTED)
        o["distributed_this_step"][0] += int(live_roots.sum())
        return iters
    model._prepare_voltages(flat=True)
    island = st["island"]
    collapsed = 0
    one = np.zeros_like(live_roots)
    for r in np.flatnonzero(live_roots):
        members = island == r
        fa, fm = model._one_va, model._one_vm
        fa[:] = model._free_va & members
        fm[:] = model._free_vm & members
        vm_flat, va_flat = vm[members].copy(), va[members].copy()
        status = model.ws.solve(model.ydata, model.sbus, vm, va, fa, fm, p.tol_pu, 2 * p.max_iter)
        iters += int(model.ws.stats[0])
        if status == CONVERGED:
            continue
        one[:] = False
        one[r] = True
        vm[members], va[members] = vm_flat, va_flat
        status = _ds(model, fa, fm, one)
        iters += int(model.ws.stats[0])
        ok = status == CONVERGED
        if not ok:
            vm[members], va[members] = vm_flat, va_flat
            ok, it = _continuation(model, fa, fm, one, members)
            iters += it
            if ok:
                o["continuation_this_step"][0] += 1
        if ok:
            _fold(model, one)
            o["distributed_this_step"][0] += 1
            o["pf_status"][0] = max(o["pf_status"][0], PF_DISTRIBUTED)
            continue
        st["bus_dead"][members] = 1
        collapsed += 1
        vm[members] = model._vm0[members]
        va[members] = model._va0[members]
    if collapsed == 0:
        o["pf_mismatch_pu"][0] = model.ws.stats[1]
        # every island converged on its own (islands are decoupled, so this is the joint solution);
        # V and I over all buses from the final voltages
        from plants.grid.newton import _injections
        _injections(model.ws.indptr, model.ws.indices, model.ydata, vm, va, model.ws.V, model.ws.I)
        return iters
    o["collapsed_this_step"][0] += collapsed
    o["pf_status"][0] = PF_COLLAPSED
    model._topology()
    return iters + model._solve()


def solve_distributed(model, flat: bool = True) -> tuple[int, int]:
    """A static distributed-slack power flow of ``model``'s present breakers, units and dispatch.

    For studies and reference checks (pandapower's ``runpp(distributed_slack=True)`` with slack
    weights = the participation of ``distributed_slack.participation``): topology refreshed, every
    live island solved at once from a flat start (``flat``) or the model's voltages, the slack scalar
    folded into ``p_share_mw``. Returns (newton.py status, iterations); ``model.out`` is not published."""
    st, c = model.state, model.case
    model._topology(inherit=False)
    model._effective_scales(float(st["t_s"][0]))
    model._setpoints(0.0, False)
    from plants.grid.injections import island_aggregates
    from plants.grid.topology import flags_from_roles
    island_aggregates(st["island"], model.out["role"], c.pd_mw, model._load_eff, c.gen_bus, st["gen_on"],
                      model.p_set_eff_mw, model._gen_eff, model.h_s, c.mbase_mva, model.droop_pu, c.pmin_mw,
                      c.pmax_mw, c.base_mva, model._m, model._kgov, model._p_sched, model._p_load)
    model._injections()
    model._prepare_voltages(flat=flat)
    flags_from_roles(model.out["role"], model._free_va, model._free_vm)
    roots = model._slack_of_root >= 0
    status = _ds(model, model._free_va, model._free_vm, roots)
    iters = int(model.ws.stats[0])
    if status == CONVERGED:
        model._last_lambda_mw = model.dsw.lam[roots] * c.base_mva
        _fold(model, roots)
    return status, iters
