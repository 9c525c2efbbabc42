"""Threshold rules of the SoftPLC scan program: a protection relay or an operator rule.

    [[softplc.rules]]
    name = "ufls_1"                  # label in logs and the scan record
    measurement = "grid.frequency"   # a mapped signal (any table)
    below = 49.6                     # active when measurement < below (or `above = ...`)
    pickup_s = 0.3                   # the condition must hold this long first (s, the PID clock)
    reset = 49.9                     # inactive again when measurement >= reset (below-rule;
                                     # <= reset for an above-rule); default: the threshold
    latch = false                    # true: once active, stays active for the run
    outputs = ["load_53.shed", "load_54.shed"]   # mapped, writable inputs
    value = 0.2                      # written to every output while active (output unit)
    idle = 0.0                       # written while inactive

Every scan each rule writes `value` or `idle` to its outputs (a rule owns its outputs like a
PID loop owns its output). A Bad (non-finite) measurement changes nothing: the pickup timer
holds and the rule keeps its state. Under-frequency load shedding is a list of such rules with
falling thresholds (stages); an AGC is a PID loop on frequency, not a rule.
"""

from __future__ import annotations

import math

from pydantic import Field, field_validator, model_validator

from hil.scenario.config import StrictModel


class RuleConfig(StrictModel):
    name: str = Field(description="label in logs and the scan record")
    measurement: str = Field(description="mapped signal the rule reads")
    below: float | None = Field(default=None, description="active when measurement < below")
    above: float | None = Field(default=None, description="active when measurement > above")
    pickup_s: float = Field(default=0.0, ge=0, description="time the condition must hold (s)")
    reset: float | None = Field(default=None, description="release threshold (hysteresis)")
    latch: bool = Field(default=False, description="stay active once tripped")
    outputs: list[str] = Field(min_length=1, description="mapped writable inputs")
    value: float = Field(description="written while active (output unit)")
    idle: float = Field(default=0.0, description="written while inactive (output unit)")

    @field_validator("below", "above", "reset", "value", "idle")
    @classmethod
    def _finite(cls, v):
        if v is not None and not math.isfinite(v):
            raise ValueError(f"{v} is not finite")
        return v

    @model_validator(mode="after")
    def _one_threshold(self):
        if (self.below is None) == (self.above is None):
            raise ValueError("give exactly one of below / above")
        if self.reset is not None:
            if self.below is not None and self.reset < self.below:
                raise ValueError(f"reset {self.reset} must be >= below {self.below}")
            if self.above is not None and self.reset > self.above:
                raise ValueError(f"reset {self.reset} must be <= above {self.above}")
        if len(set(self.outputs)) != len(self.outputs):
            raise ValueError("outputs repeat")
        return self


class Rule:
    """One rule's state machine: `update(measurement, dt_s) -> active`."""

    def __init__(self, cfg: RuleConfig):
        self.cfg = cfg
        self.active = False
        self.timer_s = 0.0
        self.trips = 0
        low = cfg.below is not None
        thr = cfg.below if low else cfg.above
        rst = thr if cfg.reset is None else cfg.reset
        self._cond = (lambda v: v < thr) if low else (lambda v: v > thr)
        self._release = (lambda v: v >= rst) if low else (lambda v: v <= rst)

    def update(self, measurement: float, dt_s: float) -> bool:
        """Advance by dt_s with a new measurement; returns whether the rule is active."""
        if not math.isfinite(measurement):
            return self.active
        if self.active:
            if not self.cfg.latch and self._release(measurement):
                self.active = False
                self.timer_s = 0.0
            return self.active
        if self._cond(measurement):
            self.timer_s += dt_s
            if self.timer_s >= self.cfg.pickup_s - 1e-12:
                self.active = True
                self.trips += 1
        else:
            self.timer_s = 0.0
        return self.active

    def output(self) -> float:
        return self.cfg.value if self.active else self.cfg.idle
