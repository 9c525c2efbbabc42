"""Discrete PID controller, as a PLC's PID block computes it.

One reusable piece: the SoftPLC runs it in its scan cycle, the safety wrapper runs the same
class as its fallback controller, so the fallback is the controller validated on its own.

Form (positional, derivative on measurement, first-order filtered derivative):

    e        = setpoint - measurement            (direct acting: output rises when e > 0)
    P        = kp * e
    I       += ki * e * dt                        (clamped: it moves the output up to a
                                                   limit, never past it in the direction
                                                   of e; I alone stays within the range)
    D        = -kd * d(measurement)/dt, low-pass filtered with time constant td_filter_s
    u        = clip(bias + P + I + D, out_min, out_max)

Gains are in output units per measurement unit (kp), per (unit*s) (ki) and *s (kd); dt in
seconds. `reverse=True` flips the sign of the error (e.g. cooling: more coolant when the
temperature is above its setpoint).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class PID:
    kp: float
    ki: float = 0.0
    kd: float = 0.0
    out_min: float = -math.inf
    out_max: float = math.inf
    bias: float = 0.0
    reverse: bool = False
    td_filter_s: float = 0.0
    integral: float = field(default=0.0)
    _last_meas: float | None = field(default=None, repr=False)
    _d_filtered: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if not self.out_min <= self.out_max:
            raise ValueError(f"PID limits inverted: out_min {self.out_min} > out_max {self.out_max}")
        for name in ("kp", "ki", "kd", "td_filter_s"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"PID {name} must be finite")

    def reset(self, output: float | None = None, measurement: float | None = None) -> None:
        """Clear state; with `output`, preload the integral for a bumpless start there."""
        self._last_meas = measurement
        self._d_filtered = 0.0
        self.integral = 0.0 if output is None else output - self.bias

    def update(self, setpoint: float, measurement: float, dt: float) -> float:
        """One controller execution after dt seconds; returns the limited output."""
        if dt <= 0 or not math.isfinite(measurement) or not math.isfinite(setpoint):
            # A PLC block holds its output on a bad input; so do we.
            return self._clip(self.bias + self.integral)
        e = setpoint - measurement
        if self.reverse:
            e = -e
        p = self.kp * e
        d = 0.0
        if self.kd and self._last_meas is not None:
            raw = -(measurement - self._last_meas) / dt
            if self.reverse:
                raw = -raw
            if self.td_filter_s > 0:
                a = dt / (self.td_filter_s + dt)
                self._d_filtered += a * (raw - self._d_filtered)
            else:
                self._d_filtered = raw
            d = self.kd * self._d_filtered
        self._last_meas = measurement
        candidate = self.integral + self.ki * e * dt
        # Anti-windup by clamping: the integral may move until the output reaches a limit,
        # never beyond it in the direction the error pushes (it still leaves the limit at
        # once when the error changes sign).
        rest = self.bias + p + d
        if e > 0 and rest + candidate > self.out_max:
            candidate = max(self.integral, self.out_max - rest)
        elif e < 0 and rest + candidate < self.out_min:
            candidate = min(self.integral, self.out_min - rest)
        self.integral = candidate
        # ... and never let the integral alone hold the output beyond its range.
        self.integral = min(max(self.integral, self.out_min - self.bias), self.out_max - self.bias)
        return self._clip(self.bias + p + self.integral + d)

    def error(self, setpoint: float, measurement: float) -> float:
        """The error as this block sees it (sign flipped when reverse acting)."""
        e = setpoint - measurement
        return -e if self.reverse else e

    def evaluate(self, setpoint: float, measurement: float) -> float:
        """Output at this measurement without advancing time: no integration, no derivative
        (the first execution, when no dt is known). Remembers the measurement for the next D."""
        if not (math.isfinite(measurement) and math.isfinite(setpoint)):
            return self._clip(self.bias + self.integral)
        self._last_meas = measurement
        return self._clip(self.bias + self.kp * self.error(setpoint, measurement) + self.integral)

    def track(self, output: float, e: float) -> None:
        """Bumpless transfer: set the integral so that the output at error `e` (as returned by
        `error`) equals `output`, within the limits. e not finite: the P term is taken as 0."""
        p = self.kp * e if math.isfinite(e) else 0.0
        self.integral = min(max(output - self.bias - p, self.out_min - self.bias), self.out_max - self.bias)

    def hold(self) -> None:
        """The measurement is bad: nothing integrates while it lasts (no windup on a frozen
        value) and the derivative restarts at the next good measurement (no kick across the gap)."""
        self._last_meas = None
        self._d_filtered = 0.0

    def _clip(self, u: float) -> float:
        return min(max(u, self.out_min), self.out_max)


def pid_from_config(loop, output) -> PID:
    """A PID from a loop's config (kp, ki, kd, bias, reverse, td_filter_s, out_min, out_max)
    whose missing output limits default to the physical bounds of `output` (a Quantity)."""
    return PID(kp=loop.kp, ki=loop.ki, kd=loop.kd, bias=loop.bias, reverse=loop.reverse,
               td_filter_s=loop.td_filter_s,
               out_min=output.low if loop.out_min is None else loop.out_min,
               out_max=output.high if loop.out_max is None else loop.out_max)
