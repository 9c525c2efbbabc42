"""Monitor rules over key signals, and rollback to the previous known-good policy version.

A rule (`dissolved_oxygen < 20 for 30 s`) trips when its condition has held continuously for
`for_s` of simulated time, measured on the observations' sim time (so a rule behaves the same
in real time and lockstep). After a trip the rule re-arms: if the condition still holds
another `for_s` later, it trips again (a second rollback goes one known-good version further
back; when none is left the baseline controller holds).

A rule whose signal is Bad (not finite, or Bad quality: the caller passes NaN for it) cannot
be computed, and a safety check that cannot be computed counts as failed. `on_bad` says how:
"trip" (default): the rule trips at once with its own action; "alarm" / "fallback": it trips
at once with that action instead (a dead sensor says nothing against the policy, so rolling
it back may be more than the operator wants); "condition": the Bad value counts as the
condition holding (it trips after `for_s`). While the signal stays Bad the rule re-trips
every `for_s`; when it is good again its condition timer starts afresh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hil.safety.config import signal_index


@dataclass(frozen=True)
class Trip:
    rule: str
    action: str  # rollback | alarm | fallback
    t_s: float  # sim time of the trip
    since_s: float  # sim time the condition started holding
    value: float
    message: str


class Monitor:
    def __init__(self, section, spec):
        self.rules = []
        for r in section.rules:
            kind, idx = signal_index(spec, r.signal)
            self.rules.append((r, kind, idx))
        self._since: list[float | None] = [None] * len(self.rules)
        self._bad_since: list[float | None] = [None] * len(self.rules)  # signal Bad since
        self._bad_trip: list[float | None] = [None] * len(self.rules)  # last trip for Bad
        self.trips = 0

    def update(self, t_s: float, y: np.ndarray, u: np.ndarray) -> list[Trip]:
        """Check every rule at sim time t_s (y: NaN where Bad); the trips of this observation."""
        out = []
        for i, (r, kind, idx) in enumerate(self.rules):
            v = float(u[idx] if kind == "u" else y[idx])
            if not math.isfinite(v) and r.on_bad != "condition":
                self._since[i] = None
                if self._bad_since[i] is None:
                    self._bad_since[i] = t_s
                last = self._bad_trip[i]
                if last is None or t_s - last >= r.for_s - 1e-9:
                    self._bad_trip[i] = t_s
                    self.trips += 1
                    action = r.action if r.on_bad == "trip" else r.on_bad
                    since = self._bad_since[i]
                    out.append(Trip(r.name, action, t_s, since, v,
                                    f"rule {r.name}: {r.signal} is Bad since t = {since:g} s (no valid measurement): "
                                    f"a check that cannot be computed counts as tripped"))
                continue
            self._bad_since[i] = self._bad_trip[i] = None
            holds = (v < r.limit if r.op == "<" else v > r.limit) or not math.isfinite(v)
            if not holds:
                self._since[i] = None
                continue
            if self._since[i] is None:
                self._since[i] = t_s
            since = self._since[i]
            if t_s - since >= r.for_s - 1e-9:
                self._since[i] = t_s  # re-arm
                self.trips += 1
                out.append(Trip(r.name, r.action, t_s, since, v,
                                f"rule {r.name}: {r.signal} {r.op} {r.limit:g} for {t_s - since:g} s "
                                f"(since t = {since:g} s, now {v:.4g})"))
        return out

    def holding(self) -> dict[str, float]:
        """Rules whose condition holds now, or whose signal is Bad -> sim time it started."""
        out = {r.name: s for (r, _, _), s in zip(self.rules, self._since) if s is not None}
        out.update({r.name: s for (r, _, _), s in zip(self.rules, self._bad_since) if s is not None})
        return out


class VersionKeeper:
    """Which policy version may act, and which were rolled back (never chosen again)."""

    def __init__(self, store, current: str):
        self.store = store
        self.current: str | None = current
        self.rolled_back: list[str] = []
        self.history: list[dict] = []

    def rollback(self, t_s: float, reason: str) -> tuple[str | None, str]:
        """Roll back from the current version. Returns (new version or None, message)."""
        old = self.current
        if old is None:
            return None, "no policy version is active; the baseline controller holds"
        if old not in self.rolled_back:
            self.rolled_back.append(old)
        new = None
        if self.store is not None:
            try:
                new = self.store.previous_known_good(old, exclude=self.rolled_back)
            except ValueError:
                new = None
        self.current = new
        if new is None:
            msg = f"rolled back {old}: no earlier known-good version; the baseline controller holds ({reason})"
        else:
            msg = f"rolled back {old} -> {new} (previous known-good) because {reason}"
        self.history.append({"t_s": t_s, "from": old, "to": new, "reason": reason})
        return new, msg
