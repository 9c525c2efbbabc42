"""What a run reports: the run summary (`hil run --json`; filled when the loop stops, by
hil/loop/lifecycle.py `finish`) and the status snapshot of the status tick. Reads a Runtime's
parts; starts and stops nothing."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunSummary:
    """What a run did; `as_dict()` is the CLI's --json object."""

    scenario: str
    mode: str  # "realtime" | "lockstep"
    state: str  # "stopped" | "failed"
    stop_reason: str
    steps: int = 0
    sim_time_s: float = 0.0
    wall_time_s: float = 0.0
    period_s: float = 0.0
    overruns: int = 0
    late_steps: int = 0
    lateness_us: dict = field(default_factory=dict)
    spin_cpu_fraction: float = 0.0
    clipped_inputs: int = 0
    non_finite_inputs: int = 0
    torn_input_reads: int = 0
    input_writes: int = 0
    dropped_rows: int = 0
    record_path: str | None = None
    warnings: list = field(default_factory=list)
    error: str | None = None
    exit_code: int = 0  # hil run's exit code (hil/loop/health.py EXIT_*)
    alarms: list = field(default_factory=list)  # every alarm raised: kind, source, message, step, sim_time_s
    state_out_of_bounds: dict = field(default_factory=dict)  # state name -> steps outside its spec bounds
    stale_input_steps: int = 0  # steps run on held inputs because a live writer kept the image mid-write
    input_repairs: int = 0  # writes rolled back after their writer died mid-write
    dead_processes: dict = field(default_factory=dict)  # helper process -> how it died
    substeps: int = 0  # plant sub-steps per loop step
    gc: dict = field(default_factory=dict)  # collections at status ticks and their pauses (us)
    status_lines_dropped: int = 0  # status snapshots not shown (the status sink was busy)
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d.update(self.extra)
        return d


def status_snapshot(rt, steps: int) -> dict:
    """The status snapshot of Runtime `rt` after `steps` steps (a fresh dict: the status thread
    owns it). Times in s, lateness in us."""
    lat = rt.clock.lateness
    rt.state_bounds.status(rt.plant.x)
    return {
        "steps": steps,
        "sim_time_s": steps * rt.step_s,
        "wall_time_s": rt.clock.elapsed_s(),
        "lateness_p99_us": lat.percentile_ns(99) * 1e-3,
        "overruns": rt.clock.overruns,
        "clipped_inputs": rt.clipped_inputs,
        "input_writes": int(rt.image.counters()["input_writes"]),
        "alarms": rt.alarms.active(),
        "late_steps": rt.clock.late_steps,
        "loop_state": rt.state,
        **({"shield": rt.bus.shield_status()} if rt.shield_in_loop else {}),
        **({"lateness_counts": lat.counts.copy()} if rt._live is not None else {}),
    }

