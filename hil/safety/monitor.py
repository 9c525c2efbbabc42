"""Monitor rules over key signals, and rollback to the previous known-good policy version.

A rule (`dissolved_oxygen < 20 for 30 s`) trips when its condition has held continuously for
`for_s` of simulated time, measured on the observations' sim time (so a rule behaves the same
in real time and lockstep). After a trip the rule re-arms: if the condition still holds
another `for_s` later, it trips again (a second rollback goes one known-good version further
back; when none is left the baseline controller holds). A non-finite signal counts as the
condition holding (a dead sensor is not a healthy one).
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
        self.trips = 0

    def update(self, t_s: float, y: np.ndarray, u: np.ndarray) -> list[Trip]:
        """Check every rule at sim time t_s; the trips of this observation."""
        out = []
        for i, (r, kind, idx) in enumerate(self.rules):
            v = float(u[idx] if kind == "u" else y[idx])
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
        """Rules whose condition holds now -> sim time it started."""
        return {r.name: s for (r, _, _), s in zip(self.rules, self._since) if s is not None}


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
