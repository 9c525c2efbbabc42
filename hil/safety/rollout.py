"""Rollout modes and the KPI gates between them.

    shadow    the baseline acts; the policy's proposals are logged beside it, never applied
    advisory  the baseline acts; proposals are logged and published as advice
    limited   the policy acts inside a tighter envelope (baseline +/- max deviation, limited box)
    full      the policy acts inside the normal envelope

Promotion goes one mode up, and only through the gate of the mode being left
([safety.rollout.gates.<mode>]): every KPI it names, computed over the last `window_s` of
simulated time spent in the current mode, must meet its threshold, and the mode must have
lasted at least `window_s`. Without a gate there is no promotion. Demotion (a monitor trip, an
operator) is immediate and may skip modes.

KPIs (per observation samples):
    tracking_nrmse  sqrt(mean(((measurement - setpoint) / span)^2)) over the fallback's loops
    fallback_rate   fraction of the policy's proposals the wrapper refused as not confident
                    (confidence gate held, or the linear limits could not be computed)
    silent_rate     fraction of samples the policy did not answer (in time, validly)
    clip_rate       fraction of the policy's proposals the projection clipped
    action_nrmse    sqrt(mean(((proposal - baseline) / span)^2)) over samples with a proposal
    alarms          monitor trips and policy-lost alarms

A KPI that cannot be computed over the window fails its threshold (fail closed): the rates
over proposals and action_nrmse without any proposal in the window (nothing was gated, so a
rate of 0 would prove nothing), tracking_nrmse when a loop's measurement was Bad in the window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from hil.safety.config import MODES


@dataclass(frozen=True)
class KpiSample:
    t_s: float
    tracking_sq: float
    fallback: bool
    silent: bool
    clipped: bool
    action_sq: float  # NaN without a proposal
    alarms: int


@dataclass
class GateResult:
    mode: str
    target: str | None
    passed: bool
    reasons: list[str] = field(default_factory=list)
    kpis: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"mode": self.mode, "target": self.target, "passed": self.passed, "reasons": self.reasons,
                "kpis": self.kpis}


_THRESHOLDS = (
    ("max_tracking_nrmse", "tracking_nrmse"),
    ("max_fallback_rate", "fallback_rate"),
    ("max_silent_rate", "silent_rate"),
    ("max_clip_rate", "clip_rate"),
    ("max_action_nrmse", "action_nrmse"),
    ("max_alarms", "alarms"),
)


def kpis_of(samples) -> dict:
    """KPIs of a window of samples; NaN for a KPI that cannot be computed (see the module doc)."""
    n = len(samples)
    if n == 0:
        return {"samples": 0}
    with_prop = [s.action_sq for s in samples if not math.isnan(s.action_sq)]
    answered = [s for s in samples if not s.silent]
    tracking = sum(s.tracking_sq for s in samples) / n  # NaN if one sample's is
    return {
        "samples": n,
        "tracking_nrmse": math.sqrt(tracking) if tracking >= 0 else math.nan,
        "fallback_rate": sum(s.fallback for s in answered) / len(answered) if answered else math.nan,
        "silent_rate": sum(s.silent for s in samples) / n,
        "clip_rate": sum(s.clipped for s in answered) / len(answered) if answered else math.nan,
        "action_nrmse": math.sqrt(sum(with_prop) / len(with_prop)) if with_prop else math.nan,
        "alarms": sum(s.alarms for s in samples),
    }


_UNKNOWN = {
    "tracking_nrmse": "a fallback loop's measurement was Bad in the window",
    "fallback_rate": "no proposals in the window: nothing was gated",
    "clip_rate": "no proposals in the window",
    "action_nrmse": "no proposals in the window",
}


class Rollout:
    def __init__(self, section, mode: str, t_s: float = 0.0):
        self.sec = section
        self.mode = mode
        self.entered_t_s = t_s
        self.samples: deque[KpiSample] = deque()
        windows = [g.window_s for g in section.gates.values()]
        self._keep_s = max(windows) if windows else 0.0
        self.history: list[dict] = []

    def record(self, sample: KpiSample) -> None:
        self.samples.append(sample)
        while self.samples and sample.t_s - self.samples[0].t_s > self._keep_s:
            self.samples.popleft()

    def next_mode(self) -> str | None:
        i = MODES.index(self.mode)
        if i + 1 >= len(MODES) or i >= MODES.index(self.sec.max_mode):
            return None
        return MODES[i + 1]

    def evaluate(self, t_s: float) -> GateResult:
        """The gate out of the current mode, evaluated at sim time t_s."""
        target = self.next_mode()
        gate = self.sec.gates.get(self.mode)
        res = GateResult(self.mode, target, False)
        if target is None:
            res.reasons.append(f"{self.mode} is the highest mode allowed (max_mode = {self.sec.max_mode})")
            return res
        if gate is None:
            res.reasons.append(f"no gate defined for leaving {self.mode} ([safety.rollout.gates.{self.mode}])")
            return res
        window = [s for s in self.samples if s.t_s > t_s - gate.window_s]
        res.kpis = kpis_of(window)
        in_mode = t_s - self.entered_t_s
        if in_mode < gate.window_s:
            res.reasons.append(f"in {self.mode} for {in_mode:g} s < window {gate.window_s:g} s")
        if not window:
            res.reasons.append("no samples in the window")
        for key, kpi in _THRESHOLDS:
            limit = getattr(gate, key)
            value = res.kpis.get(kpi)
            if limit is None or value is None:
                continue
            if math.isnan(value):
                res.reasons.append(f"{kpi} unknown ({_UNKNOWN.get(kpi, 'cannot be computed')})")
            elif value > limit:
                res.reasons.append(f"{kpi} {value:.4g} > {limit:g}")
        res.passed = not res.reasons
        return res

    def promote(self, t_s: float, by: str) -> GateResult:
        """Go one mode up if the gate passes; the result says why not otherwise."""
        res = self.evaluate(t_s)
        if res.passed:
            self._set(t_s, res.target, f"promoted by {by}: gate of {res.mode} passed {res.kpis}")
        return res

    def demote(self, t_s: float, to: str, reason: str) -> bool:
        """Go down to `to` (never up). True if the mode changed."""
        if MODES.index(to) >= MODES.index(self.mode):
            return False
        self._set(t_s, to, f"demoted: {reason}")
        return True

    def maybe_auto_promote(self, t_s: float) -> GateResult | None:
        if not self.sec.auto_promote or self.next_mode() is None or self.mode not in self.sec.gates:
            return None
        res = self.promote(t_s, "auto")
        return res if res.passed else None

    def _set(self, t_s: float, mode: str, reason: str) -> None:
        self.history.append({"t_s": t_s, "from": self.mode, "to": mode, "reason": reason})
        self.mode = mode
        self.entered_t_s = t_s
        self.samples.clear()
