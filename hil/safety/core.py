"""The safety wrapper's decision, one observation at a time (no sockets: wrapper.py adds them).

For each observation (sim time t_s, measured outputs y, applied inputs u) and the policy's
proposal for it (or None: silent, late, invalid, or from a version that may not act):

1. the baseline controller computes its action (always, so it is warm);
2. the monitor rules run; a trip raises an alarm and, per rule, rolls the policy back to the
   previous known-good version and/or forces the fallback; the mode is demoted;
3. the confidence gate scores the observation (Mahalanobis distance of the features, ensemble
   disagreement) and holds the fallback with hysteresis;
4. the rollout mode decides who acts: shadow/advisory -> the baseline; limited/full -> the
   policy unless the gate holds the fallback or the policy is silent;
5. whatever acts is projected (box, rate, linear limits; limited: the tighter band), every
   clip recorded with its reason; the baseline then tracks the applied action (bumpless).

Everything is driven by the observations' simulated time, so a lockstep run is reproducible.
`log` receives one dict per event (a JSONL line in wrapper.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hil.policy.features import FeatureMap
from hil.safety.config import MODES
from hil.safety.fallback import ConfidenceGate, FallbackController
from hil.safety.monitor import Monitor, VersionKeeper
from hil.safety.projection import Projector
from hil.safety.rollout import KpiSample, Rollout


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
        self.projector = Projector(sec.projection, spec, self.names)
        self.baseline = FallbackController(sec.fallback, spec, self.names)
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
        self.features: FeatureMap | None = None
        self._use_version(version)
        self.prev_action: np.ndarray | None = None
        self.prev_t: float | None = None
        self.last_t: float | None = None
        self.last_step = -1
        self.silent = False
        self.last_source = ""
        self.alarms: list[dict] = []
        self._want_command: str | None = None
        self._post: tuple | None = None
        self._prepared: tuple | None = None
        self._command_t = -math.inf
        self.c = {k: 0 for k in ("decisions", "policy_actions", "baseline_actions", "silent_steps",
                                 "wrong_version", "clipped_decisions", "clips", "infeasible", "fallback_enters",
                                 "alarms", "rollbacks", "promotions", "demotions", "promote_refused")}
        self.log({"event": "start", "mode": self.rollout.mode, "version": version, "actions": self.names,
                  "mahalanobis": self.gate.precision is not None})

    # ---- policy versions ----
    def _use_version(self, version: str | None) -> None:
        """Load the training statistics and features of `version` for the confidence gate."""
        self.gate.set_stats(None)
        self.features = None
        if not version or self.store is None:
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
    def prepare(self, step: int, t_s: float, y: np.ndarray, u: np.ndarray) -> None:
        """The part of the decision that does not need the proposal: baseline action, monitor
        (alarms, rollback, forced fallback), features and Mahalanobis distance. The wrapper runs
        it when the observation arrives, while the policy is still computing, so only the rest
        is on the round trip; decide() runs it itself if it was not run for this observation."""
        self.finish()
        dt = 0.0 if self.last_t is None else max(t_s - self.last_t, 0.0)
        self.last_t, self.last_step = t_s, step
        base = self.baseline.update(y, u, dt)
        rec_base = {"t_s": t_s, "step": step}
        c = self.c

        # 2. monitor
        trips = self.monitor.update(t_s, y, u)
        for trip in trips:
            c["alarms"] += 1
            alarm = {"t_s": t_s, "rule": trip.rule, "message": trip.message, "wall_ns": time.time_ns()}
            self.alarms.append(alarm)
            del self.alarms[:-50]
            self.log({**rec_base, "event": "alarm", "rule": trip.rule, "reason": trip.message})
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
        self._prepared = (step, t_s, y, u, base, trips, self.gate.mahalanobis(x))

    def decide(self, step: int, t_s: float, y: np.ndarray, u: np.ndarray, proposal=None,
               silent_reason: str = "no proposal", defer: bool = False) -> Decision:
        """proposal: a validated bus Message (kind proposal) answering this observation, or None.
        defer=True: the caller runs finish() (after sending the action)."""
        prep = self._prepared
        if prep is None or prep[0] != step or prep[1] != t_s or prep[2] is not y or prep[3] is not u:
            self.prepare(step, t_s, y, u)
            prep = self._prepared
        self._prepared = None
        base, trips, maha = prep[4], prep[5], prep[6]
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

        # 3. confidence, the proposal's part
        members = proposal.payload["members"] if proposal is not None else None
        dis = self.gate.disagreement(members)
        active, transition = self.gate.update(t_s, maha, dis)
        if transition:
            if active:
                c["fallback_enters"] += 1
            self.log({**rec_base, "event": "fallback_enter" if active else "fallback_exit", "reason": transition})

        # 4. who acts
        mode = self.rollout.mode
        dt_a = -1.0 if self.prev_t is None else t_s - self.prev_t
        band_lo = band_hi = None
        if mode == "limited":
            band_lo = np.maximum(self.lim_lo, base - self.lim_dev)
            band_hi = np.minimum(self.lim_hi, base + self.lim_dev)
        prop_a = proj_p = None
        clips_p: list = []
        if proposal is not None:
            prop_a = proposal.payload["a"]
            proj_p, clips_p = self.projector.project(prop_a, self.prev_action, dt_a, y, u, band_lo, band_hi)
        if mode in ("limited", "full") and proposal is not None and not self.gate.active:
            final, clips, source = proj_p, clips_p, "policy"
        else:
            if proposal is None:
                why = "silent"
            elif mode in ("shadow", "advisory"):
                why = mode
            else:
                why = "confidence"
            final, clips = self.projector.project(base, self.prev_action, dt_a, y, u)
            source = "baseline:" + why
        infeasible = self.projector.infeasible
        self.prev_action, self.prev_t = final, t_s
        command, self._want_command = self._want_command, None
        if command is not None:
            self._command_t = t_s
        advice = proj_p if mode == "advisory" else None
        self._post = (step, t_s, y, u, base, final, clips, source, mode, prop_a, proj_p, clips_p, trips, maha, dis,
                      infeasible)
        if not defer:
            self.finish()
        return Decision(final, source, mode, advice, command)

    def finish(self) -> None:
        """The bookkeeping of the last decision (tracking, KPIs, gates, log), which the wrapper
        runs after sending the action so it stays off the round trip. decide() calls it itself
        unless told to defer."""
        if self._post is None:
            return
        (step, t_s, y, u, base, final, clips, source, mode, prop_a, proj_p, clips_p, trips, maha, dis,
         infeasible) = self._post
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
        self.rollout.record(KpiSample(t_s, self.baseline.tracking_sq(y, u), self.gate.active, prop_a is None,
                                      bool(clips_p), action_sq, len(trips)))
        rec_base = {"t_s": t_s, "step": step}
        promoted = self.rollout.maybe_auto_promote(t_s)
        if promoted is not None:
            c["promotions"] += 1
            self.log({**rec_base, "event": "mode", "mode": self.rollout.mode,
                      "reason": self.rollout.history[-1]["reason"], "gate": promoted.as_dict()})
        if (clips or mode in ("shadow", "advisory") or self.sec.log_every_step or source != self.last_source
                or infeasible):
            rec = {**rec_base, "event": "decision", "mode": mode, "source": source, "action": _r(final),
                   "baseline": _r(base), "proposal": _r(prop_a), "projected": _r(proj_p),
                   "applied": _r(u[self.action_index]), "mahalanobis": _f(maha), "disagreement": _f(dis)}
            if clips:
                rec["clips"] = [cl.as_dict() for cl in clips]
            if clips_p and source != "policy":
                rec["proposal_clips"] = [cl.as_dict() for cl in clips_p]
            if infeasible:
                rec["reason"] = "linear limits infeasible inside the box"
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

    def demote(self, t_s: float, to: str, reason: str) -> bool:
        if to not in MODES:
            raise ValueError(f"unknown mode {to!r}")
        if self.rollout.demote(t_s, to, reason):
            self.c["demotions"] += 1
            self.log({"t_s": t_s, "step": self.last_step, "event": "mode", "mode": to, "reason": f"demoted: {reason}"})
            return True
        return False

    def promote(self, by: str = "operator") -> dict:
        self.finish()
        t_s = self.last_t if self.last_t is not None else 0.0
        res = self.rollout.promote(t_s, by)
        if res.passed:
            self.c["promotions"] += 1
            self.log({"t_s": t_s, "step": self.last_step, "event": "mode", "mode": self.rollout.mode,
                      "reason": self.rollout.history[-1]["reason"], "gate": res.as_dict()})
        else:
            self.c["promote_refused"] += 1
            self.log({"t_s": t_s, "step": self.last_step, "event": "promote_refused", "by": by,
                      "reason": "; ".join(res.reasons), "gate": res.as_dict()})
        return res.as_dict()

    def status(self) -> dict:
        self.finish()
        t_s = self.last_t if self.last_t is not None else 0.0
        return {
            "t_s": self.last_t, "step": self.last_step, "mode": self.rollout.mode, "version": self.version,
            "rolled_back": list(self.keeper.rolled_back), "source": self.last_source,
            "fallback": {"active": self.gate.active, "reason": self.gate.reason,
                         "mahalanobis": _f(self.gate.last_mahalanobis),
                         "disagreement": _f(self.gate.last_disagreement)},
            "policy_silent": self.silent, "alarms": list(self.alarms[-10:]), "alarm_count": self.c["alarms"],
            "monitor_holding": self.monitor.holding(), "gate": self.rollout.evaluate(t_s).as_dict(),
            "mode_history": list(self.rollout.history), "rollbacks": list(self.keeper.history),
            "counters": dict(self.c),
        }


def _f(v: float) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)
