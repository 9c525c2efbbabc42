"""The wiring of a run: one scenario -> one plant, one process image, one compiled step, one
clock, the bus, the recorder's place, the watches. `Runtime` builds these pieces in `__init__`
and nothing else; the rest of a run lives beside it:

    hil/loop/lifecycle.py   run(): configured -> running -> stopped | failed, the start and stop
                            order, the summary (hil/loop/summary.py RunSummary)
    hil/loop/children.py    the helper processes: recorder, protocol servers, policy and safety;
                            start, priority, supervision at the status tick, stop
    hil/loop/period.py      the period, stage by stage: read -> decide -> step -> publish -> record
    hil/loop/step.py        the compiled step the period calls (and every other mode)

Names are resolved to index arrays here, once; the per-step path touches arrays only. Protocol
servers, the recorder, the policy and the safety wrapper run in their own processes (the loop's
interpreter must not share its GIL with asyncio servers); they are started before the loop
raises its own priority, since children inherit SCHED_FIFO.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from hil.errors import ConfigError, PlantDiverged, RunStopped  # noqa: F401  (re-exported)
from hil.image import ProcessImage
from hil.loop import children as _children, lifecycle as _lifecycle
from hil.loop.clock import LockstepClock, RealtimeClock
from hil.loop.gc import LoopGc
from hil.loop.health import Alarms, ChildWatch, InputWatch, OutputWatches, StateBounds
from hil.loop.plant import load_correction, scenario_plant
from hil.loop.status import StatusReporter
from hil.loop.step import LoopStep
from hil.loop.summary import RunSummary, status_snapshot
from hil.recorder import Recorder, columns_for
from hil.scenario.config import SERVER_KINDS, Scenario

__all__ = ["Runtime", "RunSummary", "RunStopped", "DRIVERS"]

DRIVERS = ("plc", "fixed", "profile", "bus")


class _Profile:
    """Piecewise-constant command: value of the last point with t_point <= t."""

    def __init__(self, index: int, points: list[tuple[float, float]]):
        self.index = index
        self.times = np.array([p[0] for p in points])
        self.values = np.array([p[1] for p in points])
        self.pos = -1

    def apply(self, t_s: float, u: np.ndarray) -> None:
        while self.pos + 1 < self.times.size and self.times[self.pos + 1] <= t_s:
            self.pos += 1
            u[self.index] = self.values[self.pos]


def _record_dir(scenario: Scenario, override: str | None) -> Path:
    template = override or scenario.recording.path
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return Path(template.format(scenario=scenario.name, timestamp=stamp))


class Runtime:
    """Configure once, run once. `image` is created here unless an existing name is given."""

    _policy_handles = None  # set by _start_children; a default so any partial start can be stopped
    run_dir_note: str | None = None  # why the run moved to a fresh run directory (hil/run_dirs.py), if it did
    safety_watch = None  # hil.safety.watch.SafetyWatch once the safety process runs
    scheduling: dict | None = None  # what the loop obtained (rt.apply_loop_scheduling), set at start
    on_scheduled = None  # optional callback(scheduling, warnings), once scheduling is set (the CLI's banner)
    announce = False  # True: announce the run for `hil dashboard` (hil/live_runs.py); hil run / hil demo set it
    _live = None  # its hil.live_runs.Announcement while it runs
    hooks = None  # optional per-step hooks: pre(k, t), actuate(k, t, u_app), sense(k, t_end, y_meas)
    #               (fault injection, hil/campaign/faults.py FaultStage); None: not called

    def __init__(self, scenario: Scenario, *, lockstep: bool = False, duration_s: float | None = None,
                 record: bool | None = None, record_path: str | None = None, image_name: str | None = None,
                 start_servers: bool | None = None, start_processes: bool = True,
                 scenario_path: str | None = None):
        self.scenario = sc = scenario
        self.lockstep = lockstep
        self.scenario_path = scenario_path
        self.state = "configured"
        self.warnings: list[str] = []
        self.duration_s = float(duration_s if duration_s is not None else sc.loop.duration_s)
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError(f"duration must be a positive number of seconds, not {duration_s}")
        self.step_s = sc.loop.step_s
        self.n_steps = int(round(self.duration_s / self.step_s))

        # ---- plant (sub-steps derived from / checked against its MAX_SUBSTEP) ----
        self.plant = scenario_plant(sc)
        self.time_unit_s = self.plant.model.time_unit_s
        self.dt_plant = self.step_s / self.time_unit_s
        self.spec = spec = self.plant.spec
        self.correction = load_correction(sc.plant.residual_model, spec)
        self.initial_snapshot = self.plant.snapshot()

        # ---- inputs by driver (names -> indices once) ----
        n_in, n_out = spec.n_inputs, spec.n_outputs
        self.u_cmd = spec.nominal("inputs")
        drivers = {name: "plc" for name in spec.names("inputs")}
        self.profiles: list[_Profile] = []
        for name, inp in sc.inputs.items():
            i = spec.index("inputs", name)
            drivers[name] = inp.driver
            if inp.value is not None:
                self.u_cmd[i] = inp.value
            if inp.driver == "profile":
                self.profiles.append(_Profile(i, list(inp.profile)))
        self.drivers = drivers
        self.plc_idx = np.array([spec.index("inputs", n) for n, d in drivers.items() if d == "plc"], dtype=np.intp)
        self.u_lo, self.u_hi = spec.lows("inputs"), spec.highs("inputs")
        self.u_image = np.zeros(n_in)
        self.plant.u[:] = self.u_cmd
        self.u_app = self.plant.u  # applied inputs are the plant's input array itself
        self.x_lo, self.x_hi = spec.lows("states"), spec.highs("states")
        self.alarms = Alarms()
        self.state_bounds = StateBounds(spec, self.alarms)
        self.children = ChildWatch(self.alarms)
        self.gc = LoopGc()
        self._reporter: StatusReporter | None = None

        # ---- process image ----
        if image_name:
            self.image = ProcessImage.attach(image_name)
            self._own_image = False
        else:
            self.image = ProcessImage.create(n_in, n_out)
            self._own_image = True
        try:  # a failure from here on (e.g. the bus's run directory taken) releases the image
            self.input_watch = InputWatch(self.image, self.alarms)
            if (self.image.n_inputs, self.image.n_outputs) != (n_in, n_out):
                raise ValueError("process image does not match the plant's inputs/outputs")
            # the image starts out holding the initial commands, so PLCs read sane values
            self.image.write_inputs(np.arange(n_in), self.u_cmd)
            self.image.set_period(0.0 if lockstep else sc.loop.period_s)

            # ---- gaps (identity when not configured) ----
            self.gaps = None
            if sc.gaps is not None:
                from hil.gaps.pipeline import GapPipeline

                self.gaps = GapPipeline.build(sc.gaps, spec, self.step_s, sc.loop.seed, base_params=self.plant.p.copy())
            self.drawn: dict[str, float] = self.gaps.randomize(self.plant.p, 0) if self.gaps else {}

            # ---- the compiled step (hil/loop/step.py) over this run's arrays ----
            self.columns = columns_for(spec)
            self.shield_in_loop = sc.bus is not None and sc.safety is not None and sc.safety.placement == "loop"
            if self.shield_in_loop:
                from hil.loop.shield_bus import SOURCE_COLUMN

                self.columns.append(SOURCE_COLUMN)  # each step's shield source (written in the decide stage)
            self.loop_step = LoopStep(self.plant, self.gaps, self.correction, step_s=self.step_s, seed=sc.loop.seed,
                                 x_tol=self.state_bounds.tol, x_out=self.state_bounds.steps_out,
                                 n_columns=len(self.columns))
            np.copyto(self.loop_step.u_cmd, self.u_cmd)
            self.u_cmd, self.u_clip, self.y_meas = self.loop_step.u_cmd, self.loop_step.u_clip, self.loop_step.y_meas
            self.input_counts, self.row = self.loop_step.counts, self.loop_step.row
            self.loop_step.warm_up()
            model = self.plant.model
            self.output_watches = OutputWatches(spec, model.watches, self.alarms) if model.watches else None

            # ---- bus (policy / safety) ----
            self.bus = None
            if sc.bus is not None:
                from hil.run_dirs import pin_run_dir

                # a default run directory another user holds: a fresh private one (hil/run_dirs.py)
                pinned, self.run_dir_note = pin_run_dir(sc)
                if self.run_dir_note:
                    self.scenario = sc = pinned
                    self.warnings.append(self.run_dir_note)
                if self.shield_in_loop:  # the compiled shield decides here, the safety process supervises
                    from hil.loop.shield_bus import ShieldBusEndpoint

                    self.bus = ShieldBusEndpoint.build(sc.bus, sc, spec)
                    self.bus.attach(self.y_meas, self.u_app, self.u_cmd)
                else:
                    from hil.bus import LoopBusEndpoint

                    self.bus = LoopBusEndpoint.build(sc.bus, sc, spec)

            # ---- recording ----
            self.record = sc.recording.enabled if record is None else record
            self.record_path = _record_dir(sc, record_path) if self.record else None
            self.decimate = sc.recording.decimate
            self.recorder: Recorder | None = None

            # ---- clock ----
            if lockstep:
                self.clock = LockstepClock()
            else:
                self.clock = RealtimeClock(sc.loop.period_s, sc.loop.spin_us * 1e-6)
            want_servers = (not lockstep) if start_servers is None else start_servers
            self.start_servers = want_servers and any(sc.served(k) is not None for k in SERVER_KINDS)
            self.start_processes = start_processes
            self._children: list = []
            self._stop = False
        except BaseException:
            self.close()
            raise

    # ---- the run (hil/loop/lifecycle.py) and its children (hil/loop/children.py) ----
    def run(self, on_status: Callable[[dict], None] | None = None,
            on_started: Callable[["Runtime"], None] | None = None,
            on_stopping: Callable[["Runtime"], None] | None = None) -> RunSummary:
        """Run to the duration (or a stop request / plant failure); returns the summary.

        on_status(dict) gets a status snapshot every `loop.status_interval_s` of wall time,
        in a thread of its own (hil/loop/status.py): it may block without stalling the loop;
        on_started once the servers listen and before the loop raises its priority (the
        place to start further processes, e.g. a SoftPLC, so that they do not inherit
        SCHED_FIFO); on_stopping once the loop has stopped, before the servers do (stop
        clients there).
        """
        return _lifecycle.run(self, on_status, on_started, on_stopping)

    def request_stop(self, *_args) -> None:
        self._stop = True

    def _start_children(self) -> None:
        """Start every helper process, before this process raises its priority. If one fails to
        start, every one started so far is stopped and the (empty) recording removed before the
        exception propagates."""
        try:
            _children.start(self)
        except BaseException:
            self._abort_start()
            raise

    def _abort_start(self) -> None:
        _children.abort_start(self)

    def _stop_children(self) -> dict:
        return _children.stop(self)

    def _child_pids(self) -> list[int]:
        return _children.pids(self)

    def _raise_priority(self) -> None:
        _children.raise_priority(self)

    def _publish_initial(self) -> None:
        self.loop_step.sync_in()
        self.image.publish(self.loop_step.publish_initial(), self.u_app, 0, 0.0)

    def _loop(self, summary: RunSummary) -> None:
        """The period, stage by stage (hil/loop/period.py)."""
        from hil.loop.period import run_period

        run_period(self, summary)

    def _status_tick(self, steps: int, t_s: float) -> None:
        _children.status_tick(self, steps, t_s)

    def _recorder_lost(self, k: int, t_s: float, summary: RunSummary):
        return _children.recorder_lost(self, k, t_s, summary)

    def _status(self, steps: int) -> dict:
        return status_snapshot(self, steps)

    @property
    def clipped_inputs(self) -> int:
        return int(self.input_counts[0])

    @property
    def non_finite_inputs(self) -> int:
        return int(self.input_counts[1])

    def close(self) -> None:
        """Release the process image (the creator removes it) and a fallback run directory."""
        if self._live is not None:
            self._live.withdraw()
            self._live = None
        if self.image is not None:
            self.image.close()
            self.image = None
        if self.run_dir_note:
            from hil.run_dirs import release

            release(self.scenario.name, self.scenario.bus.ipc_dir)
            self.run_dir_note = None

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
