"""A run's life: configured -> running -> stopped | failed (after FMI 3).

    publish the initial outputs     before any server starts: a client never reads placeholders
    start the children              recorder, servers, policy and safety (hil/loop/children.py)
    announce, on_started, status    (hil/live_runs.py, its stats file written in real time by a child
                                    process: hil/loop/stats_writer.py; the caller's SoftPLC; the
                                    status thread, only for a caller's on_status)
    gc.begin, raise the priority    the full collection at normal priority, then SCHED_FIFO (the
                                    status thread just below the loop: rt.guard_threads)
    the period                      hil/loop/period.py, until the duration, a stop or a failure
    finish                          normal priority, on_stopping, the summary, the children
                                    stopped (policy and safety, servers), the recorder closed

`run(rt, ...)` is Runtime.run (hil/runtime.py builds the pieces; this module only sequences
them). A failure before the loop starts stops every child and releases the image.
"""

from __future__ import annotations

import signal
from typing import Callable

from hil.errors import PlantDiverged, RunStopped
from hil.loop import children, rt as sched
from hil.loop.health import EXIT_DIVERGED
from hil.loop.status import StatusReporter
from hil.loop.summary import RunSummary


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


def run(rt, on_status: Callable[[dict], None] | None = None, on_started: Callable | None = None,
        on_stopping: Callable | None = None) -> RunSummary:
    """Runtime.run: see its docstring."""
    if rt.state != "configured":
        raise RuntimeError(f"runtime is {rt.state}; a Runtime runs once")
    old_handlers = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            old_handlers[sig] = signal.signal(sig, rt.request_stop)
        except ValueError:  # not the main thread
            pass
    summary = RunSummary(rt.scenario.name, "lockstep" if rt.lockstep else "realtime", "stopped",
                         "duration reached", period_s=0.0 if rt.lockstep else rt.scenario.loop.period_s)
    release_after_failed_start = False
    try:
        # the initial outputs (t = 0) are in the image before any server starts: a client
        # never reads placeholders (Modbus answers 06 busy until this publish)
        rt._publish_initial()
        rt._start_children()
        if rt.announce:  # a viewer finds the run there (hil/live_runs.py); written off the loop's thread
            from hil.live_runs import Announcement

            try:
                rt._live = Announcement(rt)
                if rt.lockstep:
                    on_status = _both(on_status, rt._live.update)
                else:  # real time: by a child process, not a thread competing for the GIL
                    from hil.loop.stats_writer import StatsWriter

                    rt._stats_writer = StatsWriter(rt._live.stats_path)
            except OSError as exc:  # a viewer cannot find the run; the run itself goes on
                rt.warnings.append(f"run not announced for `hil dashboard`: {exc}")
        if on_started is not None:
            on_started(rt)
        if on_status is not None:  # its thread keeps normal scheduling: start it first
            rt._reporter = StatusReporter(on_status)
        rt.gc.begin()  # its full collection at normal priority, before SCHED_FIFO
        rt._raise_priority()
        summary.extra["scheduling"] = rt.scheduling
        rt.image.set_loop_state("running")
        rt.state = "running"
        rt._loop(summary)
    except PlantDiverged as exc:
        fail(rt, summary, "plant diverged", str(exc), EXIT_DIVERGED)
    except RunStopped as exc:
        fail(rt, summary, exc.reason, exc.message, exc.exit_code)
    except BaseException as exc:
        if rt.state == "configured":  # failed before the loop started: nothing may stay up
            rt.state = summary.state = "failed"
            summary.stop_reason, summary.error = "start failed", str(exc)
            rt._abort_start()
            release_after_failed_start = True
        raise
    finally:
        rt.gc.end()
        if rt.state == "running":
            rt.state = "stopped"
        sched.set_normal()
        sched.release_threads(getattr(rt, "thread_guard", None))
        rt.thread_guard = None
        rt.image.set_loop_state(rt.state)
        if on_stopping is not None:
            on_stopping(rt)
        finish(rt, summary)
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        if release_after_failed_start:
            rt.close()
    return summary


def fail(rt, summary: RunSummary, reason: str, message: str, exit_code: int) -> None:
    rt.state = summary.state = "failed"
    summary.stop_reason = reason
    summary.error = message
    summary.exit_code = exit_code


def finish(rt, summary: RunSummary) -> None:
    """The loop has stopped: fill the summary (clock, inputs, image, children, safety, bounds,
    stage times, gc, status thread, alarms, warnings, bus), stop the children, close the bus,
    then the recorder with the summary in its meta."""
    summary.sim_time_s = summary.steps * rt.step_s
    summary.wall_time_s = round(rt.clock.elapsed_s(), 6) if rt.clock.start_ns else 0.0
    summary.overruns = rt.clock.overruns
    summary.late_steps = rt.clock.late_steps
    summary.lateness_us = rt.clock.lateness.summary_us()
    summary.spin_cpu_fraction = round(rt.clock.spin_fraction(), 4)
    summary.clipped_inputs = rt.clipped_inputs
    summary.non_finite_inputs = rt.non_finite_inputs
    counters = rt.image.counters()
    summary.torn_input_reads = counters["torn_input_reads"]
    summary.input_writes = counters["input_writes"]
    summary.input_repairs = counters["input_repairs"]
    summary.stale_input_steps = rt.input_watch.stale_steps
    rt.children.check(summary.steps, summary.sim_time_s)  # a death since the last tick
    summary.dead_processes = rt.children.dead()
    children.finish_safety_watch(rt, summary)
    rt.state_bounds.status(rt.plant.x)
    summary.state_out_of_bounds = rt.state_bounds.counts()
    summary.substeps = rt.plant.substeps
    if getattr(rt, "stage_times", None) is not None:
        summary.extra["stage_us"] = rt.stage_times.summary_us()
    summary.gc = rt.gc.summary()
    writer = getattr(rt, "_stats_writer", None)
    if writer is not None:  # its last snapshot written before the final figures below
        writer.close()
        rt._stats_writer = None
    if rt._live is not None:  # the final figures for a viewer still attached
        try:
            rt._live.update(rt._status(summary.steps))
        except OSError:
            pass
    if rt._reporter is not None:
        rt._reporter.close()
        summary.status_lines_dropped = rt._reporter.dropped
        if rt._reporter.last_error:
            rt.warnings.append(f"status callback failed {rt._reporter.errors} time(s): "
                               f"{rt._reporter.last_error}")
    summary.alarms = rt.alarms.as_list()
    if getattr(rt, "output_watches", None) is not None:  # one warning per kind of plant watch that fired ("warn")
        rt.warnings += [msg for _, msg in rt.output_watches.warned]
    summary.warnings = list(rt.warnings)
    if rt.bus is not None:
        summary.extra["bus"] = rt.bus.counters()
    if rt.drawn:
        summary.extra["randomized"] = rt.drawn
    summary.extra.update(rt._stop_children())
    if rt.bus is not None:
        rt.bus.close()
    if rt.recorder is not None:
        summary.dropped_rows = rt.recorder.dropped
        rt.recorder.close(summary=summary.as_dict(), state=rt.state)
        summary.dropped_rows = rt.recorder.meta.get("dropped_rows", summary.dropped_rows)
        summary.record_path = str(rt.record_path)
