"""The run's helper processes: start, priority, supervision while the loop runs, stop.

A run's children are the recorder, the protocol servers (adapters/process.py), and the policy
and safety processes (hil/safety/launch.py). They start before the loop raises its own
priority (children inherit SCHED_FIFO); a failed start stops every one started so far. They
stop after the loop, in this order: policy and safety (their final counters), then the
servers (theirs); the recorder is closed last, with the summary, by hil/loop/lifecycle.py.
Each function takes the Runtime (hil/runtime.py) whose `_children`, `recorder`,
`_policy_handles` and `safety_watch` it sets; the loop's own period is hil/loop/period.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from hil.errors import RunStopped
from hil.loop import rt as sched
from hil.loop.health import EXIT_PROCESS_DIED, EXIT_SAFETY_LOST
from hil.recorder import Recorder, column_dtypes


def start(rt) -> None:
    """Start the recorder, the servers, the policy and safety processes of Runtime `rt`."""
    if rt.record:
        meta = {
            "scenario": rt.scenario.model_dump(mode="json"),
            "plant": rt.spec.name,
            "step_s": rt.step_s,
            "mode": "lockstep" if rt.lockstep else "realtime",
            "units": {f"{k}.{q.name}": q.unit for k, qs in (("x", rt.spec.states), ("cmd", rt.spec.inputs),
                      ("y", rt.spec.outputs), ("z", rt.spec.algebraic), ("d", rt.spec.discrete)) for q in qs},
            "groups": {f"{g.kind}.{g.name}": [g.start, g.size, g.unit] for g in rt.spec.groups},
            "randomized": rt.drawn,
            "started_utc": datetime.now(timezone.utc).isoformat(),
        }
        rt.recorder = Recorder(rt.record_path, rt.columns, meta, dtypes=recording_dtypes(rt),
                               flush_interval_s=rt.scenario.recording.flush_interval_s,
                               block_when_full=rt.lockstep)
    if rt.start_servers and rt.start_processes:
        from adapters.process import start_servers

        log = str(Path(rt.record_path) / "_modbus_requests.jsonl") if rt.record else None
        shared = str(Path(rt.record_path) / "_dual_writable.txt") if rt.record else None
        rt._children += start_servers(rt.scenario, rt.image.name, modbus_request_log=log,
                                      shared_list=shared, spec=rt.spec)
    for server in rt._children:
        rt.children.add(f"{server.kind} server", server.process, rt.scenario.loop.require_servers)
    if rt.recorder is not None:
        rt.children.add("recorder", rt.recorder.process, rt.scenario.loop.require_recorder)
    if rt.scenario.policy is not None and rt.start_processes and getattr(rt.scenario.policy, "launch", False):
        from hil.safety import launch

        # decision log and status files where [safety].decision_log says
        rt._policy_handles = launch.start(rt.scenario, rt.scenario_path or "",
                                          key=rt.bus.key if rt.bus is not None else None)
        from hil.safety.watch import SafetyWatch

        sec = rt.scenario.safety
        rt.safety_watch = SafetyWatch(rt._policy_handles, rt.alarms, required=sec.required, hang_s=sec.hang_s,
                                      restart=sec.restart, respawn=launch.respawn_safety)
    else:
        rt._policy_handles = None


def recording_dtypes(rt) -> dict[str, str]:
    """The recording's column dtypes (hil/recorder.py), with the shield's source column."""
    dtypes = column_dtypes(rt.spec)
    if rt.shield_in_loop:
        from hil.loop.shield_bus import SOURCE_COLUMN

        dtypes[SOURCE_COLUMN] = "int8"
    return dtypes


def abort_start(rt) -> None:
    """Undo a partial start: stop the children started so far, drop the recording (no rows yet)."""
    from hil.startup import discard_recording

    try:
        stop(rt)
    finally:
        rec, rt.recorder = rt.recorder, None
        if rec is not None:
            rec.close(timeout_s=10.0, state="failed")
            discard_recording(rec.directory)


def stop(rt) -> dict:
    """Stop the policy and safety processes, then the servers; returns their final counters
    ("policy", "safety", "modbus", "opcua"). The recorder is not stopped here."""
    extra: dict = {}
    if rt._policy_handles is not None:
        from hil.safety import launch

        handles = rt._policy_handles
        launch.stop(handles)
        extra["policy"] = launch.supervision_summary(handles)  # deaths, hangs, restarts, alarms
        rt._policy_handles = None
        try:
            extra["safety"] = json.loads(Path(handles.status_path).read_text())["counters"]
        except (OSError, ValueError, KeyError):
            extra["safety"] = {"error": "safety wrapper left no status"}
    if rt._children:
        from adapters.process import stop_servers

        extra.update(stop_servers(rt._children))  # final counters: "modbus", "opcua"
        rt._children = []
    return extra


def pids(rt) -> list[int]:
    """The pids of the running children (servers, recorder, policy, safety)."""
    out = [s.process.pid for s in rt._children]
    if rt.recorder is not None:
        out.append(rt.recorder.pid)
    if rt._policy_handles is not None:
        out += [rt._policy_handles.policy.pid, rt._policy_handles.safety.pid]
    if getattr(rt, "_stats_writer", None) is not None:
        out.append(rt._stats_writer.pid)
    return [p for p in out if p]


def raise_priority(rt) -> None:
    """Real time: SCHED_FIFO, pinning, mlock as loop.priority / loop.cpu say (rt.apply_loop_scheduling),
    once the children run (they keep normal scheduling); `rt.scheduling` is what was obtained. Under
    SCHED_FIFO the spin stays under half a period, so the loop sleeps and its CPU's other work
    runs. The loop process's other threads (the status thread) go just below the loop, off its CPU,
    with a GIL switch interval under the spin (rt.guard_threads); the policy and safety processes
    go just below the loop too."""
    if rt.lockstep:
        rt.scheduling = {**sched.current_scheduling(), "lockstep": True}
    else:
        loop = rt.scenario.loop
        rt.scheduling, warns = sched.apply_loop_scheduling(loop.priority, loop.cpu, rt._child_pids())
        rt.warnings += warns
        if rt.scheduling["policy"] != "SCHED_OTHER" and rt.clock.spin_ns > rt.clock.period_ns // 2:
            rt.clock.spin_ns = rt.clock.period_ns // 2
            rt.warnings.append(f"loop.spin_us limited to {rt.clock.spin_ns / 1e3:g} us (half the period) "
                               "under SCHED_FIFO, so that the loop never holds its CPU for a whole period")
        if rt.scheduling["policy"] == "SCHED_FIFO":  # no GIL holder of this process left preempted
            cpus = rt.scheduling.get("cpus") or []
            rt.thread_guard, warns = sched.guard_threads(rt.scheduling["priority"], cpus[0] if len(cpus) == 1 else None,
                                                         rt.clock.spin_ns * 1e-9)
            rt.warnings += warns
    if getattr(rt, "on_scheduled", None) is not None:
        rt.on_scheduled(rt.scheduling, list(rt.warnings))
    if rt._policy_handles is not None and rt.scheduling.get("policy") == "SCHED_FIFO":
        from hil.safety.launch import set_priority  # on the control path: just below the loop

        rt.warnings += set_priority(rt._policy_handles, max(1, int(rt.scheduling["priority"]) - 1))
    if rt._policy_handles is not None and len(rt.scheduling.get("cpus") or ()) == 1:
        rt._policy_handles.loop_cpu = int(rt.scheduling["cpus"][0])  # a restarted policy avoids it


# ---- supervision while the loop runs (called from the status tick, hil/loop/period.py) ----


def status_tick(rt, steps: int, t_s: float) -> None:
    """Every `loop.status_interval_s` of wall time, after a step's publish: check the helper
    processes (a required one dead stops the run), collect young garbage, hand a status
    snapshot to the stats writer (hil/loop/stats_writer.py) and the status thread. Raises
    RunStopped. The loop runs the same work in stages, one per period: status_tick_stages."""
    for _ in status_tick_stages(rt, steps, t_s):
        pass


def status_tick_stages(rt, steps: int, t_s: float):
    """The status tick as a generator of stages, one per period (the period calls next() after
    each following step): the supervision (raises RunStopped), the young-garbage collection, the
    snapshot, its hand-over. Each stage is tens of us; all at once they made the loop late by
    200 to 400 us at every tick at 10 kHz. A snapshot thus describes the run two periods after
    the tick's step (its "steps" is the tick's)."""
    stop_reasons = rt.children.check(steps - 1, t_s)
    safety_lost = None
    if rt.safety_watch is not None and not rt._stop:  # dead or hung safety: alarm, stop if required
        safety_lost = rt.safety_watch.check(steps - 1, t_s)
    if rt._policy_handles is not None:  # policy dead or hung: alarm, restart ([policy] restart)
        supervise_policy(rt, steps - 1, t_s)
    if rt.shield_in_loop:
        watch_supervisor(rt, steps - 1, t_s)
    if stop_reasons or safety_lost:  # at once, with the alarm in the snapshot
        _offer_status(rt, rt._status(steps))
        if stop_reasons:
            raise RunStopped("process died", "; ".join(stop_reasons), EXIT_PROCESS_DIED)
        raise RunStopped("safety lost", safety_lost, EXIT_SAFETY_LOST)
    yield
    rt.gc.tick()
    if rt._reporter is None and getattr(rt, "_stats_writer", None) is None:
        return
    yield
    status = rt._status(steps)
    yield
    _offer_status(rt, status)


def _offer_status(rt, status: dict) -> None:
    writer = getattr(rt, "_stats_writer", None)
    if writer is not None:
        writer.offer(status)  # pickled now: the status thread may own the dict afterwards
    if rt._reporter is not None:
        rt._reporter.offer(status)


def watch_supervisor(rt, step: int, t_s: float) -> None:
    """The shield's supervisor (the safety process) silent past [safety] supervisor_silence_s:
    an alarm while it lasts (the shield's fallback acts meanwhile: hil/loop/shield_bus.py)."""
    bus = rt.bus
    active = [a for a in rt.alarms.items if a.kind == "supervisor_silent" and a.active]
    spoke = bus.decision_step >= 0
    if bus.silent and not active and (spoke or t_s >= 5.0):  # never spoke: 5 sim s for its start
        rt.alarms.raise_("supervisor_silent", "safety process",
                         f"no supervisor decision for more than {rt.scenario.safety.supervisor_silence_s:g} "
                         "sim s: the shield's fallback acts", step, t_s)
    elif not bus.silent:
        for alarm in active:
            alarm.active = False


def supervise_policy(rt, step: int, t_s: float) -> None:
    """The policy process's supervision (hil/safety/launch.py): its alarms (died, hung, not
    restarted) join the run's alarms, active until the policy is up again."""
    from hil.safety.launch import supervise

    handles = rt._policy_handles
    for line in supervise(handles):
        if " ALARM " in line:
            rt.alarms.raise_("policy", "policy process", line.split(" ALARM ", 1)[1], step, t_s)
    if handles.supervisor is not None and handles.supervisor.state == "up":
        for alarm in rt.alarms.items:
            if alarm.kind == "policy":
                alarm.active = False


def recorder_lost(rt, k: int, t_s: float, summary):
    """The recorder died at step k: stop the run if it is required (RunStopped), else run on
    without recording (returns None, the period's new recorder)."""
    rt.children.check(k, t_s)  # raises its alarm if not raised yet
    if rt.scenario.loop.require_recorder:
        summary.steps = k + 1
        raise RunStopped("process died", f"recorder process died at step {k}: recording lost from there",
                         EXIT_PROCESS_DIED)
    rt.warnings.append(f"recorder died at step {k}: the recording stops there (loop.require_recorder = false)")
    return None


def finish_safety_watch(rt, summary) -> None:
    """The safety process as the run ends (before it is stopped): a death since the last tick
    (not after a stop request: Ctrl-C reaches it too), dead_processes, and exit code
    EXIT_SAFETY_LOST if a required safety died or hung during the run."""
    w = rt.safety_watch
    if w is None:
        return
    if not rt._stop:
        w.check(summary.steps, summary.sim_time_s, final=True)
    summary.dead_processes.update(w.dead())
    summary.extra["safety_watch"] = w.summary()
    if w.required and w.lost and summary.exit_code == 0:
        summary.exit_code = EXIT_SAFETY_LOST
        what = f"died ({w.died})" if w.died else f"hung {w.hangs} time(s) (no heartbeat for {w.hang_s:g} s)"
        if w.restart is not None:
            what = f"was lost ({w.deaths} death(s), {w.hangs} hang(s)) and is {w.state} as the run ends"
        rt.warnings.append(f"the safety process {what} during the run; [safety] required = true: "
                           f"exit code {EXIT_SAFETY_LOST}")
    elif w.restarts:
        rt.warnings.append(f"the safety process was lost {w.deaths + w.hangs} time(s) and restarted "
                           f"{w.restarts} time(s) ([safety] restart); the loop's fallback acted meanwhile")
