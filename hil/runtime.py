"""The loop and its wiring: one scenario, one plant, one process image, one clock.

Mode state machine (after FMI 3): configured -> running -> stopped | failed.

Every step k (simulated time t = k * step_s, plant units inside the plant):

    clock.wait()                          real time: absolute deadline; lockstep: returns
    read commanded inputs                 image (driver "plc"), profiles/fixed, bus ("bus");
                                          inputs stuck mid-write: repaired or alarmed (health)
    clip to the spec's physical bounds    clipped commands counted; non-finite ones held
    gaps.actuate(t, u_cmd -> u_applied)   actuator gap + actuation delay
    plant.step(dt)                        Numba kernel, zero-order hold on u, sub-steps
                                          within the plant's MAX_SUBSTEP
    check the state                       non-finite: diverged; outside spec bounds: counted
    plant outputs -> gaps.sense(t + dt)   sensor gap + observation delay
    image.publish(measured, applied)      what PLCs and SCADA read
    bus.after_step(...)                   observation for the policy
    recorder.append(row)                  one row copy into the ring

Names are resolved to index arrays in `__init__`; the per-step path touches arrays only,
through allocation-free kernels (hil/loop/kernels.py). The garbage collector is frozen and
disabled while the loop runs and collected at the status tick (hil/loop/gc.py). The
status tick (every `loop.status_interval_s` of wall time) checks the helper processes
(hil/loop/health.py) and hands a snapshot to a thread that shows it (hil/loop/status.py): nothing on
the status path can block the loop.
Protocol servers, the recorder, the policy and the safety wrapper run in their own
processes (the loop's interpreter must not share its GIL with asyncio servers); they are
started before the loop raises its own priority, since children inherit SCHED_FIFO.
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from hil.loop import rt
from hil.loop.clock import LockstepClock, RealtimeClock
from hil.scenario.config import SERVER_KINDS, Scenario
from hil.errors import ConfigError, PlantDiverged, RunStopped  # noqa: F401  (RunStopped re-exported)
from hil.loop.gc import LoopGc
from hil.loop.health import (EXIT_DIVERGED, EXIT_PROCESS_DIED, EXIT_SAFETY_LOST, EXIT_STATE_OUT_OF_BOUNDS, Alarms,
                        ChildWatch, InputWatch, OutputWatches, StateBounds)
from hil.image import ProcessImage
from hil.loop.plant import load_correction, scenario_plant
from hil.loop.step import LoopStep
from hil.loop.kernels import take_into
from hil.recorder import Recorder, RecorderDied, column_dtypes, columns_for
from hil.loop.status import StatusReporter

DRIVERS = ("plc", "fixed", "profile", "bus")


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


def _both(first, second):
    """A status callback calling `first` (may be None) then `second`."""
    if first is None:
        return second

    def call(status: dict) -> None:
        try:
            first(status)
        finally:
            second(status)

    return call


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

    # ---- life cycle ----
    def _start_children(self) -> None:
        """Start every helper process, before this process raises its priority.

        If one fails to start, every one started so far is stopped and the (empty)
        recording removed before the exception propagates."""
        try:
            self._start_children_now()
        except BaseException:
            self._abort_start()
            raise

    def _abort_start(self) -> None:
        """Undo a partial start: stop the children started so far, drop the recording (no rows yet)."""
        from hil.startup import discard_recording

        try:
            self._stop_children()
        finally:
            rec, self.recorder = self.recorder, None
            if rec is not None:
                rec.close(timeout_s=10.0, state="failed")
                discard_recording(rec.directory)

    def _start_children_now(self) -> None:
        if self.record:
            meta = {
                "scenario": self.scenario.model_dump(mode="json"),
                "plant": self.spec.name,
                "step_s": self.step_s,
                "mode": "lockstep" if self.lockstep else "realtime",
                "units": {f"{k}.{q.name}": q.unit for k, qs in (("x", self.spec.states), ("cmd", self.spec.inputs),
                          ("y", self.spec.outputs), ("z", self.spec.algebraic), ("d", self.spec.discrete)) for q in qs},
                "groups": {f"{g.kind}.{g.name}": [g.start, g.size, g.unit] for g in self.spec.groups},
                "randomized": self.drawn,
                "started_utc": datetime.now(timezone.utc).isoformat(),
            }
            self.recorder = Recorder(self.record_path, self.columns, meta, dtypes=self._column_dtypes(),
                                     flush_interval_s=self.scenario.recording.flush_interval_s,
                                     block_when_full=self.lockstep)
        if self.start_servers and self.start_processes:
            from adapters.process import start_servers

            log = str(Path(self.record_path) / "_modbus_requests.jsonl") if self.record else None
            shared = str(Path(self.record_path) / "_dual_writable.txt") if self.record else None
            self._children += start_servers(self.scenario, self.image.name, modbus_request_log=log,
                                            shared_list=shared, spec=self.spec)
        for server in self._children:
            self.children.add(f"{server.kind} server", server.process, self.scenario.loop.require_servers)
        if self.recorder is not None:
            self.children.add("recorder", self.recorder.process, self.scenario.loop.require_recorder)
        if self.scenario.policy is not None and self.start_processes and getattr(self.scenario.policy, "launch", False):
            from hil.safety import launch

            # decision log and status files where [safety].decision_log says
            self._policy_handles = launch.start(self.scenario, self.scenario_path or "",
                                                key=self.bus.key if self.bus is not None else None)
            from hil.safety.watch import SafetyWatch

            sec = self.scenario.safety
            self.safety_watch = SafetyWatch(self._policy_handles, self.alarms, required=sec.required, hang_s=sec.hang_s,
                                            restart=sec.restart, respawn=launch.respawn_safety)
        else:
            self._policy_handles = None

    def _column_dtypes(self) -> dict[str, str]:
        dtypes = column_dtypes(self.spec)
        if self.shield_in_loop:
            from hil.loop.shield_bus import SOURCE_COLUMN

            dtypes[SOURCE_COLUMN] = "int8"
        return dtypes

    def _stop_children(self) -> dict:
        """Stop helper processes; returns the safety wrapper's and the servers' final counters."""
        extra: dict = {}
        if self._policy_handles is not None:
            from hil.safety import launch

            handles = self._policy_handles
            launch.stop(handles)
            extra["policy"] = launch.supervision_summary(handles)  # deaths, hangs, restarts, alarms
            self._policy_handles = None
            try:
                extra["safety"] = json.loads(Path(handles.status_path).read_text())["counters"]
            except (OSError, ValueError, KeyError):
                extra["safety"] = {"error": "safety wrapper left no status"}
        if self._children:
            from adapters.process import stop_servers

            extra.update(stop_servers(self._children))  # final counters: "modbus", "opcua"
            self._children = []
        return extra

    def _raise_priority(self) -> None:
        """Real time: SCHED_FIFO, pinning, mlock as loop.priority / loop.cpu say (rt.apply_loop_scheduling);
        `self.scheduling` is what was obtained. Under SCHED_FIFO the spin stays under half a period,
        so the loop sleeps and its CPU's other work runs."""
        if self.lockstep:
            self.scheduling = {**rt.current_scheduling(), "lockstep": True}
        else:
            loop = self.scenario.loop
            self.scheduling, warns = rt.apply_loop_scheduling(loop.priority, loop.cpu, self._child_pids())
            self.warnings += warns
            if self.scheduling["policy"] != "SCHED_OTHER" and self.clock.spin_ns > self.clock.period_ns // 2:
                self.clock.spin_ns = self.clock.period_ns // 2
                self.warnings.append(f"loop.spin_us limited to {self.clock.spin_ns / 1e3:g} us (half the period) "
                                     "under SCHED_FIFO, so that the loop never holds its CPU for a whole period")
        if getattr(self, "on_scheduled", None) is not None:
            self.on_scheduled(self.scheduling, list(self.warnings))
        if self._policy_handles is not None and self.scheduling.get("policy") == "SCHED_FIFO":
            from hil.safety.launch import set_priority  # on the control path: just below the loop

            self.warnings += set_priority(self._policy_handles, max(1, int(self.scheduling["priority"]) - 1))
        if self._policy_handles is not None and len(self.scheduling.get("cpus") or ()) == 1:
            self._policy_handles.loop_cpu = int(self.scheduling["cpus"][0])  # a restarted policy avoids it

    def _child_pids(self) -> list[int]:
        pids = [s.process.pid for s in self._children]
        if self.recorder is not None:
            pids.append(self.recorder.pid)
        if self._policy_handles is not None:
            pids += [self._policy_handles.policy.pid, self._policy_handles.safety.pid]
        return [p for p in pids if p]

    def request_stop(self, *_args) -> None:
        self._stop = True

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
        if self.state != "configured":
            raise RuntimeError(f"runtime is {self.state}; a Runtime runs once")
        old_handlers = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                old_handlers[sig] = signal.signal(sig, self.request_stop)
            except ValueError:  # not the main thread
                pass
        summary = RunSummary(self.scenario.name, "lockstep" if self.lockstep else "realtime", "stopped",
                             "duration reached", period_s=0.0 if self.lockstep else self.scenario.loop.period_s)
        try:
            # the initial outputs (t = 0) are in the image before any server starts: a client
            # never reads placeholders (Modbus answers 06 busy until this publish)
            self._publish_initial()
            self._start_children()
            if self.announce:  # a viewer finds the run there (hil/live_runs.py); written off the loop's thread
                from hil.live_runs import Announcement

                try:
                    self._live = Announcement(self)
                    on_status = _both(on_status, self._live.update)
                except OSError as exc:  # a viewer cannot find the run; the run itself goes on
                    self.warnings.append(f"run not announced for `hil dashboard`: {exc}")
            if on_started is not None:
                on_started(self)
            if on_status is not None:  # its thread keeps normal scheduling: start it first
                self._reporter = StatusReporter(on_status)
            self.gc.begin()  # its full collection at normal priority, before SCHED_FIFO
            self._raise_priority()
            summary.extra["scheduling"] = self.scheduling
            self.image.set_loop_state("running")
            self.state = "running"
            self._loop(summary)
        except PlantDiverged as exc:
            self._fail(summary, "plant diverged", str(exc), EXIT_DIVERGED)
        except RunStopped as exc:
            self._fail(summary, exc.reason, exc.message, exc.exit_code)
        except BaseException as exc:
            if self.state == "configured":  # failed before the loop started: nothing may stay up
                self.state = summary.state = "failed"
                summary.stop_reason, summary.error = "start failed", str(exc)
                self._abort_start()
                self._release_after_failed_start = True
            raise
        finally:
            self.gc.end()
            if self.state == "running":
                self.state = "stopped"
            rt.set_normal()
            self.image.set_loop_state(self.state)
            if on_stopping is not None:
                on_stopping(self)
            self._finish(summary)
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            if getattr(self, "_release_after_failed_start", False):
                self.close()
        return summary

    def _publish_initial(self) -> None:
        self.loop_step.sync_in()
        self.image.publish(self.loop_step.publish_initial(), self.u_app, 0, 0.0)

    def _fail(self, summary: RunSummary, reason: str, message: str, exit_code: int) -> None:
        self.state = summary.state = "failed"
        summary.stop_reason = reason
        summary.error = message
        summary.exit_code = exit_code

    def _loop(self, summary: RunSummary) -> None:
        """The period, stage by stage (hil/loop/period.py)."""
        from hil.loop.period import run_period

        run_period(self, summary)

    def _status_tick(self, steps: int, t_s: float) -> None:
        """Every `loop.status_interval_s` of wall time, after a step's publish: check the
        helper processes (a required one dead stops the run), collect young garbage, hand a
        status snapshot to the status thread. Raises RunStopped."""
        stop = self.children.check(steps - 1, t_s)
        safety_lost = None
        if self.safety_watch is not None and not self._stop:  # dead or hung safety: alarm, stop if required
            safety_lost = self.safety_watch.check(steps - 1, t_s)
        if self._policy_handles is not None:  # policy dead or hung: alarm, restart ([policy] restart)
            self._supervise_policy(steps - 1, t_s)
        if self.shield_in_loop:
            self._watch_supervisor(steps - 1, t_s)
        if not (stop or safety_lost):
            self.gc.tick()
        if self._reporter is not None:
            self._reporter.offer(self._status(steps))  # with the alarm, also when stopping on it
        if stop:
            raise RunStopped("process died", "; ".join(stop), EXIT_PROCESS_DIED)
        if safety_lost:
            raise RunStopped("safety lost", safety_lost, EXIT_SAFETY_LOST)

    def _watch_supervisor(self, step: int, t_s: float) -> None:
        """The shield's supervisor (the safety process) silent past [safety] supervisor_silence_s:
        an alarm while it lasts (the shield's fallback acts meanwhile: hil/loop/shield_bus.py)."""
        bus = self.bus
        active = [a for a in self.alarms.items if a.kind == "supervisor_silent" and a.active]
        spoke = bus.decision_step >= 0
        if bus.silent and not active and (spoke or t_s >= 5.0):  # never spoke: 5 sim s for its start
            self.alarms.raise_("supervisor_silent", "safety process",
                               f"no supervisor decision for more than {self.scenario.safety.supervisor_silence_s:g} "
                               "sim s: the shield's fallback acts", step, t_s)
        elif not bus.silent:
            for alarm in active:
                alarm.active = False

    def _supervise_policy(self, step: int, t_s: float) -> None:
        """The policy process's supervision (hil/safety/launch.py): its alarms (died, hung, not
        restarted) join the run's alarms, active until the policy is up again."""
        from hil.safety.launch import supervise

        handles = self._policy_handles
        for line in supervise(handles):
            if " ALARM " in line:
                self.alarms.raise_("policy", "policy process", line.split(" ALARM ", 1)[1], step, t_s)
        if handles.supervisor is not None and handles.supervisor.state == "up":
            for alarm in self.alarms.items:
                if alarm.kind == "policy":
                    alarm.active = False

    def _recorder_lost(self, k: int, t_s: float, summary: RunSummary):
        """The recorder died: stop the run if it is required, else run on without recording."""
        self.children.check(k, t_s)  # raises its alarm if not raised yet
        if self.scenario.loop.require_recorder:
            summary.steps = k + 1
            raise RunStopped("process died", f"recorder process died at step {k}: recording lost from there",
                             EXIT_PROCESS_DIED)
        self.warnings.append(f"recorder died at step {k}: the recording stops there (loop.require_recorder = false)")
        return None

    @property
    def clipped_inputs(self) -> int:
        return int(self.input_counts[0])

    @property
    def non_finite_inputs(self) -> int:
        return int(self.input_counts[1])

    def _status(self, steps: int) -> dict:
        """The status snapshot (a fresh dict: the status thread owns it)."""
        lat = self.clock.lateness
        self.state_bounds.status(self.plant.x)
        return {
            "steps": steps,
            "sim_time_s": steps * self.step_s,
            "wall_time_s": self.clock.elapsed_s(),
            "lateness_p99_us": lat.percentile_ns(99) * 1e-3,
            "overruns": self.clock.overruns,
            "clipped_inputs": self.clipped_inputs,
            "input_writes": int(self.image.counters()["input_writes"]),
            "alarms": self.alarms.active(),
            "late_steps": self.clock.late_steps,
            "loop_state": self.state,
            **({"shield": self.bus.shield_status()} if self.shield_in_loop else {}),
            **({"lateness_counts": lat.counts.copy()} if self._live is not None else {}),
        }

    def _finish(self, summary: RunSummary) -> None:
        summary.sim_time_s = summary.steps * self.step_s
        summary.wall_time_s = round(self.clock.elapsed_s(), 6) if self.clock.start_ns else 0.0
        summary.overruns = self.clock.overruns
        summary.late_steps = self.clock.late_steps
        summary.lateness_us = self.clock.lateness.summary_us()
        summary.spin_cpu_fraction = round(self.clock.spin_fraction(), 4)
        summary.clipped_inputs = self.clipped_inputs
        summary.non_finite_inputs = self.non_finite_inputs
        counters = self.image.counters()
        summary.torn_input_reads = counters["torn_input_reads"]
        summary.input_writes = counters["input_writes"]
        summary.input_repairs = counters["input_repairs"]
        summary.stale_input_steps = self.input_watch.stale_steps
        self.children.check(summary.steps, summary.sim_time_s)  # a death since the last tick
        summary.dead_processes = self.children.dead()
        self._finish_safety_watch(summary)
        self.state_bounds.status(self.plant.x)
        summary.state_out_of_bounds = self.state_bounds.counts()
        summary.substeps = self.plant.substeps
        if getattr(self, "stage_times", None) is not None:
            summary.extra["stage_us"] = self.stage_times.summary_us()
        summary.gc = self.gc.summary()
        if self._live is not None:  # the final figures for a viewer still attached
            try:
                self._live.update(self._status(summary.steps))
            except OSError:
                pass
        if self._reporter is not None:
            self._reporter.close()
            summary.status_lines_dropped = self._reporter.dropped
            if self._reporter.last_error:
                self.warnings.append(f"status callback failed {self._reporter.errors} time(s): "
                                     f"{self._reporter.last_error}")
        summary.alarms = self.alarms.as_list()
        if getattr(self, "output_watches", None) is not None:  # one warning per kind of plant watch that fired ("warn")
            self.warnings += [msg for _, msg in self.output_watches.warned]
        summary.warnings = list(self.warnings)
        if self.bus is not None:
            summary.extra["bus"] = self.bus.counters()
        if self.drawn:
            summary.extra["randomized"] = self.drawn
        summary.extra.update(self._stop_children())
        if self.bus is not None:
            self.bus.close()
        if self.recorder is not None:
            summary.dropped_rows = self.recorder.dropped
            self.recorder.close(summary=summary.as_dict(), state=self.state)
            summary.dropped_rows = self.recorder.meta.get("dropped_rows", summary.dropped_rows)
            summary.record_path = str(self.record_path)

    def _finish_safety_watch(self, summary: RunSummary) -> None:
        """The safety process as the run ends (before it is stopped): a death since the last tick
        (not after a stop request: Ctrl-C reaches it too), dead_processes, and exit code
        EXIT_SAFETY_LOST if a required safety died or hung during the run."""
        w = self.safety_watch
        if w is None:
            return
        if not self._stop:
            w.check(summary.steps, summary.sim_time_s, final=True)
        summary.dead_processes.update(w.dead())
        summary.extra["safety_watch"] = w.summary()
        if w.required and w.lost and summary.exit_code == 0:
            summary.exit_code = EXIT_SAFETY_LOST
            what = f"died ({w.died})" if w.died else f"hung {w.hangs} time(s) (no heartbeat for {w.hang_s:g} s)"
            if w.restart is not None:
                what = f"was lost ({w.deaths} death(s), {w.hangs} hang(s)) and is {w.state} as the run ends"
            self.warnings.append(f"the safety process {what} during the run; [safety] required = true: "
                                 f"exit code {EXIT_SAFETY_LOST}")
        elif w.restarts:
            self.warnings.append(f"the safety process was lost {w.deaths + w.hangs} time(s) and restarted "
                                 f"{w.restarts} time(s) ([safety] restart); the loop's fallback acted meanwhile")

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
