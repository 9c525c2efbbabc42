"""The [softplc] section: a PLC's scan cycle, its PID loops and its safe outputs.

    [softplc]
    scan_ms = 100              # scan period (wall ms), on absolute deadlines
    scan_jitter_ms = 0         # each scan starts up to this much after its deadline
                               # (uniform, seeded by loop.seed): a SCADA clock with jitter
    comm_loss_scans = 3        # consecutive failed scans before "communication lost"
    timeout_ms = 100           # per Modbus request
    reconnect_min_ms = 100     # reconnect back-off: doubles from min to max
    reconnect_max_ms = 2000
    recovery_hold_scans = 1    # scans that write the safe outputs after recovery
    pid_clock = "wall"         # PID dt in wall s (as a real PLC); "sim": x loop.time_scale
    record = "runs/softplc.csv"   # optional scan log (.csv or .parquet)
    # host, port, unit_id: default to [modbus]'s

    [[softplc.loops]]
    name = "level"
    measurement = "level"      # a mapped signal (any table)
    output = "inflow"          # a mapped, writable input (holding register or coil)
    setpoint = 50.0            # measurement unit
    kp = 0.5                   # output unit per measurement unit
    ki = 0.2                   # per (measurement unit * s)
    kd = 0.0                   # * s
    out_min = 0.0              # default: the output's physical bounds
    out_max = 20.0
    reverse = false            # true: output rises when the measurement is above setpoint

    [[softplc.rules]]          # threshold rules (relays, load shedding stages): rules.py
    name = "ufls_1"
    measurement = "grid.frequency"
    below = 49.6
    pickup_s = 0.3
    outputs = ["load_53.shed"]
    value = 0.2

    [softplc.outputs]          # fixed (manual) outputs written every scan
    pump = 1.0
    [softplc.safe_outputs]     # written when communication returns after a loss
    inflow = 0.0

The PLC writes every loop output and every fixed output at the end of each scan; on
communication loss its output image goes to `safe_outputs` (outputs without one hold
their last value), and the first `recovery_hold_scans` scans after the link returns
write that image before the loops resume bumplessly from it.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from hil.scenario.config import StrictModel, outside_bounds
from hil.softplc.rules import RuleConfig


class PidLoopConfig(StrictModel):
    name: str = Field(description="label in logs and the scan record")
    measurement: str = Field(description="mapped signal the loop reads")
    output: str = Field(description="mapped writable input the loop drives")
    setpoint: float = Field(description="measurement unit")
    kp: float = Field(description="output unit per measurement unit")
    ki: float = Field(default=0.0, ge=0, description="output unit per (measurement unit * s)")
    kd: float = Field(default=0.0, ge=0, description="output unit * s per measurement unit")
    td_filter_s: float = Field(default=0.0, ge=0, description="derivative filter time constant (s)")
    out_min: float | None = Field(default=None, description="default: output's low bound")
    out_max: float | None = Field(default=None, description="default: output's high bound")
    bias: float = Field(default=0.0, description="output unit")
    reverse: bool = Field(default=False, description="reverse acting (e.g. cooling)")

    @field_validator("setpoint", "kp", "ki", "kd", "td_filter_s", "out_min", "out_max", "bias")
    @classmethod
    def _finite(cls, v):
        if v is not None and not math.isfinite(v):
            raise ValueError(f"{v} is not finite")
        return v

    @model_validator(mode="after")
    def _limits(self):
        if self.out_min is not None and self.out_max is not None and self.out_min >= self.out_max:
            raise ValueError(f"out_min {self.out_min} must be below out_max {self.out_max}")
        return self


class SoftPlcSection(StrictModel):
    """The [softplc] section (validated against [modbus] and the plant spec)."""

    host: str | None = Field(default=None, description="server host; default [modbus].host")
    port: int | None = Field(default=None, ge=1, le=65535, description="default [modbus].port")
    unit_id: int | None = Field(default=None, ge=0, le=255,
                                validation_alias=AliasChoices("unit_id", "device_id"))
    scan_ms: float = Field(default=100.0, ge=5.0, le=60_000.0, description="scan period (ms)")
    scan_jitter_ms: float = Field(default=0.0, ge=0.0, le=60_000.0,
                                  description="uniform delay of each scan after its deadline (ms)")
    comm_loss_scans: int = Field(default=3, ge=1, le=1000)
    timeout_ms: float = Field(default=100.0, gt=0, le=60_000.0, description="per request (ms)")
    reconnect_min_ms: float = Field(default=100.0, gt=0, le=600_000.0)
    reconnect_max_ms: float = Field(default=2000.0, gt=0, le=600_000.0)
    recovery_hold_scans: int = Field(default=1, ge=0, le=1000)
    pid_clock: Literal["wall", "sim"] = Field(
        default="wall", description="time base of the PID gains: wall s (a real PLC) or simulated s")
    record: str | None = Field(default=None, description="scan log path, .csv or .parquet")
    loops: list[PidLoopConfig] = Field(default_factory=list)
    rules: list[RuleConfig] = Field(default_factory=list)
    outputs: dict[str, float] = Field(default_factory=dict, description="fixed outputs, plant units")
    safe_outputs: dict[str, float] = Field(default_factory=dict, description="plant units")

    @field_validator("outputs", "safe_outputs")
    @classmethod
    def _finite_values(cls, v: dict) -> dict:
        for k, x in v.items():
            if not math.isfinite(x):
                raise ValueError(f"{k} = {x} is not finite")
        return v

    @model_validator(mode="after")
    def _backoff(self):
        if self.reconnect_min_ms > self.reconnect_max_ms:
            raise ValueError("reconnect_min_ms must not exceed reconnect_max_ms")
        if self.scan_jitter_ms >= self.scan_ms:
            raise ValueError(f"scan_jitter_ms {self.scan_jitter_ms} must be below scan_ms {self.scan_ms}")
        return self

    def validate_against(self, spec, scenario) -> list[tuple[str, str]]:
        """The PLC can only use what [modbus] maps; outputs must be writable there."""
        problems: list[tuple[str, str]] = []
        mb = getattr(scenario, "modbus", None)
        if mb is None:
            return [("softplc", "needs a [modbus] section: the PLC only sees mapped signals")]
        from hil.tagmap.modbus import effective_writable, signal_kind

        readable: set[str] = set()
        writable: set[str] = set()
        for _, e in mb.entries(spec, []):  # single entries and [[modbus.blocks]] elements
            kind = signal_kind(spec, e.signal)
            if kind is None:
                continue  # reported by [modbus]
            readable.add(e.signal)
            if effective_writable(e, kind, scenario) and kind == "input":
                writable.add(e.signal)
        written: dict[str, str] = {}

        def check_output(path: str, name: str) -> object:
            if name not in writable:
                why = ("is not mapped in [modbus]" if name not in readable
                       else "is mapped read-only in [modbus] (needs a writable holding register or coil)")
                problems.append((path, f"{name!r} {why}"))
                return None
            return spec.quantity("inputs", name)

        for i, lp in enumerate(self.loops):
            key = f"softplc.loops[{i}]"
            if lp.measurement not in readable:
                problems.append((f"{key}.measurement", f"{lp.measurement!r} is not mapped in [modbus]"))
            else:
                kind = signal_kind(spec, lp.measurement)
                qm = spec.quantity(kind + "s", lp.measurement)
                if not qm.low <= lp.setpoint <= qm.high:
                    problems.append((f"{key}.setpoint", f"{lp.setpoint} {qm.unit} is outside "
                                     f"{lp.measurement}'s bounds [{qm.low}, {qm.high}] {qm.unit}"))
            q = check_output(f"{key}.output", lp.output)
            if lp.output in written:
                problems.append((f"{key}.output", f"{lp.output!r} is already driven by {written[lp.output]}"))
            written[lp.output] = key
            if q is not None:
                for name in ("out_min", "out_max"):
                    v = getattr(lp, name)
                    if v is not None and not q.low <= v <= q.high:
                        problems.append((f"{key}.{name}", f"{v} {q.unit} is outside {q.name}'s "
                                         f"bounds [{q.low}, {q.high}] {q.unit}"))
        for i, rule in enumerate(self.rules):
            key = f"softplc.rules[{i}]"
            if rule.measurement not in readable:
                problems.append((f"{key}.measurement", f"{rule.measurement!r} is not mapped in [modbus]"))
            for j, out in enumerate(rule.outputs):
                q = check_output(f"{key}.outputs[{j}]", out)
                if out in written:
                    problems.append((f"{key}.outputs[{j}]", f"{out!r} is already driven by {written[out]}"))
                written[out] = key
                if q is not None:
                    for name in ("value", "idle"):
                        if reason := outside_bounds(getattr(rule, name), q):
                            problems.append((f"{key}.{name}", f"{out}: {reason}"))
        names = [lp.name for lp in self.loops] + [r.name for r in self.rules]
        for i, n in enumerate(names):
            if names.index(n) != i:
                where = f"loops[{i}]" if i < len(self.loops) else f"rules[{i - len(self.loops)}]"
                problems.append((f"softplc.{where}.name", f"duplicate loop name {n!r} (loops and rules share names)"))
        for table in ("outputs", "safe_outputs"):
            for name, v in getattr(self, table).items():
                path = f"softplc.{table}.{name}"
                if table == "outputs" and name in written:
                    problems.append((path, f"{name!r} is already driven by {written[name]}"))
                    continue
                q = check_output(path, name)
                if q is not None and (reason := outside_bounds(v, q)):
                    problems.append((path, reason))
        owned = set(written) | set(self.outputs)
        for name in self.safe_outputs:
            if name in writable and name not in owned:
                problems.append((f"softplc.safe_outputs.{name}",
                                 f"{name!r} is neither a loop output nor a fixed output of the PLC"))
        return problems
