"""The in-loop shield: the safety envelope enforced in the loop process, compiled (issue 22).

Simplex / runtime assurance: the complex controller (the policy) proposes, a verified simple
controller (the fallback) stands by, and the switch sits next to the actuator. Per step k
(simulated seconds; one Numba call, nothing allocated):

    reads Bad?      a signal a limit needs (its b(state) or a plant family's rows) is not finite,
                    or a plant family wrote a non-finite row            -> FALLBACK_UNKNOWN
    choose          the proposal, if the supervisor lets the policy act (allow_policy), it is
                    finite, and it was made for a step in [k - max_age_steps, k]
                    (else FALLBACK_MODE / FALLBACK_BAD / FALLBACK_LATE: the fallback law)
    project         the closest action inside the envelope, the safety process's own kernel
                    (hil/safety/projection.py `project_kernel`): box (physical bounds and
                    [safety.projection].box), rate around the previous APPLIED value over one
                    step, then the linear rows W a <= b(state): the configured ones and the
                    plant's state-dependent families (W and b rebuilt every step by the
                    plant's compiled fill, e.g. plants/panda.py `fill_envelope_rows`, the
                    grid's plants/grid/line_limits.py `fill_line_rows`; a fill whose
                    precomputed terms no longer fit the state (the grid's PTDF after a
                    trip) writes NaN rows: unknown limits, and its `refresh` runs in Python
                    after the step);
                    unknown limits project the fallback on box and rate only (fail closed)
    source          POLICY (unchanged), PROJECTED (moved by the envelope), or the FALLBACK_*
                    reason, for the recording

The fallback law per action input (`fb_kind`): 0 hold the applied value, 1 a fixed value,
2 joint PD hold tau = kp (q_ref - q) - kd dq, with q_ref latched from the measured position
when the fallback takes over (the arm is held where it is; a Bad q or dq gives zero torque, as
hil/safety/fallback.py JointPdLaw), 3 a PID loop ([[safety.fallback.loops]]: the process
plants' baseline), the arithmetic of hil/control/pid.py PID driven as FallbackController
drives it, every step whoever acts:

    follow    the applied value is not the one decided last (an actuator gap, another
              writer; the first step): the integral is set so the output at the last good
              error is the applied value
    update    Bad measurement: hold (no integration, derivative restarts), or the loop's safe
              output (on_bad = "safe"); else one PID execution (dt 0 on the first step:
              evaluate): P on the error, I clamped (anti-windup), D on the measurement,
              filtered; output clipped to [out_min, out_max]
    track     after the projection: the integral is set so the output at the current error is
              what was decided (bumpless transfer both ways)

(FallbackController matches the applied value against its 16 most recent decisions, decisions
in flight over the bus; in the loop the decision is applied in the same step, so the shield
keeps one.) Tested equal, ==, to FallbackController step for step in
tests/hil/loop/test_shield_pid.py. The supervisor's band (limited mode) bounds the policy's
proposal only; the fallback is projected on the envelope without it, as the safety process
projects its baseline.

    shield = Shield(scenario, spec, action_names, plant)    # from [safety.projection] / [safety.fallback]
    code = shield.step(k, proposal, proposal_step, y_meas, u_applied, dt_s, out)
    bound = shield.bind(proposal, y, u, prev, dt_s, out, u_cmd, apply_index, apply_pos)
    code = bound.step(k, proposal_step, allow_policy)         # the loop's form (arrays held once)

The plant's compiled families: its module's SAFETY_LIMITS_COMPILED(families) -> (fill, args)
or (fill, args, refresh); SAFETY_LIMITS_COMPILED_FORM "y" (default: fill(y, W, b, *args)) or
"y_u" (fill(y, u, W, b, *args): the rows read the applied inputs, as the grid's).

`Shield.step` is one call into `shield_kernel`; the same kernel is what the loop's fused step
calls. Equivalence with the safety process's Projector (Python families + the same kernel) is
tested in tests/hil/loop/test_shield.py; its cost against the per-call projection of the
safety process is `benchmarks/shield.py`.
"""

from __future__ import annotations

import warnings

import numpy as np
from numba import njit, types
from numba.core.errors import NumbaExperimentalFeatureWarning

from hil.control.pid import pid_from_config
from hil.safety.config import signal_index
from hil.safety.projection import Projector, plant_module, project_kernel

# the plant's compiled fill is passed as a first-class function (as the loop step's plant kernels)
warnings.filterwarnings("ignore", message=".*First-class function type feature is experimental",
                        category=NumbaExperimentalFeatureWarning)

POLICY, PROJECTED, FALLBACK_LATE, FALLBACK_MODE, FALLBACK_BAD, FALLBACK_UNKNOWN = 0, 1, 2, 3, 4, 5
SOURCE_NAMES = ("policy", "projected", "fallback:late", "fallback:mode", "fallback:bad_proposal",
                "fallback:unknown_limits")
FB_HOLD, FB_FIXED, FB_JOINT_PD, FB_PID = 0, 1, 2, 3
# columns of Shield.fb_pid (a PID fallback's configuration, one row per action input)
(PID_KP, PID_KI, PID_KD, PID_BIAS, PID_REVERSE, PID_TD_FILTER_S, PID_OUT_MIN, PID_OUT_MAX, PID_SETPOINT,
 PID_MEAS_IS_U, PID_MEAS_INDEX, PID_SAFE) = range(12)
PID_PARAMS = 12
# columns of Shield.pid_state (its state: hil/control/pid.py PID + hil/safety/fallback.py FallbackController)
(PS_INTEGRAL, PS_LAST_MEAS, PS_D_FILTERED, PS_LAST_E, PS_BAD, PS_ACTION, PS_DECIDED, PS_STARTED) = range(8)
PID_STATE = 8


@njit(nogil=True)
def _no_fill(y, u, W, b):
    """The fill of a shield without plant families (no rows)."""
    return


@njit(nogil=True)
def _pid_error(p, m):
    """PID.error: setpoint - measurement, sign flipped when reverse acting."""
    e = p[PID_SETPOINT] - m
    if p[PID_REVERSE] != 0.0:
        e = -e
    return e


@njit(nogil=True)
def _pid_clip(p, v):
    return min(max(v, p[PID_OUT_MIN]), p[PID_OUT_MAX])


@njit(nogil=True)
def _pid_track(p, s, output, e):
    """PID.track: the integral such that the output at error e equals `output`, within limits."""
    pterm = p[PID_KP] * e if np.isfinite(e) else 0.0
    s[PS_INTEGRAL] = min(max(output - p[PID_BIAS] - pterm, p[PID_OUT_MIN] - p[PID_BIAS]),
                         p[PID_OUT_MAX] - p[PID_BIAS])


@njit(nogil=True)
def _pid_measurement(p, y, u):
    j = int(p[PID_MEAS_INDEX])
    return u[j] if p[PID_MEAS_IS_U] != 0.0 else y[j]


@njit(nogil=True)
def pid_before(p, s, applied, y, u, dt_s):
    """A PID fallback's part before the choice (FallbackController.follow then .update, one
    loop): follow the applied value when it is not the one decided last (an actuator gap,
    another writer; also the first step: nothing decided yet), then execute on the measurement
    (dt 0 on the first step: evaluate only). Leaves the baseline's output in s[PS_ACTION]."""
    dec = s[PS_DECIDED]
    if not (abs(dec - applied) <= 1e-9 * (1.0 + abs(applied))):  # NaN (first step): unmatched
        e = s[PS_LAST_E]
        if not np.isfinite(e):
            e = _pid_error(p, _pid_measurement(p, y, u))
        _pid_track(p, s, applied, e)
        s[PS_ACTION] = applied
    dt = dt_s if s[PS_STARTED] != 0.0 else 0.0
    s[PS_STARTED] = 1.0
    m = _pid_measurement(p, y, u)
    if not np.isfinite(m):
        if s[PS_BAD] == 0.0:  # PID.hold: nothing integrates, the derivative restarts
            s[PS_LAST_MEAS] = np.nan
            s[PS_D_FILTERED] = 0.0
            s[PS_BAD] = 1.0
        if np.isfinite(p[PID_SAFE]):
            s[PS_ACTION] = p[PID_SAFE]
        return
    s[PS_BAD] = 0.0
    e = _pid_error(p, m)
    bias = p[PID_BIAS]
    if dt > 0.0:  # PID.update
        pterm = p[PID_KP] * e
        d = 0.0
        if p[PID_KD] != 0.0 and np.isfinite(s[PS_LAST_MEAS]):
            raw = -(m - s[PS_LAST_MEAS]) / dt
            if p[PID_REVERSE] != 0.0:
                raw = -raw
            if p[PID_TD_FILTER_S] > 0.0:
                a = dt / (p[PID_TD_FILTER_S] + dt)
                s[PS_D_FILTERED] += a * (raw - s[PS_D_FILTERED])
            else:
                s[PS_D_FILTERED] = raw
            d = p[PID_KD] * s[PS_D_FILTERED]
        s[PS_LAST_MEAS] = m
        integral = s[PS_INTEGRAL]
        candidate = integral + p[PID_KI] * e * dt
        rest = bias + pterm + d
        if e > 0 and rest + candidate > p[PID_OUT_MAX]:
            candidate = max(integral, p[PID_OUT_MAX] - rest)
        elif e < 0 and rest + candidate < p[PID_OUT_MIN]:
            candidate = min(integral, p[PID_OUT_MIN] - rest)
        s[PS_INTEGRAL] = min(max(candidate, p[PID_OUT_MIN] - bias), p[PID_OUT_MAX] - bias)
        s[PS_ACTION] = _pid_clip(p, bias + pterm + s[PS_INTEGRAL] + d)
    else:  # PID.evaluate
        s[PS_LAST_MEAS] = m
        s[PS_ACTION] = _pid_clip(p, bias + p[PID_KP] * e + s[PS_INTEGRAL])
    s[PS_LAST_E] = e


@njit(nogil=True)
def pid_after(p, s, decided, y, u):
    """FallbackController.track for one loop: bumpless transfer to what was decided (the
    baseline's output at the current error, the last good one if Bad, becomes `decided`)."""
    if abs(decided - s[PS_ACTION]) > 1e-12 * (1.0 + abs(decided)):
        m = _pid_measurement(p, y, u)
        _pid_track(p, s, decided, _pid_error(p, m) if np.isfinite(m) else s[PS_LAST_E])
        s[PS_ACTION] = decided
    s[PS_DECIDED] = decided


_Y_ONLY: dict = {}


def _y_only(fill):
    """The kernel form fill(y, u, W, b, *args) of a plant fill that reads the outputs only
    (fill(y, W, b, *args): SAFETY_LIMITS_COMPILED_FORM "y", the default)."""
    adapter = _Y_ONLY.get(fill)
    if adapter is None:
        @njit(nogil=True)
        def adapter(y, u, W, b, *args):
            fill(y, W, b, *args)

        _Y_ONLY[fill] = adapter
    return adapter


@njit(nogil=True)
def shield_kernel(fill, fill_args, k, prop, prop_step, max_age_steps, allow_policy, y, u, prev, dt_s,
                  lo, hi, rate, W, Wz, b0, By, Bu, scale, m_static, reads_y, reads_u,
                  fb_kind, fb_value, fb_iq, fb_idq, fb_kp, fb_kd, act_u, q_ref, state,
                  a, out, lo_eff, hi_eff, src, bvec, work, max_iter, band_lo, band_hi, fb_pid, pid_state, open_band):
    """One step of the shield; writes `out` (the action to actuate, plant units) and returns
    its source code (POLICY ... FALLBACK_UNKNOWN). state[0]: 1 while the fallback acts (its
    q_ref latched), else 0. See the module docstring for the rest."""
    n = a.size
    m = W.shape[0]
    unknown = False
    for j in range(reads_y.size):
        if not np.isfinite(y[reads_y[j]]):
            unknown = True
    for j in range(reads_u.size):
        if not np.isfinite(u[reads_u[j]]):
            unknown = True
    if not unknown and m > m_static:
        fill(y, u, W[m_static:], b0[m_static:], *fill_args)
        for r in range(m_static, m):
            if not np.isfinite(b0[r]):
                unknown = True
            for c in range(n):
                w = W[r, c]
                if not np.isfinite(w):
                    unknown = True
                Wz[r, c] = w * scale[c]
    for i in range(n):  # the PID fallbacks run every step, whoever acts (warm, bumpless)
        if fb_kind[i] == FB_PID:
            pid_before(fb_pid[i], pid_state[i], u[act_u[i]], y, u, dt_s)
    code = POLICY
    if unknown:
        code = FALLBACK_UNKNOWN
    elif not allow_policy:
        code = FALLBACK_MODE
    elif prop_step > k or prop_step < k - max_age_steps:
        code = FALLBACK_LATE
    else:
        for i in range(n):
            if not np.isfinite(prop[i]):
                code = FALLBACK_BAD
    if code == POLICY:
        for i in range(n):
            a[i] = prop[i]
        state[0] = 0
    else:
        if state[0] == 0:  # the fallback takes over: hold the arm where it is now
            for i in range(n):
                if fb_kind[i] == FB_JOINT_PD:
                    q_ref[i] = y[fb_iq[i]]
            state[0] = 1
        for i in range(n):
            kind = fb_kind[i]
            if kind == FB_FIXED:
                a[i] = fb_value[i]
            elif kind == FB_PID:
                a[i] = pid_state[i, PS_ACTION]
            elif kind == FB_JOINT_PD:
                q = y[fb_iq[i]]
                dq = y[fb_idq[i]]
                if np.isfinite(q) and np.isfinite(dq) and np.isfinite(q_ref[i]):
                    a[i] = fb_kp[i] * (q_ref[i] - q) - fb_kd[i] * dq
                else:
                    a[i] = 0.0
            else:
                a[i] = u[act_u[i]]
    # the supervisor's band (limited mode) bounds the policy only: the fallback is projected on
    # the envelope without it, as the safety process projects its baseline
    blo = band_lo if code == POLICY else open_band[0]
    bhi = band_hi if code == POLICY else open_band[1]
    if unknown:
        status = project_kernel(a, prev, dt_s, y, u, lo, hi, rate, blo, bhi, Wz[:0], b0[:0], By[:0],
                                Bu[:0], scale, out, lo_eff, hi_eff, src, bvec[:0], work, max_iter)
    else:
        status = project_kernel(a, prev, dt_s, y, u, lo, hi, rate, blo, bhi, Wz, b0, By, Bu, scale,
                                out, lo_eff, hi_eff, src, bvec, work, max_iter)
    for i in range(n):
        if fb_kind[i] == FB_PID:
            pid_after(fb_pid[i], pid_state[i], out[i], y, u)
    if code == POLICY and status != 0:
        code = PROJECTED
    return code


@njit(nogil=True)
def shield_into(fill, fill_args, k, prop, prop_step, max_age_steps, allow_policy, y, u, prev, dt_s,
                lo, hi, rate, W, Wz, b0, By, Bu, scale, m_static, reads_y, reads_u,
                fb_kind, fb_value, fb_iq, fb_idq, fb_kp, fb_kd, act_u, q_ref, state,
                a, out, lo_eff, hi_eff, src, bvec, work, max_iter, band_lo, band_hi, fb_pid, pid_state, open_band,
                u_cmd, apply_index, apply_pos):
    """The loop's shield stage: prev = the applied actions u[act_u], shield_kernel, then the
    bus-driven actions into the loop's commands (u_cmd[apply_index] = out[apply_pos])."""
    for i in range(act_u.size):
        prev[i] = u[act_u[i]]
    code = shield_kernel(fill, fill_args, k, prop, prop_step, max_age_steps, allow_policy, y, u, prev, dt_s,
                         lo, hi, rate, W, Wz, b0, By, Bu, scale, m_static, reads_y, reads_u,
                         fb_kind, fb_value, fb_iq, fb_idq, fb_kp, fb_kd, act_u, q_ref, state,
                         a, out, lo_eff, hi_eff, src, bvec, work, max_iter, band_lo, band_hi, fb_pid, pid_state,
                         open_band)
    for j in range(apply_index.size):
        u_cmd[apply_index[j]] = out[apply_pos[j]]
    return code


class Shield:
    """The shield configured from a scenario's [safety.projection] and [safety.fallback] for
    the action inputs `action_names` (plant units); the arrays the kernel needs, built once."""

    def __init__(self, scenario, spec, action_names: list[str], plant=None, max_age_steps: int = 0):
        sec = scenario.safety
        self.names = list(action_names)
        n = len(self.names)
        proj = Projector(sec.projection, spec, self.names, plant=plant)
        self.projector = proj  # the safety process's form (its families' numpy fill): the reference
        self.lo, self.hi, self.rate, self.scale = proj.lo, proj.hi, proj.rate, proj.scale
        m = proj.W.shape[0]
        self.m_static = len(sec.projection.linear)
        self.W = proj.W.copy()
        self.Wz = proj.Wz.copy()
        self.b0 = proj.b0.copy()
        self.By, self.Bu = proj.By[:self.m_static], proj.Bu[:self.m_static]  # the families' b reads no signal
        fam_reads = np.flatnonzero(proj._fam_reads.any(axis=0))
        self.reads_y = np.unique(np.concatenate([np.flatnonzero((proj.By != 0).any(axis=0)), fam_reads])).astype(np.int64)
        self.reads_u = np.flatnonzero((proj.Bu != 0).any(axis=0)).astype(np.int64)
        self.fill, self.fill_args = _no_fill, ()
        self.kernel_fill = _no_fill  # what the kernels call: fill(y, u, W, b, *fill_args)
        self.refresh = None  # the family's Python refresh after a step its fill flagged stale, or None
        if proj.families:
            module = plant_module(plant)
            compiled = getattr(module, "SAFETY_LIMITS_COMPILED", None)
            if compiled is None:
                raise ValueError(f"safety.projection.plant: {plant.name} has no compiled limit families "
                                 "(SAFETY_LIMITS_COMPILED): the in-loop shield cannot enforce them")
            try:
                made = compiled([fam for _, fam, _ in proj.families])
            except ValueError as exc:
                raise ValueError(f"safety.projection.plant: {exc}") from None
            self.fill, self.fill_args = made[0], made[1]
            self.refresh = made[2] if len(made) > 2 else None
            form = getattr(module, "SAFETY_LIMITS_COMPILED_FORM", "y")
            self.kernel_fill = self.fill if form == "y_u" else _y_only(self.fill)
        self.max_iter = proj.max_iter
        self.max_age_steps = int(max_age_steps)
        self.act_u = np.array([spec.index("inputs", a) for a in self.names], dtype=np.int64)
        self.fb_kind = np.zeros(n, dtype=np.int64)
        self.fb_value = np.zeros(n)
        self.fb_iq = np.zeros(n, dtype=np.int64)
        self.fb_idq = np.zeros(n, dtype=np.int64)
        self.fb_kp = np.zeros(n)
        self.fb_kd = np.zeros(n)
        self.fb_pid = np.zeros((n, PID_PARAMS))
        self.pid_state = np.zeros((n, PID_STATE))
        self._fallback_laws(sec.fallback, spec)
        self.open_band = np.vstack([np.full(n, -np.inf), np.full(n, np.inf)])
        self.q_ref = np.full(n, np.nan)
        self.state = np.zeros(1, dtype=np.int64)
        self.a = np.zeros(n)
        self.out_buf = np.zeros(n)
        self.lo_eff = np.zeros(n)
        self.hi_eff = np.zeros(n)
        self.src = np.zeros(2 * n, dtype=np.int64)
        self.bvec = np.zeros(m)
        self.work = np.zeros((m + 6, 2 * n))
        self.band_lo = np.full(n, -np.inf)
        self.band_hi = np.full(n, np.inf)
        self._entry = None  # shield_kernel's compiled entry point for the step's argument types
        self._into_entry = None  # shield_into's

    def reset(self) -> None:
        """A new episode: nothing latched, the PID fallbacks as built, no band (the state a new
        Shield of this configuration has; the compiled code and the bound arrays are kept)."""
        self.state[:] = 0
        self.q_ref[:] = np.nan
        self.band_lo[:] = -np.inf
        self.band_hi[:] = np.inf
        self.reset_pid()

    def _fallback_laws(self, fb, spec) -> None:
        """[safety.fallback]: fixed values, joint PD blocks, hold (the default: the applied value)."""
        for name, value in fb.fixed.items():
            if name in self.names:
                i = self.names.index(name)
                self.fb_kind[i], self.fb_value[i] = FB_FIXED, float(value)
        for blk in fb.joint_pd:
            if blk.gravity:
                raise ValueError("safety.fallback.joint_pd.gravity: the in-loop shield's joint PD has no "
                                 "gravity model (the drive compensates it: gravity = false)")
            elems = spec.expand("inputs", blk.inputs)
            iq, idq = spec.indices("outputs", blk.position), spec.indices("outputs", blk.velocity)
            kp, kd = np.broadcast_to(blk.kp, len(elems)), np.broadcast_to(blk.kd, len(elems))
            for e, name in enumerate(elems):
                if name in self.names:
                    i = self.names.index(name)
                    self.fb_kind[i] = FB_JOINT_PD
                    self.fb_iq[i], self.fb_idq[i] = iq[e], idq[e]
                    self.fb_kp[i], self.fb_kd[i] = kp[e], kd[e]
        for lp in fb.loops:
            if lp.input not in self.names:
                continue
            i = self.names.index(lp.input)
            pid = pid_from_config(lp, spec.quantity("inputs", lp.input))
            kind, idx = signal_index(spec, lp.measurement)
            safe = fb.safe_output[lp.input] if fb.loop_on_bad(lp) == "safe" else np.nan
            self.fb_kind[i] = FB_PID
            self.fb_pid[i] = (pid.kp, pid.ki, pid.kd, pid.bias, float(pid.reverse), pid.td_filter_s, pid.out_min,
                              pid.out_max, float(lp.setpoint), float(kind == "u"), float(idx), safe)
        self.reset_pid()

    def reset_pid(self) -> None:
        """The PID fallbacks' state as FallbackController builds it: integral 0, no measurement
        yet, output at the clipped bias, nothing decided (the first step follows the applied value)."""
        st = self.pid_state
        st[:] = 0.0
        st[:, PS_LAST_MEAS] = np.nan
        st[:, PS_LAST_E] = np.nan
        st[:, PS_DECIDED] = np.nan
        p = self.fb_pid
        st[:, PS_ACTION] = np.minimum(np.maximum(p[:, PID_BIAS], p[:, PID_OUT_MIN]), p[:, PID_OUT_MAX])

    def step_into(self, k: int, proposal: np.ndarray, proposal_step: int, y: np.ndarray, u: np.ndarray,
                  prev: np.ndarray, dt_s: float, out: np.ndarray, allow_policy: bool, u_cmd: np.ndarray,
                  apply_index: np.ndarray, apply_pos: np.ndarray) -> int:
        """The loop's stage (shield_into): `step` with prev taken from u and the bus-driven
        actions written into u_cmd; one compiled call, through its bound entry point."""
        args = (self.kernel_fill, self.fill_args, k, proposal, proposal_step, self.max_age_steps,
                allow_policy, y, u, prev, dt_s, self.lo, self.hi, self.rate, self.W, self.Wz,
                self.b0, self.By, self.Bu, self.scale, self.m_static, self.reads_y, self.reads_u,
                self.fb_kind, self.fb_value, self.fb_iq, self.fb_idq, self.fb_kp, self.fb_kd,
                self.act_u, self.q_ref, self.state, self.a, out, self.lo_eff, self.hi_eff, self.src,
                self.bvec, self.work, self.max_iter, self.band_lo, self.band_hi, self.fb_pid, self.pid_state,
                self.open_band, u_cmd, apply_index, apply_pos)
        entry = self._into_entry
        if entry is not None:
            try:
                return entry(*args)
            except TypeError:
                self._into_entry = None
        code = shield_into(*args)
        if self._into_entry is None:
            from hil.loop.step import LoopStep

            self._into_entry = LoopStep._bind(shield_into, args)
        return code

    def bind(self, proposal, y, u, prev, dt_s: float, out, u_cmd, apply_index, apply_pos) -> "BoundShield":
        """The loop's form of `step_into` with these arrays fixed (BoundShield): one object and
        three scalars per step instead of 45 arguments."""
        return BoundShield(self, proposal, y, u, prev, dt_s, out, u_cmd, apply_index, apply_pos)

    def step(self, k: int, proposal: np.ndarray, proposal_step: int, y: np.ndarray, u: np.ndarray,
             prev: np.ndarray, dt_s: float, out: np.ndarray, allow_policy: bool = True) -> int:
        """One shield step (see shield_kernel): `out` gets the action; returns the source code.
        Called through the kernel's compiled entry point for these argument types once known
        (the dispatcher's typing of 40 arguments costs tens of us a call)."""
        args = (self.kernel_fill, self.fill_args, k, proposal, proposal_step, self.max_age_steps,
                allow_policy, y, u, prev, dt_s, self.lo, self.hi, self.rate, self.W, self.Wz,
                self.b0, self.By, self.Bu, self.scale, self.m_static, self.reads_y, self.reads_u,
                self.fb_kind, self.fb_value, self.fb_iq, self.fb_idq, self.fb_kp, self.fb_kd,
                self.act_u, self.q_ref, self.state, self.a, out, self.lo_eff, self.hi_eff, self.src,
                self.bvec, self.work, self.max_iter, self.band_lo, self.band_hi, self.fb_pid, self.pid_state,
                self.open_band)
        entry = self._entry
        if entry is not None:
            try:
                return entry(*args)
            except TypeError:  # an argument of another type than at binding: the dispatcher decides
                self._entry = None
        code = shield_kernel(*args)
        if self._entry is None:
            from hil.loop.step import LoopStep

            self._entry = LoopStep._bind(shield_kernel, args)
        return code


# ---- the loop's bound form: every array fixed, one object argument per step ----
#
# A call of shield_into from Python unboxes its 45 arguments every step (23 arrays, the fill's
# 18-array tuple, the fill as a first-class function): ~30 us of the loop's decide stage on an
# idle machine, more than the kernel itself (benchmarks/shield.py `decide_call`). In the loop
# every one of those arrays is the same object from step to step (the loop's y, u, u_cmd, the
# endpoint's proposal buffer, the shield's own arrays), so they are held once in a Numba
# jitclass instance and a step passes that instance and three scalars.

_BOUND_FIELDS = ("fill_args", "prop", "y", "u", "prev", "lo", "hi", "rate", "W", "Wz", "b0", "By", "Bu", "scale",
                 "reads_y", "reads_u", "fb_kind", "fb_value", "fb_iq", "fb_idq", "fb_kp", "fb_kd", "act_u", "q_ref",
                 "state", "a", "out", "lo_eff", "hi_eff", "src", "bvec", "work", "band_lo", "band_hi", "fb_pid",
                 "pid_state", "open_band", "u_cmd",
                 "apply_index", "apply_pos", "dt_s", "m_static", "max_age_steps", "max_iter")
_BOUND_CLASSES: dict = {}


def _bound_class(types: tuple):
    """The jitclass holding _BOUND_FIELDS of these Numba types (one class per type tuple)."""
    cls = _BOUND_CLASSES.get(types)
    if cls is None:
        from numba.experimental import jitclass

        args = ", ".join(_BOUND_FIELDS)
        body = "\n".join(f"        self.{f} = {f}" for f in _BOUND_FIELDS)
        ns: dict = {}
        exec(f"class ShieldArrays:\n    def __init__(self, {args}):\n{body}\n", ns)
        cls = _BOUND_CLASSES[types] = jitclass(list(zip(_BOUND_FIELDS, types)))(ns["ShieldArrays"])
    return cls


_BOUND_STEPS: dict = {}


def _bound_step(fill):
    """shield_into over a ShieldArrays instance, with the plant's fill as a static callee."""
    run = _BOUND_STEPS.get(fill)
    if run is None:
        @njit(nogil=True)
        def run(S, k, prop_step, allow_policy):
            return shield_into(fill, S.fill_args, k, S.prop, prop_step, S.max_age_steps, allow_policy, S.y, S.u,
                               S.prev, S.dt_s, S.lo, S.hi, S.rate, S.W, S.Wz, S.b0, S.By, S.Bu, S.scale,
                               S.m_static, S.reads_y, S.reads_u, S.fb_kind, S.fb_value, S.fb_iq, S.fb_idq, S.fb_kp,
                               S.fb_kd, S.act_u, S.q_ref, S.state, S.a, S.out, S.lo_eff, S.hi_eff, S.src, S.bvec,
                               S.work, S.max_iter, S.band_lo, S.band_hi, S.fb_pid, S.pid_state, S.open_band, S.u_cmd,
                               S.apply_index, S.apply_pos)

        _BOUND_STEPS[fill] = run
    return run


class BoundShield:
    """`Shield.step_into` for fixed arrays: the loop's form (hil/loop/shield_bus.py).

        bound = shield.bind(proposal, y, u, prev, dt_s, out, u_cmd, apply_index, apply_pos)
        code = bound.step(k, proposal_step, allow_policy)   # same as shield.step_into(k, proposal, ...)

    The arrays are shared, not copied: write the proposal (and the shield's band_lo / band_hi)
    in place; `bound.arrays` tells which objects it holds (a caller whose u_cmd changes binds
    again). The first bind of a plant's fill compiles (seconds, before the clock starts; the
    kernel is not run, so binding changes no state); binding again reuses that code."""

    def __init__(self, shield: "Shield", proposal, y, u, prev, dt_s: float, out, u_cmd, apply_index, apply_pos):
        from numba import typeof

        from hil.loop.step import LoopStep

        values = {"fill_args": shield.fill_args, "prop": proposal, "y": y, "u": u, "prev": prev, "out": out,
                  "u_cmd": u_cmd, "apply_index": apply_index, "apply_pos": apply_pos, "dt_s": float(dt_s),
                  "m_static": int(shield.m_static), "max_age_steps": int(shield.max_age_steps),
                  "max_iter": int(shield.max_iter)}
        for f in _BOUND_FIELDS:
            if f not in values:
                values[f] = getattr(shield, f)
        for f, v in values.items():
            if isinstance(v, np.ndarray) and not v.flags.c_contiguous:
                raise ValueError(f"shield.bind: {f} must be a C-contiguous array (it is shared, not copied)")
        args = tuple(values[f] for f in _BOUND_FIELDS)
        self.arrays = {f: v for f, v in values.items() if isinstance(v, np.ndarray)}
        self.S = _bound_class(tuple(typeof(v) for v in args))(*args)
        self._run = _bound_step(shield.kernel_fill)
        sig = (typeof(self.S), types.int64, types.int64, types.boolean)
        self._run.compile(sig)  # compiled, not run: binding changes no state
        self._entry = LoopStep._bind(self._run, (self.S, 0, 0, False)) or self._run

    def step(self, k: int, proposal_step: int, allow_policy: bool) -> int:
        """One shield step (shield_into) on the bound arrays; returns the source code."""
        return self._entry(self.S, k, proposal_step, allow_policy)
