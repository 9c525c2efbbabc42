"""The SoftPLC scan engine: read inputs -> PID program -> write outputs, every scan.

Scan k starts at the absolute deadline t0 + k * scan_ms (wall clock, monotonic); a scan
that runs past the next deadline is an overrun: the missed deadlines are skipped (never
run in a burst) and counted.

States:
    init       not yet run: the first good read also reads back the commanded values of
               the PLC's outputs (holding registers / coils), so the loops start from them
    run        PID loops execute on fresh measurements, outputs written at scan end
    comm_loss  `comm_loss_scans` consecutive scans failed: the output image goes to
               `safe_outputs` (others hold), nothing can be written; reconnect attempts
               back off from reconnect_min_ms doubling to reconnect_max_ms
    recover    the link is back: the first `recovery_hold_scans` scans write the safe
               output image unchanged, then every loop is re-initialized bumplessly from
               it (integral preloaded so that the first output equals the held one) -> run

Bumpless start: the integral is preloaded with (held output - P term). hil's PID keeps its
integral inside the output range, so when the held output sits at a limit and the error
pushes beyond it (e.g. safe feed 0 with the measurement far below setpoint) the first
output moves by the part of the P term the integral cannot absorb; otherwise it moves by
the integral step only.

Scan log (`scan_log()`, `write_log(path)`): one row per scan: scan, t_s (wall s since
start), state, ok, scan_ms, and per loop sp.<loop>, pv.<loop> (NaN on failed scans),
out.<loop>; `stats["loops"]` maps each loop name to its measurement and output signals.

A failed scan shorter than a comm loss holds the outputs and skips the program (no fresh
data). PIDs integrate over the measured time between their executions (capped at twice
the scan period, so a stall never dumps a large integral step), in wall seconds, or in
simulated seconds (x loop.time_scale) with `pid_clock = "sim"`, so that gains tuned for
the plant keep their meaning when a scenario runs faster than real time.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field

from hil.control.pid import PID, pid_from_config
from hil.softplc.rules import Rule
from hil.softplc.io import (MAX_READ, MAX_WRITE, CommError, ModbusMaster, pick_tag,
                            plan_blocks)
from hil.tagmap.modbus import compile_map

log = logging.getLogger("hil.softplc")
MAX_LOG_ROWS = 1_000_000


@dataclass
class _Loop:
    name: str
    pid: PID
    setpoint: float
    meas_tag: object
    out_tag: object
    kp: float
    reverse: bool


@dataclass
class ScanStats:
    scans: int = 0
    good_scans: int = 0
    failed_scans: int = 0
    overruns: int = 0
    comm_errors: int = 0
    comm_losses: int = 0
    recoveries: int = 0
    connects: int = 0
    connect_failures: int = 0
    write_rejections: int = 0
    requests: int = 0
    max_scan_ms: float = 0.0
    state: str = "init"
    last_error: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d.update(self.extra)
        return d


class SoftPlc:
    """A PLC emulator for one scenario's [softplc] and [modbus] sections."""

    def __init__(self, scenario, spec=None, *, host: str | None = None, port: int | None = None):

        cfg = scenario.softplc
        if cfg is None:
            raise ValueError(f"scenario {scenario.name!r} has no [softplc] section")
        if scenario.modbus is None:
            raise ValueError(f"scenario {scenario.name!r} has no [modbus] section")
        spec = spec or scenario.plant.load().spec
        cmap = compile_map(scenario.modbus, spec, scenario)
        self.cfg = cfg
        self.period_s = cfg.scan_ms / 1000.0
        # PID time base: wall seconds, or simulated seconds when the plant runs time_scale x faster
        self.dt_scale = scenario.loop.time_scale if cfg.pid_clock == "sim" else 1.0
        self.loops: list[_Loop] = []
        for lp in cfg.loops:
            pid = pid_from_config(lp, spec.quantity("inputs", lp.output))
            self.loops.append(_Loop(lp.name, pid, lp.setpoint, pick_tag(cmap, lp.measurement, False),
                                    pick_tag(cmap, lp.output, True), lp.kp, lp.reverse))
        # threshold rules: (rule, measurement tag, output tags)
        self.rules = [(Rule(r), pick_tag(cmap, r.measurement, False), [pick_tag(cmap, o, True) for o in r.outputs])
                      for r in cfg.rules]
        self.fixed = {pick_tag(cmap, n, True): v for n, v in cfg.outputs.items()}
        self.safe = {pick_tag(cmap, n, True): v for n, v in cfg.safe_outputs.items()}
        out_tags = [lp.out_tag for lp in self.loops] + [t for _, _, ts in self.rules for t in ts] + list(self.fixed)
        meas_tags = list(dict.fromkeys([lp.meas_tag for lp in self.loops] + [m for _, m, _ in self.rules]))
        self.read_blocks = plan_blocks(meas_tags, MAX_READ)
        self.readback_blocks = plan_blocks(out_tags, MAX_READ)
        self.write_blocks = plan_blocks(out_tags, MAX_WRITE)
        self.image: dict = dict(self.fixed)  # output image: tag -> value (plant units)
        for rule, _, tags in self.rules:  # a rule's outputs start idle
            self.image.update({t: rule.output() for t in tags})
        self._jitter = random.Random(scenario.loop.seed)
        self.master = ModbusMaster(host or cfg.host or cmap.host, port or cfg.port or cmap.port,
                                   cmap.unit_id if cfg.unit_id is None else cfg.unit_id,
                                   cfg.timeout_ms / 1000.0)
        self.stats = ScanStats()
        self.state = "init"
        self.fail_streak = 0
        self.hold_left = 0
        self.backoff_s = cfg.reconnect_min_ms / 1000.0
        self.next_connect = 0.0
        self.last_exec: float | None = None
        self.meas: dict = {}
        self.columns = ["scan", "t_s", "state", "ok", "scan_ms"] + [
            f"{k}.{lp.name}" for lp in self.loops for k in ("sp", "pv", "out")] + [
            f"{k}.{r.cfg.name}" for r, _, _ in self.rules for k in ("pv", "active")]
        self.rows: list[tuple] = []
        self._t0 = time.monotonic()

    # ---- one scan ----
    def scan(self, now: float) -> bool:
        """Run one scan at monotonic time `now` (s); True if it exchanged data."""
        t_start = time.monotonic()
        self.stats.scans += 1
        ok = False
        try:
            self._ensure_connected(now)
            values = self.master.read(self.read_blocks)
            if self.state == "init":
                self.image.update({t: v for t, v in self.master.read(self.readback_blocks).items()
                                   if t not in self.fixed})
            self.meas = values
            self._on_link_good()
            self._program(values, t_start)
            for rej in self.master.write(self.write_blocks, self.image):
                self.stats.write_rejections += 1
                self.stats.last_error = str(rej)
            ok = True
        except CommError as exc:
            self._on_link_bad(str(exc), now)
        self.stats.good_scans += ok
        self.stats.failed_scans += not ok
        self.stats.requests = self.master.requests
        dur_ms = (time.monotonic() - t_start) * 1000.0
        self.stats.max_scan_ms = max(self.stats.max_scan_ms, dur_ms)
        self.stats.state = self.state
        self._log_row(ok, dur_ms)
        return ok

    def _ensure_connected(self, now: float) -> None:
        if self.master.connected:
            return
        if now < self.next_connect:
            raise CommError("not connected (waiting to reconnect)")
        if not self.master.connect():
            self.stats.connect_failures += 1
            self.next_connect = now + self.backoff_s
            self.backoff_s = min(2 * self.backoff_s, self.cfg.reconnect_max_ms / 1000.0)
            raise CommError("connect failed")
        self.stats.connects += 1
        self.backoff_s = self.cfg.reconnect_min_ms / 1000.0

    def _on_link_good(self) -> None:
        self.fail_streak = 0
        if self.state == "comm_loss":
            self.state = "recover"
            self.hold_left = self.cfg.recovery_hold_scans
            self.stats.recoveries += 1
            log.warning("softplc: communication restored; holding safe outputs for %d scan(s)",
                        self.hold_left)

    def _on_link_bad(self, reason: str, now: float) -> None:
        self.stats.comm_errors += 1
        self.stats.last_error = reason
        self.fail_streak += 1
        if self.state != "comm_loss" and self.fail_streak >= self.cfg.comm_loss_scans:
            self.state = "comm_loss"
            self.stats.comm_losses += 1
            self.image.update(self.safe)
            self.last_exec = None
            log.warning("softplc: communication lost after %d failed scans (%s); outputs to safe values",
                        self.fail_streak, reason)

    def _program(self, values: dict, now: float) -> None:
        if self.state == "recover":
            if self.hold_left > 0:
                self.hold_left -= 1
                return
            self._reinit(values)
            self.state = "run"
        elif self.state == "init":
            self._reinit(values)
            self.state = "run"
        dt = self.period_s if self.last_exec is None else min(now - self.last_exec, 2 * self.period_s)
        self.last_exec = now
        for lp in self.loops:
            self.image[lp.out_tag] = lp.pid.update(lp.setpoint, values[lp.meas_tag], dt * self.dt_scale)
        for rule, meas, tags in self.rules:
            was = rule.active
            rule.update(values[meas], dt * self.dt_scale)
            if rule.active != was:
                log.warning("softplc: rule %s %s (%s = %g)", rule.cfg.name, "active" if rule.active else "released",
                            meas.signal, values[meas])
            for t in tags:
                self.image[t] = rule.output()

    def _reinit(self, values: dict) -> None:
        """Bumpless (re)start: preload each integral so the next output equals the held one."""
        for lp in self.loops:
            pv = values[lp.meas_tag]
            u = self.image.get(lp.out_tag, lp.pid.out_min if math.isfinite(lp.pid.out_min) else 0.0)
            if not math.isfinite(u):
                u = min(max(0.0, lp.pid.out_min), lp.pid.out_max)
            e = (lp.setpoint - pv) * (-1.0 if lp.reverse else 1.0)
            p = lp.kp * e if math.isfinite(pv) else 0.0
            lp.pid.reset(output=u - p, measurement=pv if math.isfinite(pv) else None)
            self.image[lp.out_tag] = u
        self.image.update(self.fixed)  # manual outputs return to their values
        self.last_exec = None

    def _log_row(self, ok: bool, dur_ms: float) -> None:
        if len(self.rows) >= MAX_LOG_ROWS:
            return
        row = [self.stats.scans - 1, time.monotonic() - self._t0, self.state, ok, dur_ms]
        for lp in self.loops:
            pv = self.meas.get(lp.meas_tag, math.nan) if ok else math.nan
            row += [lp.setpoint, pv, self.image.get(lp.out_tag, math.nan)]
        for rule, meas, _ in self.rules:
            row += [self.meas.get(meas, math.nan) if ok else math.nan, int(rule.active)]
        self.rows.append(tuple(row))

    # ---- the cycle ----
    def run(self, duration_s: float | None = None, stop=None, on_scan=None) -> dict:
        """Scan on absolute deadlines until `duration_s` (wall s) or `stop` is set."""
        self._t0 = t0 = time.monotonic()
        self.stats.extra["t0_monotonic"] = t0  # scan log t_s = monotonic - this (CLOCK_MONOTONIC is system-wide)
        k = 0
        try:
            while True:
                now = time.monotonic()
                if stop is not None and stop.is_set():
                    break
                if duration_s is not None and now - t0 >= duration_s:
                    break
                self.scan(now)
                if on_scan is not None:
                    on_scan(self)
                k += 1
                after = time.monotonic()
                behind = int((after - t0) / self.period_s) - k + 1
                if behind > 0:  # overrun: skip the missed deadlines, never burst
                    self.stats.overruns += behind
                    k += behind
                delay = t0 + k * self.period_s - after
                if self.cfg.scan_jitter_ms > 0:  # the SCADA clock's jitter: start late by U(0, jitter)
                    delay += self._jitter.uniform(0.0, self.cfg.scan_jitter_ms / 1000.0)
                if duration_s is not None:
                    delay = min(delay, t0 + duration_s - after)
                _sleep(delay, stop)
        finally:
            self.master.close()
        self.stats.extra["wall_s"] = time.monotonic() - t0
        self.stats.extra["loops"] = {
            lp.name: {"measurement": lp.meas_tag.signal, "output": lp.out_tag.signal, "setpoint": lp.setpoint}
            for lp in self.loops}
        self.stats.extra["rules"] = {
            r.cfg.name: {"measurement": m.signal, "outputs": [t.signal for t in ts], "active": r.active,
                         "trips": r.trips} for r, m, ts in self.rules}
        return self.stats.as_dict()

    def scan_log(self):
        """The scan log as a pandas DataFrame (columns: see self.columns)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=self.columns)

    def write_log(self, path) -> str:
        """Write the scan log: Parquet for .parquet, CSV otherwise; returns the path."""
        from pathlib import Path

        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        df = self.scan_log()
        if p.suffix == ".parquet":
            df.to_parquet(p, index=False)
        else:
            df.to_csv(p, index=False)
        return str(p)


def _sleep(delay_s: float, stop) -> None:
    """Sleep until the deadline, waking early if `stop` (an Event) is set."""
    if delay_s <= 0:
        return
    if stop is not None and hasattr(stop, "wait"):
        stop.wait(delay_s)
    else:
        time.sleep(delay_s)
