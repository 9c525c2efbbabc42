"""One quasi-static grid step over preallocated arrays: flow, cascade, frequency, temperature.

:class:`GridModel` owns the static network (a :class:`~plants.grid.case.Case`), the parameters
(:class:`GridParams`), the inputs (setpoints, commands: plain arrays the caller writes), the
state (:attr:`GridModel.state`, a dict of arrays: everything a snapshot needs) and the outputs
(:attr:`GridModel.out`). ``step(dt_s)`` runs, in this order:

1. cooldowns count down; breaker commands apply (a close waits for the line's cooldown);
2. islands and bus roles from the closed branches (``topology.py``), per-island governor/AGC
   state inherited by root; Ybus values refilled from branch status and taps (fixed pattern);
3. generator dispatch (schedule + governor/AGC share), Newton-Raphson from the last solution;
   on failure (``recovery.py``): a flat start, then a distributed slack (governor participation,
   ``distributed_slack.py``), then island by island with load continuation; an island that still
   fails is latched as blacked out ("collapse after continuation"), never NaN;
4. branch flows and loading; protection (soft/hard overflow, temperature); if lines tripped,
   back to 2 in the same step (cascade, at most ``max_cascade_rounds`` rounds);
5. island frequency (swing + governor + AGC), under/over-frequency blackout beyond
   ``freq_trip_hz``; conductor temperature.

Units: MW, MVAr, pu (voltage, on bus base kV), rad inside / degrees out, Hz, deg C, s.
The step allocates nothing; only ``GridModel(...)`` (ordering, symbolic LU) does.
"""

from __future__ import annotations

import math
import numpy as np

from plants.grid.case import REF, Case
from plants.grid.controls import agc_setpoints, combined_shed, ufls_relays
from plants.grid.dynamics import branch_flows, protection, thermal_step
from plants.grid.injections import (apply_q_limits, bus_generation_q, bus_injections, dispatch,
                                    electrical_generation, island_aggregates, q_limit_switch, share_residual,
                                    slack_generation, split_bus_q)
from plants.grid.distributed_slack import DistributedSlackWorkspace
from plants.grid.newton import CONVERGED, NewtonWorkspace, _injections
from plants.grid.params import GridParams
from plants.grid.recovery import (PF_COLLAPSED, PF_CONVERGED, PF_DISTRIBUTED, PF_RECOVERED,  # noqa: F401
                                   PF_STATUS_NAMES, recover)
from plants.grid.step_kernels import (apply_commands, dead_count, effective_scales, inherit_island_state,
                                      island_frequency, prepare_voltages, publish, shed_load_mw, sync_changed,
                                      zero_dead)
from plants.grid.topology import DEAD, SLACK, bus_roles, flags_from_roles, islands
from plants.grid.ybus import branch_admittances, build_pattern, bus_shunts_pu, fill_ybus

# Any dt is stable: the frequency model integrates with internal RK4 sub-steps of at most
# min(Tg, M / (D + K)) / 20, temperatures use the exact exponential, the flow is algebraic. So the
# plant contract's MAX_SUBSTEP for the grid is infinite; the quasi-static model itself (no
# electromechanical or electromagnetic transients) is meant for steps of ~10 ms and longer.
MAX_SUBSTEP_S = math.inf

STATE_KEYS = ("t_s", "vm", "va", "br_status", "overflow_steps", "cooldown", "temp_c", "bus_dead",
              "dw", "dpm", "pagc", "island", "gen_on", "p_share_mw", "agc_i_mw", "ufls_timer_s", "ufls_active")


class GridModel:
    """A network with state, inputs and outputs as arrays; see module docstring."""

    def __init__(self, case: Case, params: GridParams | None = None):
        self.case = case
        self.p = params or GridParams()
        n, ng, nl = case.n_bus, case.n_gen, case.n_branch
        self.pattern = build_pattern(n, case.f_bus, case.t_bus)
        self.ws = NewtonWorkspace.for_pattern(self.pattern.indptr, self.pattern.indices)
        self.dsw = DistributedSlackWorkspace(n, ng)
        self.ydata = np.zeros(self.pattern.nnz, dtype=np.complex128)
        self.y4 = np.zeros((nl, 4), dtype=np.complex128)
        self.ysh = bus_shunts_pu(case)
        refs = np.flatnonzero(case.bus_type == REF)
        self.ref_bus = int(refs[0]) if len(refs) else -1
        # Per-element parameters (structured; a randomizer writes these arrays).
        self.h_s = np.full(ng, 5.0)              # inertia constant on Mbase
        self.droop_pu = np.full(ng, 0.05)        # 5 % droop on Mbase; <= 0: no governor
        self.dtemp_rated_k = np.full(nl, 50.0)   # conductor rise at 100 % loading
        self.tau_thermal_s = np.full(nl, 600.0)
        # Inputs.
        self.gen_p_set_mw = case.pg_mw.copy()
        self.p_set_eff_mw = case.pg_mw.copy()    # what the dispatch uses: gen_p_set_mw moved by the AGC
        self.agc = None                          # controls.Agc / controls.Ufls: see configure_controls
        self.ufls = None
        self.gen_v_set_pu = case.vg_pu.copy()
        self.gen_scale = np.ones(ng)             # multiplier of each unit's P setpoint (x profile)
        self.load_scale = np.ones(n)             # multiplier of each bus load (x profile)
        self.load_shed = np.zeros(n)             # fraction of each bus load shed, 0..1
        self.profile = None                      # optional profiles.Profile, read at the end of each step
        self.tap = case.tap.copy()
        self.cmd_open = np.zeros(nl, dtype=np.int8)
        self.cmd_close = np.zeros(nl, dtype=np.int8)
        # State.
        self.state = {
            "t_s": np.zeros(1), "vm": np.ones(n), "va": np.zeros(n),
            "br_status": case.br_status.astype(np.int8).copy(), "overflow_steps": np.zeros(nl, dtype=np.int64),
            "cooldown": np.zeros(nl, dtype=np.int64), "temp_c": np.full(nl, self.p.t_amb_c),
            "bus_dead": np.zeros(n, dtype=np.int8), "dw": np.zeros(n), "dpm": np.zeros(n), "pagc": np.zeros(n),
            "island": np.arange(n, dtype=np.int64), "gen_on": case.gen_status.astype(np.int8).copy(),
            "p_share_mw": np.zeros(ng),
            # in-plant AGC integral per listed unit (MW), UFLS relay timers (s) and trips (controls.py)
            "agc_i_mw": np.zeros(0), "ufls_timer_s": np.zeros(0), "ufls_active": np.zeros(0, dtype=np.int8),
        }
        vm = self.state["vm"]
        on = case.gen_status > 0
        vm[:] = np.where(case.vm_pu > 0, case.vm_pu, 1.0)
        vm[case.gen_bus[on]] = case.vg_pu[on]
        self.state["va"][:] = np.radians(case.va_deg)
        # Work.
        self._parent = np.zeros(n, dtype=np.int64)
        self._old = np.zeros((3, n))
        self._old_island = np.zeros(n, dtype=np.int64)
        self._best = np.zeros(n)
        self._slack_of_root = np.full(n, -1, dtype=np.int64)
        self._free_va = np.zeros(n, dtype=np.bool_)
        self._free_vm = np.zeros(n, dtype=np.bool_)
        self._one_va = np.zeros(n, dtype=np.bool_)
        self._one_vm = np.zeros(n, dtype=np.bool_)
        self._vm0 = np.zeros(n)
        self._va0 = np.zeros(n)
        self._m = np.zeros(n)
        self._kgov = np.zeros(n)
        self._p_sched = np.zeros(n)
        self._p_load = np.zeros(n)
        self._p_elec = np.zeros(n)
        self._x3 = np.zeros(3)
        self._weight_sum = np.zeros(n)
        self._served = np.zeros(2)
        self._load_eff = np.ones(n)
        self._ones_n = np.ones(n)
        self._ones_g = np.ones(ng)
        self._gen_eff = np.ones(ng)
        self._prof_load = np.ones(n)
        self._prof_gen = np.ones(ng)
        self._shed_eff = np.zeros(n)
        self._ufls_bus = np.zeros(n)
        self._topology_version = 0
        self._last_br = np.full(nl, -1, dtype=np.int8)
        self._last_slack = np.full(n, -2, dtype=np.int64)
        self._sens_version = -1
        self._sens = None
        self._ptdf_ws = None
        self._bus_q = np.zeros(n)
        self._q_limited = np.zeros(n, dtype=np.int8)
        self._q_fixed_mvar = np.zeros(n)
        self._tripped = np.zeros(nl, dtype=np.int8)
        self.sbus = np.zeros(n, dtype=np.complex128)
        # Outputs.
        self.out = {
            "vm_pu": np.zeros(n), "va_deg": np.zeros(n), "freq_hz": np.zeros(n), "island": np.zeros(n, dtype=np.int64),
            "role": np.zeros(n, dtype=np.int8), "p_gen_mw": np.zeros(ng), "q_gen_mvar": np.zeros(ng),
            "q_limited": np.zeros(n, dtype=np.int8),
            "pf_mw": np.zeros(nl), "qf_mvar": np.zeros(nl), "pt_mw": np.zeros(nl), "qt_mvar": np.zeros(nl),
            "i_pu": np.zeros(nl), "loading": np.zeros(nl), "temp_c": np.zeros(nl), "br_status": np.zeros(nl, dtype=np.int8),
            "n_islands": np.zeros(1, dtype=np.int64), "blackout": np.zeros(1, dtype=np.int8),
            "served_load_mw": np.zeros(1), "unserved_load_mw": np.zeros(1), "tripped_this_step": np.zeros(1, dtype=np.int64),
            "cascade_rounds": np.zeros(1, dtype=np.int64), "pf_iterations": np.zeros(1, dtype=np.int64),
            "collapsed_this_step": np.zeros(1, dtype=np.int64),
            # islands solved with a distributed slack this step (recovery.py), of which with continuation
            "distributed_this_step": np.zeros(1, dtype=np.int64), "continuation_this_step": np.zeros(1, dtype=np.int64),
            # the solver's own state (PF_* of recovery.py): worst outcome this step, last solve's max |F|
            "pf_status": np.zeros(1, dtype=np.int64), "pf_mismatch_pu": np.zeros(1),
            "agc_mw": np.zeros(1), "ufls_tripped": np.zeros(1, dtype=np.int64),
            "shed_load_mw": np.zeros(1), "served_fraction": np.ones(1), "dead_buses": np.zeros(1, dtype=np.int64),
        }
        self._topology()
        self._old_island[:] = self.state["island"]
        self.balance()

    def configure_controls(self, agc=None, ufls=None) -> None:
        """Attach the in-plant AGC / UFLS (``controls.Agc`` / ``controls.Ufls`` or None); their states
        start at rest (integrals 0, relays reset) and become part of get/set state."""
        self.agc, self.ufls = agc, ufls
        st = self.state
        st["agc_i_mw"] = np.zeros(len(agc.units) if agc is not None else 0)
        st["ufls_timer_s"] = np.zeros(len(ufls.bus) if ufls is not None else 0)
        st["ufls_active"] = np.zeros(len(ufls.bus) if ufls is not None else 0, dtype=np.int8)

    def _setpoints(self, dt_s: float, advance: bool) -> None:
        """p_set_eff_mw from the inputs and the AGC (integrating over dt_s when ``advance``)."""
        a, st, o = self.agc, self.state, self.out
        if a is None:
            self.p_set_eff_mw[:] = self.gen_p_set_mw
            o["agc_mw"][0] = 0.0
            return
        agc_setpoints(a.units, a.kp, a.ki, a.setpoint_hz, a.out_min_mw, a.out_max_mw, self.case.gen_bus,
                      st["gen_on"], o["role"], st["island"], st["dw"], self.p.f0_hz, self.gen_p_set_mw,
                      st["agc_i_mw"], float(dt_s), advance, self.p_set_eff_mw)
        d = self.p_set_eff_mw[a.units] - self.gen_p_set_mw[a.units]
        o["agc_mw"][0] = float(d[np.isfinite(d)].sum())

    def balance(self) -> None:
        """Solve the flow and set each slack generator's schedule to its output (equilibrium at f0).

        Called at construction so a case whose slack Pg does not cover its losses starts at rest
        (frequency f0, governors at zero), not with a spurious imbalance."""
        st, c, o = self.state, self.case, self.out
        self._effective_scales(float(st["t_s"][0]))
        self._setpoints(0.0, False)
        rounds, self.p.max_share_rounds = self.p.max_share_rounds, 0
        st["p_share_mw"][:] = 0.0
        try:
            self._solve()
        finally:
            self.p.max_share_rounds = rounds
        self._flows()
        _injections(self.ws.indptr, self.ws.indices, self.ydata, st["vm"], st["va"], self.ws.V, self.ws.I)
        slack_generation(o["role"], c.gen_bus, st["gen_on"], self.ws.V, self.ws.I, c.pd_mw, self._load_eff,
                         c.base_mva, o["p_gen_mw"])
        at_slack = (o["role"][c.gen_bus] == SLACK) & (st["gen_on"] > 0)
        self.gen_p_set_mw[at_slack] = o["p_gen_mw"][at_slack]
        self.p_set_eff_mw[at_slack] = o["p_gen_mw"][at_slack]
        self._publish()

    # ---- state -------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, np.ndarray]:
        """A copy of every state array (a snapshot)."""
        return {k: v.copy() for k, v in self.state.items()}

    def set_state(self, snap: dict[str, np.ndarray]) -> None:
        """Restore a snapshot from :meth:`get_state` (arrays copied in place; shapes must match)."""
        for k in STATE_KEYS:
            self.state[k][...] = snap[k]
        self._topology(inherit=False)

    def black_start(self) -> None:
        """Clear every blackout latch and re-solve from a flat start (an operator's restoration)."""
        self.state["bus_dead"][:] = 0
        self._topology(inherit=True)
        self._prepare_voltages(flat=True)

    def sensitivities(self):
        """(PTDF n_branch x n_bus, LODF n_branch x n_branch, islanding bool n_branch) of the current topology.

        Each island's slack is the power flow's. Cached: recomputed (dense, a few ms for 300 buses) only
        after the topology changed (a trip, a breaker command, a blackout), so calling it every step is cheap.
        The arrays returned are shared with the cache: do not modify them."""
        from plants.grid.sensitivity import lodf, ptdf
        if self._sens_version != self._topology_version:
            live = self.out["role"] != DEAD
            slack_of_bus = self._slack_of_root[self.state["island"]]
            if self._ptdf_ws is None:
                from plants.grid.sensitivity import PtdfWorkspace
                self._ptdf_ws = PtdfWorkspace.for_case(self.case)
            H = ptdf(self.case, self.state["br_status"], slack_of_bus, live, self._ptdf_ws)
            L, islanding = lodf(self.case, self.state["br_status"], H)
            self._sens = (H, L, islanding)
            self._sens_version = self._topology_version
        return self._sens

    # ---- step parts --------------------------------------------------------------------------------
    def _topology(self, inherit: bool = True) -> None:
        """Islands, roles and Ybus values from the breaker state; ``inherit``: carry island states."""
        st, c = self.state, self.case
        island = st["island"]
        if inherit:
            self._old_island[:] = island
            self._old[0], self._old[1], self._old[2] = st["dw"], st["dpm"], st["pagc"]
        islands(c.f_bus, c.t_bus, st["br_status"], self._parent, island)
        if inherit:
            inherit_island_state(island, self._old_island, self._old[0], self._old[1], self._old[2],
                                 st["dw"], st["dpm"], st["pagc"])
        self.out["n_islands"][0] = bus_roles(island, c.bus_type, st["bus_dead"], c.gen_bus, st["gen_on"], c.pmax_mw,
                                             self.ref_bus, self.out["role"], self._slack_of_root, self._best)
        if sync_changed(st["br_status"], self._last_br) | sync_changed(self._slack_of_root, self._last_slack):
            self._topology_version += 1
        branch_admittances(c.r_pu, c.x_pu, c.b_pu, c.g_pu, self.tap, c.shift_deg, st["br_status"], self.y4)
        fill_ybus(self.ydata, self.pattern.pos, self.pattern.diag, self.y4, self.ysh)

    def _effective_scales(self, t_s: float) -> None:
        """Load and unit multipliers for the instant t_s: inputs x profile x (1 - shed); shed = max(load.shed,
        tripped UFLS stages)."""
        if self.ufls is not None:
            u = self.ufls
            self.out["ufls_tripped"][0] = combined_shed(self.load_shed, u.bus, u.shed, self.state["ufls_active"],
                                                        self._ufls_bus, self._shed_eff)
        else:
            self._shed_eff[:] = self.load_shed
        if self.profile is not None:
            self.profile.at(t_s, self._prof_load, self._prof_gen)
            effective_scales(self.load_scale, self._prof_load, self._shed_eff, self.gen_scale, self._prof_gen,
                             self._load_eff, self._gen_eff)
        else:
            effective_scales(self.load_scale, self._ones_n, self._shed_eff, self.gen_scale, self._ones_g,
                             self._load_eff, self._gen_eff)

    def _prepare_voltages(self, flat: bool = False) -> None:
        st = self.state
        prepare_voltages(self.out["role"], st["island"], self._slack_of_root, self.case.gen_bus, st["gen_on"],
                         self.gen_v_set_pu, st["vm"], st["va"], flat)

    def _solve(self) -> int:
        """Power flow of every live island; collapsing islands are latched dead. Returns iterations."""
        st, c, p, role = self.state, self.case, self.p, self.out["role"]
        island_aggregates(st["island"], role, c.pd_mw, self._load_eff, c.gen_bus, st["gen_on"], self.p_set_eff_mw,
                          self._gen_eff, self.h_s, c.mbase_mva, self.droop_pu, c.pmin_mw, c.pmax_mw,
                          c.base_mva, self._m, self._kgov, self._p_sched, self._p_load)
        self._injections()
        self._prepare_voltages()
        flags_from_roles(role, self._free_va, self._free_vm)
        vm, va = st["vm"], st["va"]
        self._vm0[:] = vm
        self._va0[:] = va
        status = self.ws.solve(self.ydata, self.sbus, vm, va, self._free_va, self._free_vm, p.tol_pu, p.max_iter)
        iters = int(self.ws.stats[0])
        status, iters = self._share(status, iters)
        q_rounds = 0
        while p.enforce_q_limits and status == CONVERGED and q_rounds < p.max_q_rounds:
            bus_generation_q(role, self.ws.V, self.ws.I, c.qd_mvar, self._load_eff, c.base_mva, self._bus_q)
            if q_limit_switch(role, c.gen_bus, st["gen_on"], c.qmax_mvar, c.qmin_mvar, self._bus_q,
                              self._q_limited, self._q_fixed_mvar) == 0:
                break
            self._injections()
            flags_from_roles(role, self._free_va, self._free_vm)
            status = self.ws.solve(self.ydata, self.sbus, vm, va, self._free_va, self._free_vm, p.tol_pu, p.max_iter)
            status, iters = self._share(status, iters + int(self.ws.stats[0]))
            q_rounds += 1
        self.out["pf_mismatch_pu"][0] = self.ws.stats[1]
        if status == CONVERGED:
            return iters
        self.out["pf_status"][0] = max(self.out["pf_status"][0], PF_RECOVERED)
        return iters + self._recover()

    def _share(self, status: int, iters: int) -> tuple[int, int]:
        """Inertial sharing rounds (see injections.py) after a converged solve."""
        st, c, p, role = self.state, self.case, self.p, self.out["role"]
        rounds = 0
        while status == CONVERGED and rounds < p.max_share_rounds:
            worst = share_residual(st["island"], role, self._slack_of_root, c.gen_bus, st["gen_on"], self.h_s,
                                   c.mbase_mva, self.ws.V, self.ws.I, c.pd_mw, self._load_eff, c.base_mva,
                                   self.out["p_gen_mw"], self._weight_sum, st["p_share_mw"])
            if worst < p.share_tol_mw:
                break
            self._injections()
            status = self.ws.solve(self.ydata, self.sbus, st["vm"], st["va"], self._free_va, self._free_vm,
                                   p.tol_pu, p.max_iter)
            iters += int(self.ws.stats[0])
            rounds += 1
        return status, iters

    def _recover(self) -> int:
        """Newton failed: flat start, distributed slack, per island with continuation (``recovery.py``)."""
        return recover(self)

    def _injections(self) -> None:
        st, c, role = self.state, self.case, self.out["role"]
        dispatch(st["island"], role, c.gen_bus, st["gen_on"], self.p_set_eff_mw, self._gen_eff, c.mbase_mva,
                 self.droop_pu, c.pmin_mw, c.pmax_mw, self._kgov, st["dpm"], st["pagc"], c.base_mva,
                 st["p_share_mw"], self.out["p_gen_mw"])
        bus_injections(role, c.pd_mw, c.qd_mvar, self._load_eff, c.gen_bus, st["gen_on"], self.out["p_gen_mw"],
                       c.base_mva, self.sbus)
        apply_q_limits(self._q_limited, self._q_fixed_mvar, c.base_mva, role, self.sbus)

    def _flows(self) -> None:
        st, c, o = self.state, self.case, self.out
        zero_dead(o["role"], st["vm"], st["va"])
        branch_flows(c.f_bus, c.t_bus, self.y4, st["vm"], st["va"], c.base_mva, c.rate_a_mva,
                     o["pf_mw"], o["qf_mvar"], o["pt_mw"], o["qt_mvar"], o["i_pu"], o["loading"])

    def step(self, dt_s: float) -> None:
        """Advance the grid by ``dt_s`` seconds (see module docstring for the order)."""
        st, p, o = self.state, self.p, self.out
        br, cd = st["br_status"], st["cooldown"]
        changed = apply_commands(self.cmd_open, self.cmd_close, br, cd)
        self._effective_scales(st["t_s"][0] + dt_s)
        o["collapsed_this_step"][0] = 0
        o["distributed_this_step"][0] = 0
        o["continuation_this_step"][0] = 0
        o["pf_status"][0] = PF_CONVERGED
        self._q_limited[:] = 0
        self._topology(inherit=changed)
        self._setpoints(dt_s, True)
        iters = 0
        tripped = 0
        rounds = 0
        while True:
            iters += self._solve()
            self._flows()
            n_trip = protection(o["loading"], st["temp_c"], br, st["overflow_steps"], cd, rounds == 0, p.soft_limit,
                                p.hard_limit, p.overflow_allowed_steps, p.temp_trip_c, p.cooldown_steps,
                                self._tripped)
            rounds += 1
            if n_trip == 0 or rounds >= p.max_cascade_rounds:
                break
            tripped += n_trip
            self._topology()
        o["pf_iterations"][0] = iters
        o["tripped_this_step"][0] = tripped
        o["cascade_rounds"][0] = rounds
        self._frequency(dt_s)
        if self.ufls is not None:
            u = self.ufls
            ufls_relays(u.bus, u.below_hz, u.reset_hz, u.pickup_s, u.latch, o["role"], st["island"], st["dw"],
                        p.f0_hz, st["ufls_timer_s"], st["ufls_active"], dt_s)
        thermal_step(o["loading"], st["temp_c"], p.t_amb_c, self.dtemp_rated_k, self.tau_thermal_s, dt_s)
        st["t_s"][0] += dt_s
        self._publish()

    def _frequency(self, dt_s: float) -> None:
        st, c, p, o = self.state, self.case, self.p, self.out
        role, island = o["role"], st["island"]
        # V and I of the final voltages (dead buses zeroed), then slack output and island generation.
        _injections(self.ws.indptr, self.ws.indices, self.ydata, st["vm"], st["va"], self.ws.V, self.ws.I)
        slack_generation(role, c.gen_bus, st["gen_on"], self.ws.V, self.ws.I, c.pd_mw, self._load_eff, c.base_mva,
                         o["p_gen_mw"])
        electrical_generation(island, role, self.ws.V, self.ws.I, c.pd_mw, self._load_eff, c.base_mva, self._p_elec)
        bus_generation_q(role, self.ws.V, self.ws.I, c.qd_mvar, self._load_eff, c.base_mva, self._bus_q)
        split_bus_q(role, c.gen_bus, st["gen_on"], c.qmax_mvar, c.qmin_mvar, self._bus_q, o["q_gen_mvar"])
        blacked = island_frequency(island, self._slack_of_root, self._m, self._kgov, self._p_load, self._p_elec,
                                   self._p_sched, st["dw"], st["dpm"], st["pagc"], p.load_damping,
                                   p.min_inertia_pu_s, p.governor_tg_s, p.agc_ki, p.f0_hz, p.freq_trip_hz, dt_s,
                                   st["bus_dead"], self._x3)
        if blacked:
            self._topology(inherit=False)
            self._flows()

    def _publish(self) -> None:
        st, c, o = self.state, self.case, self.out
        publish(o["role"], st["island"], st["vm"], st["va"], st["dw"], self.p.f0_hz, c.pd_mw, self._load_eff,
                st["gen_on"], o["vm_pu"], o["va_deg"], o["island"], o["freq_hz"], o["p_gen_mw"], self._served)
        o["served_load_mw"][0] = self._served[0]
        o["unserved_load_mw"][0] = self._served[1]
        shed = shed_load_mw(c.pd_mw, self.load_scale, self._prof_load if self.profile is not None else self._ones_n,
                            self._shed_eff)
        o["shed_load_mw"][0] = shed
        demand = self._served[0] + self._served[1] + shed
        o["served_fraction"][0] = self._served[0] / demand if demand > 0 else 1.0
        o["dead_buses"][0] = dead_count(o["role"])
        o["temp_c"][:] = st["temp_c"]
        o["br_status"][:] = st["br_status"]
        # a blackout: no island energized, or less than blackout_served_fraction of the demand
        # (before any shedding) served (one live bus does not make a grid that is up)
        o["blackout"][0] = 1 if (o["n_islands"][0] == 0 or o["served_fraction"][0] < self.p.blackout_served_fraction) \
            else 0
        o["q_limited"][:] = self._q_limited
