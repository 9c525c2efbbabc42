"""The safety wrapper's decision, one observation at a time (no sockets: wrapper.py adds them).

For each observation (sim time t_s, measured outputs y with their quality q, applied inputs u)
and the policy's proposal for it (or None: silent, late, invalid, or from a version that may
not act):

0. quality: an output that is not finite or whose quality is Bad is Bad: it reaches every
   layer below as NaN, and each layer fails closed on it (a check that cannot be computed
   counts as failed). Uncertain outputs are used as they are;
1. the baseline controller computes its action (always, so it is warm). It follows the
   APPLIED actuator values when they differ from what the wrapper decided (the loop's
   watchdog acted, an actuator gap), and a loop with a Bad measurement holds or goes to its
   safe output ([safety.fallback].on_bad);
2. the monitor rules run (a Bad signal trips per its rule's `on_bad`); a trip raises an alarm
   and, per rule, rolls the policy back to the previous known-good version and/or forces the
   fallback; the mode is demoted;
3. the confidence gate scores the observation (Mahalanobis distance of the features, ensemble
   disagreement, the proposal's consistency with its members) and holds the fallback with
   hysteresis; a score that cannot be computed means "not confident" unless that check is
   disabled in [safety.confidence];
4. the rollout mode decides who acts: shadow/advisory -> the baseline; limited/full -> the
   policy unless the gate holds the fallback, the policy is silent, or a linear limit's
   b(state) cannot be computed (then the baseline acts, projected on box and rate only);
5. whatever acts is projected (box, rate from the APPLIED value over one loop step, linear
   limits; limited: the tighter band), every clip recorded with its reason; the baseline then
   tracks the decided action (bumpless).

A policy silent for [safety].policy_lost_after_s of sim time is lost: an alarm (distinct from
a single deadline miss, which is only a silent step). When it answers again, the rollout goes
back to shadow: it re-enters through the gates, never straight back to authority.

Everything is driven by the observations' simulated time, so a lockstep run is reproducible.
`log` receives one dict per event (a JSONL line in wrapper.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import njit

from hil.policy.features import FeatureMap
from hil.safety.config import LOST_AFTER_STEPS, MODES
from hil.safety.fallback import ConfidenceGate, FallbackController
from hil.safety.monitor import Monitor, VersionKeeper
from hil.safety.projection import Projector
from hil.safety.rollout import KpiSample, Rollout

QUALITY_BAD = 2  # per-output quality codes: 0 Good, 1 Uncertain, 2 Bad
RECENT_DECISIONS = 16  # decisions that may still be in flight to the actuators


@njit(cache=True, nogil=True)
def _unmatched(ring, applied, out):
    """out[k] = no row of ring (recent decisions; NaN rows: none yet) holds applied[k], within
    1e-9 relative. Returns the number of unmatched components."""
    r, n = ring.shape
    count = 0
    for k in range(n):
        tol = 1e-9 * (1.0 + abs(applied[k]))
        hit = False
        for i in range(r):
            if abs(ring[i, k] - applied[k]) <= tol:
                hit = True
                break
        out[k] = not hit
        count += not hit
    return count


@dataclass
class Decision:
    action: np.ndarray  # plant units, action input order
    source: str  # "policy" or "baseline:<why>"
    mode: str
    advice: np.ndarray | None  # advisory mode: what the policy would do (projected)
    command: str | None = None  # a policy version the policy process must load now


def _r(a) -> list | None:
    return None if a is None else [float(v) for v in a]


class SafetyCore:
    def __init__(self, scenario, spec, action_names: list[str], store=None, version: str | None = None,
                 log: Callable[[dict], None] | None = None):
        sec = scenario.safety
        self.sec = sec
        self.spec = spec
        self.names = list(action_names)
        self.log = log or (lambda rec: None)
        plant_model = scenario.plant.load()
        self.projector = Projector(sec.projection, spec, self.names, plant=plant_model)
        self.baseline = FallbackController(sec.fallback, spec, self.names, plant=plant_model)
        self.gate = ConfidenceGate(sec.confidence, spec, self.names)
        self.monitor = Monitor(sec.monitor, spec)
        self.store = store
        self.keeper = VersionKeeper(store, version or "")
        self.rollout = Rollout(sec.rollout, sec.mode)
        ro = sec.rollout
        self.span = np.array([max(spec.quantity("inputs", a).high - spec.quantity("inputs", a).low, 1e-12)
                              for a in self.names])
        self.lim_lo = np.array([ro.limited_box.get(a, (-np.inf, np.inf))[0] for a in self.names])
        self.lim_hi = np.array([ro.limited_box.get(a, (-np.inf, np.inf))[1] for a in self.names])
        self.lim_dev = np.array([ro.limited_max_deviation.get(a, np.inf) for a in self.names])
        self.action_index = np.array([spec.index("inputs", a) for a in self.names], dtype=np.intp)
        self.output_names = list(spec.names("outputs"))
        self.step_s = float(scenario.loop.step_s)  # an action replaces the applied value one step later
        self.lost_after_s = (sec.policy_lost_after_s if sec.policy_lost_after_s is not None
                             else LOST_AFTER_STEPS * self.step_s)
        self.features: FeatureMap | None = None
        self._stats_why = "no training statistics"
        self._use_version(version)
        self._ring = np.full((RECENT_DECISIONS, len(self.names)), np.nan)  # recent decided actions
        self._ring_i = 0
        self._override = np.zeros(len(self.names), dtype=np.bool_)
        # compile (or load from Numba's cache) the core's own kernels before anyone waits on them
        _unmatched(self._ring, np.zeros(len(self.names)), self._override)
        self.gate.inconsistency(np.zeros(len(self.names)), np.zeros((1, len(self.names))))
        self.last_t: float | None = None
        self.last_step = -1
        self.silent = False
        self.last_source = ""
        self.band = (None, None)
        self.bad_signals: list[str] = []
        self.overridden: list[str] = []
        self.policy_lost = False
        self._answered_t: float | None = None  # sim time of the last valid proposal
        self._lost_t: float | None = None
        self.losses: list[dict] = []
        self.alarms: list[dict] = []
        self._want_command: str | None = None
        self._post: tuple | None = None
        self._prepared: tuple | None = None
        self._command_t = -math.inf
        self.c = {k: 0 for k in ("decisions", "policy_actions", "baseline_actions", "silent_steps",
                                 "wrong_version", "clipped_decisions", "clips", "infeasible", "fallback_enters",
                                 "alarms", "rollbacks", "promotions", "demotions", "promote_refused",
                                 "bad_observations", "limits_unknown", "applied_overrides", "policy_lost")}
        checks = self.gate.checks()
        self.log({"event": "start", "mode": self.rollout.mode, "version": version, "actions": self.names,
                  "mahalanobis": self.gate.precision is not None,
                  "checks": {k: v["enabled"] for k, v in checks.items()},
                  "single_network": self.gate.accepted,  # None: a proposal without members is not confident
                  "policy_lost_after_s": self.lost_after_s})
        if self.gate.enabled["mahalanobis"] and self.gate.precision is None and version:
            self.log({"event": "warning", "reason": f"{self._stats_why}: the Mahalanobis check cannot be computed, "
                      "so the confidence gate holds the fallback (fail closed); disable it explicitly with "
                      "[safety.confidence] mahalanobis = false"})

    # ---- policy versions ----
    def _use_version(self, version: str | None) -> None:
        """Load the training statistics and features of `version` for the confidence gate."""
        self.gate.set_stats(None)
        self.features = None
        accepted = self.gate.use_version(version)  # (a version without statistics is never confident)
        if accepted is not None:
            self.log({"event": "single_network_accepted", **accepted,
                      "reason": f"operator-accepted single network: {accepted['reason'] or 'no reason given'}",
                      "checks_not_applied": ["disagreement", "consistency"], "checks_kept": ["mahalanobis"]})
        self._stats_why = f"no training statistics for {version}"
        if not version or self.store is None:
            if version:
                self._stats_why = f"no training statistics for {version} (entry and ONNX policies carry none)"
            return
        try:
            meta = self.store.meta(version)
            stats = self.store.stats(version)
        except (ValueError, OSError) as exc:
            self.log({"event": "warning", "reason": f"no training statistics for {version}: {exc}"})
            return
        if stats is not None:
            self.features = FeatureMap(self.spec, meta["features"])
            self.gate.set_stats(stats)

    @property
    def version(self) -> str | None:
        return self.keeper.current or None

    # ---- the decision ----
    def _quality(self, y: np.ndarray, q) -> tuple[np.ndarray, np.ndarray | None]:
        """(y with NaN for every Bad output, bool mask of the Bad ones or None if none)."""
        if q is None and math.isfinite(float(np.add.reduce(y))):  # fast path: a sum of finite values
            return y, None  # (one that overflows takes the element-wise path, same answer)
        bad = ~np.isfinite(y)
        if q is not None:
            bad |= np.asarray(q) >= QUALITY_BAD
        if not bad.any():
            return y, None
        y = y.copy()
        y[bad] = np.nan
        return y, bad

    def prepare(self, step: int, t_s: float, y: np.ndarray, u: np.ndarray, q=None) -> None:
        """The part of the decision that does not need the proposal: quality, baseline action,
        monitor (alarms, rollback, forced fallback), features and Mahalanobis distance. The
        wrapper runs it when the observation arrives, while the policy is still computing, so
        only the rest is on the round trip; decide() runs it itself if it was not run for this
        observation. y: measured outputs (NaN where Bad); q: None (all Good) or uint8 per
        output (0 Good, 1 Uncertain, 2 Bad); u: the inputs the loop applied in that step."""
        self.finish()
        y_in = y
        y, bad = self._quality(y, q)
        dt = 0.0 if self.last_t is None else max(t_s - self.last_t, 0.0)
        self.last_t, self.last_step = t_s, step
        rec_base = {"t_s": t_s, "step": step}
        c = self.c
        bad_names = [] if bad is None else [self.output_names[i] for i in np.flatnonzero(bad)]
        if bad_names:
            c["bad_observations"] += 1
        if bad_names != self.bad_signals:
            self.log({**rec_base, "event": "quality", "bad": bad_names,
                      "reason": ("Bad: " + ", ".join(bad_names)) if bad_names else "every output Good again"})
            self.bad_signals = bad_names

        # 1. baseline: follow the actuators where they carry what the wrapper did not decide
        applied = u[self.action_index]
        override = self._override if _unmatched(self._ring, applied, self._override) else None
        if override is not None:
            c["applied_overrides"] += 1
            self.baseline.follow(applied, override, y, u)
        names = [] if override is None else [self.names[i] for i in np.flatnonzero(override)]
        if names != self.overridden:
            if names and self.c["decisions"]:
                self.log({**rec_base, "event": "applied_override", "inputs": names, "applied": _r(applied),
                          "reason": f"applied {', '.join(names)} differ from every recent decision (loop watchdog, "
                                    "actuator gap or another writer): the baseline and the rate limit follow them"})
            self.overridden = names
        base = self.baseline.update(y, u, dt)

        # 2. monitor
        trips = self.monitor.update(t_s, y, u)
        for trip in trips:
            self._alarm(t_s, step, trip.rule, trip.message)
            if trip.action == "rollback":
                self.rollback(t_s, trip.message)
            elif trip.action == "fallback":
                text = self.gate.force(t_s, trip.message)
                if text:
                    c["fallback_enters"] += 1
                    self.log({**rec_base, "event": "fallback_enter", "reason": text})
            if trip.action in ("rollback", "fallback") and self.sec.monitor.demote_to:
                self.demote(t_s, self.sec.monitor.demote_to, trip.message)

        # 3. confidence, the observation's part
        x = self.features.build(y, u) if self.features is not None else None
        maha = self.gate.mahalanobis(x)
        if x is None:
            maha_why = self._stats_why
        elif math.isnan(maha):
            maha_why = "a feature is Bad: " + (", ".join(bad_names) or "not finite")
        else:
            maha_why = ""
        # (u, the applied inputs, is finite by contract: only a Bad output can make b unknown)
        unknown = self.projector.unknown_limits(y, u) if bad is not None else []
        self._prepared = (step, t_s, y_in, u, y, base, trips, maha, maha_why, unknown)

    def _alarm(self, t_s: float, step: int, rule: str, message: str) -> None:
        self.c["alarms"] += 1
        self.alarms.append({"t_s": t_s, "rule": rule, "message": message, "wall_ns": time.time_ns()})
        del self.alarms[:-50]
        self.log({"t_s": t_s, "step": step, "event": "alarm", "rule": rule, "reason": message})

    def _track_policy(self, t_s: float, step: int, answered: bool, why_silent: str | None) -> int:
        """Policy lost / recovered bookkeeping for this observation; returns alarms raised. Any
        silence counts (no answer in time, an invalid answer, a version that may not act: a
        policy process that cannot load the version it is told to is as useless as a dead one)."""
        if self.version is None:  # every version rolled back: proposals do not matter
            self._answered_t = t_s
            return 0
        if answered:
            self._answered_t = t_s
            if self.policy_lost:
                self.policy_lost = False
                lost_s = t_s - self._lost_t
                self.losses[-1]["recovered_t_s"] = t_s
                reason = (f"policy answers again after being lost for {lost_s:g} s (since t = {self._lost_t:g} s): "
                          "it re-enters through the rollout gates")
                self.log({"t_s": t_s, "step": step, "event": "policy_recovered", "reason": reason})
                if MODES.index(self.rollout.mode) > 0:
                    self.demote(t_s, "shadow", reason)
            return 0
        if self._answered_t is None:
            self._answered_t = t_s - self.step_s  # silent from the first observation on
        silent_s = t_s - self._answered_t
        if self.policy_lost or silent_s < self.lost_after_s - 1e-9:
            return 0
        self.policy_lost = True
        self._lost_t = t_s
        self.c["policy_lost"] += 1
        self.losses.append({"t_s": t_s, "silent_since_t_s": self._answered_t, "recovered_t_s": None})
        del self.losses[:-20]
        self._alarm(t_s, step, "policy_lost",
                    f"policy lost: no valid proposal for {silent_s:g} s (since t = {self._answered_t:g} s; "
                    f"limit {self.lost_after_s:g} s; last: {why_silent}); the baseline controller holds")
        return 1

    def decide(self, step: int, t_s: float, y: np.ndarray, u: np.ndarray, proposal=None,
               silent_reason: str = "no proposal", defer: bool = False, q=None) -> Decision:
        """proposal: a validated bus Message (kind proposal) answering this observation, or None.
        defer=True: the caller runs finish() (after sending the action). q: see prepare()."""
        prep = self._prepared
        if prep is None or prep[0] != step or prep[1] != t_s or prep[2] is not y or prep[3] is not u:
            self.prepare(step, t_s, y, u, q)
            prep = self._prepared
        self._prepared = None
        y = prep[4]
        base, trips, maha, maha_why, unknown = prep[5:]
        c = self.c
        c["decisions"] += 1
        rec_base = {"t_s": t_s, "step": step}

        # proposal validity
        why_silent = None
        if proposal is None:
            why_silent = silent_reason
        elif self.version is None:
            why_silent = "no policy version may act (all rolled back)"
        elif proposal.payload["version"] != self.version:
            c["wrong_version"] += 1
            why_silent = f"proposal from {proposal.payload['version']}, expected {self.version}"
            if t_s - self._command_t >= 1.0:  # re-send the load command (at most once per sim s)
                self._want_command = self.version
        if why_silent is not None:
            proposal = None
        if (proposal is None) != self.silent:
            self.silent = proposal is None
            self.log({**rec_base, "event": "silent_enter" if self.silent else "silent_exit",
                      "reason": why_silent or "valid proposal"})
        if proposal is None:
            c["silent_steps"] += 1
        lost_alarms = self._track_policy(t_s, step, proposal is not None, why_silent)

        # 3. confidence, the proposal's part
        dis = inc = None
        why = {"mahalanobis": maha_why}
        prop_a = None
        if proposal is not None:
            prop_a = proposal.payload["a"]
            dis, inc, why_m = self.gate.member_scores(prop_a, proposal.payload["members"])
            why.update(why_m)
        active, transition = self.gate.update(t_s, maha, dis, inc, why)
        if transition:
            if active:
                c["fallback_enters"] += 1
            self.log({**rec_base, "event": "fallback_enter" if active else "fallback_exit", "reason": transition})

        # 4. who acts; the rate limit acts on the applied value over the one step to come
        mode = self.rollout.mode
        applied = u[self.action_index]
        band_lo = band_hi = None
        if mode == "limited":
            band_lo = np.maximum(self.lim_lo, base - self.lim_dev)
            band_hi = np.minimum(self.lim_hi, base + self.lim_dev)
        self.band = (band_lo, band_hi)  # the limited-mode envelope (None: none), for the in-loop shield
        proj_p = None
        clips_p: list = []
        limits_ok = not unknown
        if proposal is not None:
            proj_p, clips_p = self.projector.project(prop_a, applied, self.step_s, y, u, band_lo, band_hi,
                                                     linear=limits_ok)
        reason = None
        if mode in ("limited", "full") and proposal is not None and not self.gate.active and limits_ok:
            final, clips, source = proj_p, clips_p, "policy"
        else:
            if proposal is None:
                why_b = "silent"
            elif mode in ("shadow", "advisory"):
                why_b = mode
            elif self.gate.active:
                why_b = "confidence"
            else:
                why_b = "limits_unknown"
            final, clips = self.projector.project(base, applied, self.step_s, y, u, linear=limits_ok)
            source = "baseline:" + why_b
        if not limits_ok:
            c["limits_unknown"] += 1
            reason = (f"linear limit(s) {', '.join(unknown)}: b(state) cannot be computed (Bad: "
                      f"{', '.join(self.bad_signals) or 'non-finite input'}); the policy may not act, the baseline "
                      "is projected on box and rate only")
        infeasible = self.projector.infeasible
        self._ring[self._ring_i] = final  # (a decision still in flight is not an override)
        self._ring_i = (self._ring_i + 1) % RECENT_DECISIONS
        command, self._want_command = self._want_command, None
        if command is not None:
            self._command_t = t_s
        advice = proj_p if mode == "advisory" else None
        self._post = (step, t_s, y, u, base, final, clips, source, mode, prop_a, proj_p, clips_p, trips, maha, dis,
                      inc, infeasible, reason, lost_alarms)
        if not defer:
            self.finish()
        return Decision(final, source, mode, advice, command)

    def finish(self) -> None:
        """The bookkeeping of the last decision (tracking, KPIs, gates, log), which the wrapper
        runs after sending the action so it stays off the round trip. decide() calls it itself
        unless told to defer."""
        if self._post is None:
            return
        (step, t_s, y, u, base, final, clips, source, mode, prop_a, proj_p, clips_p, trips, maha, dis, inc,
         infeasible, reason, lost_alarms) = self._post
        self._post = None
        c = self.c
        if infeasible:
            c["infeasible"] += 1
        if clips:
            c["clipped_decisions"] += 1
            c["clips"] += len(clips)
        c["policy_actions" if source == "policy" else "baseline_actions"] += 1
        self.baseline.track(final, y, u)
        if prop_a is None:
            action_sq = math.nan
        else:
            dev = (prop_a - base) / self.span
            action_sq = float(dev @ dev) / dev.size
        refused = self.gate.active or reason is not None  # (reason: the linear limits cannot be computed)
        self.rollout.record(KpiSample(t_s, self.baseline.tracking_sq(y, u), refused, prop_a is None,
                                      bool(clips_p), action_sq, len(trips) + lost_alarms))
        rec_base = {"t_s": t_s, "step": step}
        promoted = self.rollout.maybe_auto_promote(t_s)
        if promoted is not None:
            c["promotions"] += 1
            self.log({**rec_base, "event": "mode", "mode": self.rollout.mode,
                      "reason": self.rollout.history[-1]["reason"], "gate": promoted.as_dict(),
                      "single_network": self.gate.accepted})
        if (clips or mode in ("shadow", "advisory") or self.sec.log_every_step or source != self.last_source
                or infeasible or reason):
            rec = {**rec_base, "event": "decision", "mode": mode, "source": source, "action": _r(final),
                   "baseline": _r(base), "proposal": _r(prop_a), "projected": _r(proj_p),
                   "applied": _r(u[self.action_index]), "mahalanobis": _f(maha), "disagreement": _f(dis),
                   "inconsistency": _f(inc)}
            if clips:
                rec["clips"] = [cl.as_dict() for cl in clips]
            if clips_p and source != "policy":
                rec["proposal_clips"] = [cl.as_dict() for cl in clips_p]
            if infeasible:
                rec["reason"] = "linear limits infeasible inside the box"
            if reason:
                rec["reason"] = reason
            self.log(rec)
        self.last_source = source

    # ---- operations ----
    def rollback(self, t_s: float, reason: str) -> str | None:
        new, msg = self.keeper.rollback(t_s, reason)
        self.c["rollbacks"] += 1
        self._use_version(new)
        if new is not None:
            self._want_command = new
        self.log({"t_s": t_s, "step": self.last_step, "event": "rollback", "from": self.keeper.history[-1]["from"],
                  "to": new, "reason": msg})
        return new

    def resume(self, mode: str) -> None:
        """This process replaces a safety process that died (hil/safety/watch.py): start no
        higher than `mode` (its predecessor's last mode), and say so in the decision log."""
        if mode not in MODES:
            mode = MODES[0]
        if MODES.index(mode) < MODES.index(self.rollout.mode):
            self.rollout.demote(0.0, mode, "restarted after the safety process was lost")
        self.log({"event": "restart", "mode": self.rollout.mode, "resumed_at_most": mode,
                  "reason": "the previous safety process died or hung; rollout gates start over"})

    def demote(self, t_s: float, to: str, reason: str) -> bool:
        if to not in MODES:
            raise ValueError(f"unknown mode {to!r}")
        if self.rollout.demote(t_s, to, reason):
            self.c["demotions"] += 1
            self.log({"t_s": t_s, "step": self.last_step, "event": "mode", "mode": to, "reason": f"demoted: {reason}"})
            return True
        return False

    def acknowledge(self, t_s: float, by: str = "operator") -> int:
        """Mark every alarm not yet acknowledged as acknowledged by `by` (logged); returns how many.
        Acknowledging records that an operator has seen them; it changes no mode and no limit."""
        n = 0
        for a in self.alarms:
            if not a.get("acknowledged_by"):
                a["acknowledged_by"] = by
                n += 1
        self.log({"t_s": t_s, "step": self.last_step, "event": "acknowledge", "by": by,
                  "reason": f"{n} alarm(s) acknowledged by {by}"})
        return n

    def promote(self, by: str = "operator") -> dict:
        self.finish()
        t_s = self.last_t if self.last_t is not None else 0.0
        res = self.rollout.promote(t_s, by)
        if res.passed:
            self.c["promotions"] += 1
            self.log({"t_s": t_s, "step": self.last_step, "event": "mode", "mode": self.rollout.mode,
                      "reason": self.rollout.history[-1]["reason"], "gate": res.as_dict(),
                      "single_network": self.gate.accepted})
        else:
            self.c["promote_refused"] += 1
            self.log({"t_s": t_s, "step": self.last_step, "event": "promote_refused", "by": by,
                      "reason": "; ".join(res.reasons), "gate": res.as_dict()})
        return res.as_dict()

    def policy_state(self) -> dict:
        """ok | silent | lost | none (no version may act), with since when (sim s)."""
        if self.version is None:
            state = "none"
        elif self.policy_lost:
            state = "lost"
        elif self.silent:
            state = "silent"
        else:
            state = "ok"
        return {"state": state, "last_answer_t_s": self._answered_t if self.c["decisions"] else None,
                "lost_since_t_s": self._lost_t if self.policy_lost else None,
                "lost_after_s": self.lost_after_s, "losses": list(self.losses)}

    def status(self) -> dict:
        self.finish()
        t_s = self.last_t if self.last_t is not None else 0.0
        return {
            "t_s": self.last_t, "step": self.last_step, "mode": self.rollout.mode, "version": self.version,
            "rolled_back": list(self.keeper.rolled_back), "source": self.last_source,
            "fallback": {"active": self.gate.active, "reason": self.gate.reason,
                         "mahalanobis": _f(self.gate.last_mahalanobis),
                         "disagreement": _f(self.gate.last_disagreement),
                         "checks": self.gate.checks(), "single_network": self.gate.accepted},
            "policy_silent": self.silent, "policy": self.policy_state(),
            "bad_signals": list(self.bad_signals), "applied_overrides": list(self.overridden),
            "alarms": list(self.alarms[-10:]), "alarm_count": self.c["alarms"],
            "monitor_holding": self.monitor.holding(), "gate": self.rollout.evaluate(t_s).as_dict(),
            "mode_history": list(self.rollout.history), "rollbacks": list(self.keeper.history),
            "counters": dict(self.c),
        }


def _f(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)
