"""The period: what the loop does every step, stage by stage (as ros2_control's read ->
update -> write), each stage timed.

    wait        clock.wait(): real time: the absolute deadline; lockstep: returns
    read        hooks.pre (campaign faults, the lockstep PLC's scan); commanded inputs from the
                process image (a torn read keeps the previous ones; stuck: repair / alarm),
                profiles
    decide      the bus: the policy's action through the safety wrapper into the bus inputs, or
                ([safety] placement = "loop") the compiled shield on the policy's newest proposal
                under the supervisor's newest decision (hil/loop/shield_bus.py)
    step        the compiled step (hil/loop/step.py): clip, actuator gaps, plant sub-steps,
                residual correction, state check, outputs, sensor gaps, the recording row
    publish     measured outputs and applied inputs to the image (PLCs, SCADA) and the bus
    record      the row to the recorder's ring (every `recording.decimate` steps); states
                outside bounds noted; the status tick (wall time); below a 1 ms period one
                stage per period (supervision, young-garbage collection, snapshot, hand-over)

Python here is the I/O boundary only (image, bus, recorder, status); the arithmetic is in
the compiled step. Stage times (ns, per stage: total and max) are in `StageTimes`; the run
summary reports them as `stage_us` (mean and max per stage, microseconds).
"""

from __future__ import annotations

import time
from itertools import chain

import numpy as np

from hil.errors import PlantDiverged, RunStopped
from hil.loop.children import status_tick_stages
from hil.loop.health import EXIT_STATE_OUT_OF_BOUNDS
from hil.loop.kernels import take_into
from hil.recorder import RecorderDied

STAGES = ("read", "decide", "step", "publish", "record")
_DONE = object()  # the status tick's end marker
STAGED_TICK_BELOW_S = 1e-3  # periods (s) below which the status tick runs one stage per period


class StageTimes:
    """Per-stage wall time of the period: ns[stage, 0] total, ns[stage, 1] max (int64)."""

    def __init__(self):
        self.ns = np.zeros((len(STAGES), 2), dtype=np.int64)
        self.steps = 0

    def summary_us(self) -> dict:
        n = max(self.steps, 1)
        return {s: {"mean": round(float(self.ns[i, 0]) / n * 1e-3, 3), "max": round(float(self.ns[i, 1]) * 1e-3, 3)}
                for i, s in enumerate(STAGES)}


def run_period(rt, summary) -> None:
    """Run the loop of Runtime `rt` until its duration, a stop request or a fatal condition
    (PlantDiverged, RunStopped); summary.steps is kept current, rt.stage_times filled."""
    times = rt.stage_times = StageTimes()
    acc = [0] * (2 * len(STAGES))  # per stage: total ns, max ns
    try:
        _run(rt, summary, acc)
    finally:
        times.ns[:, 0] = acc[0::2]
        times.ns[:, 1] = acc[1::2]


def _run(rt, summary, acc) -> None:
    image, clock, bus, rec = rt.image, rt.clock, rt.bus, rt.recorder
    ls = rt.loop_step
    ls.hooks = hooks = rt.hooks
    u_cmd, u_image, u_app, y_meas, row = ls.u_cmd, rt.u_image, ls.u_app, ls.y_meas, ls.row
    plc_idx, profiles, input_watch = rt.plc_idx, rt.profiles, rt.input_watch
    plant = rt.plant
    fail_out_of_bounds = rt.scenario.loop.on_state_out_of_bounds == "fail"
    watches = rt.output_watches
    step_s, decimate, lockstep = rt.step_s, rt.decimate, rt.lockstep
    status_every = rt.scenario.loop.status_interval_s
    next_status = time.monotonic() + status_every
    times = rt.stage_times
    now_ns = time.perf_counter_ns
    step = ls.step
    shield_col = len(row) - 1 if getattr(rt, "shield_in_loop", False) else 0
    # bind the read stage's kernel now, not in step 0: its first call loads the compiled code
    # from the cache (2.7 to 62 ms seen at 10 kHz: that many deadlines skipped); a no-op copy
    take_into(u_cmd, u_cmd, plc_idx)
    clock.start(0.0 if lockstep else 0.05)
    tick = None  # the status tick's remaining stages (hil/loop/children.py status_tick_stages)
    # one stage per period below STAGED_TICK_BELOW_S, where the whole tick (~0.3 ms) would
    # skip deadlines; longer periods and lockstep run it at once
    staged_tick = clock.realtime and clock.period_ns < STAGED_TICK_BELOW_S * 1e9
    k = 0
    for k in range(rt.n_steps):
        if rt._stop:
            summary.stop_reason = "stop requested"
            break
        late_ns = clock.wait()
        wall_ns = time.monotonic_ns()
        t = k * step_s
        # read
        t0 = now_ns()
        if hooks is not None:
            hooks.pre(k, t)
        if image.read_inputs_into(u_image):
            take_into(u_cmd, u_image, plc_idx)
            if input_watch.run:
                input_watch.ok(k)
        elif input_watch.torn(k, t) and image.read_inputs_into(u_image):
            take_into(u_cmd, u_image, plc_idx)
        for prof in profiles:
            prof.apply(t, u_cmd)
        # decide
        t1 = now_ns()
        if bus is not None:
            bus.before_step(k, t, u_cmd, lockstep)
            if shield_col:
                row[shield_col] = bus.last_code  # the shield's source (the step leaves this column alone)
        # step (compiled)
        t2 = now_ns()
        n_out = step(k, wall_ns, late_ns * 1e-3)
        t3 = now_ns()
        if n_out < 0:  # NaN/inf in a state: the row of this step, then stop
            if rec is not None:
                rec.append(row)
            summary.steps = k + 1
            raise PlantDiverged(plant.first_non_finite_state(), k, t + step_s)
        # publish
        image.publish(y_meas, u_app, k + 1, t + step_s)
        if bus is not None:
            bus.after_step(k, t + step_s, y_meas, u_app)
        # record
        t4 = now_ns()
        if rec is not None and k % decimate == 0:
            try:
                rec.append(row)
            except RecorderDied:
                rec = rt._recorder_lost(k, t + step_s, summary)
        t5 = now_ns()
        times.steps += 1
        d = t1 - t0
        acc[0] += d
        if d > acc[1]:
            acc[1] = d
        d = t2 - t1
        acc[2] += d
        if d > acc[3]:
            acc[3] = d
        d = t3 - t2
        acc[4] += d
        if d > acc[5]:
            acc[5] = d
        d = t4 - t3
        acc[6] += d
        if d > acc[7]:
            acc[7] = d
        d = t5 - t4
        acc[8] += d
        if d > acc[9]:
            acc[9] = d
        if watches is not None and (hit := watches.check(plant.y, k + 1, t + step_s)) is not None:
            summary.steps = k + 1
            raise RunStopped(hit[0], hit[1], hit[2])  # the plant's own watch, action "fail"
        if n_out:  # states outside their spec bounds (counted per state by the step)
            first = rt.state_bounds.note(plant.x, k, t + step_s)
            if fail_out_of_bounds:
                summary.steps = k + 1
                raise RunStopped("state out of bounds", first, EXIT_STATE_OUT_OF_BOUNDS)
        # status tick (wall time): liveness, collection, status snapshot, one stage per period
        if tick is not None:
            summary.steps = k + 1
            if next(tick, None) is _DONE:
                tick = None
        elif (now := time.monotonic()) >= next_status:
            next_status = now + status_every  # after a stall: one tick, not a burst
            summary.steps = k + 1
            tick = chain(status_tick_stages(rt, k + 1, t + step_s), (_DONE,))
            next(tick)  # the supervision now (it may stop the run); the rest in the next periods
            if not staged_tick:  # the whole tick now: it is small beside the period
                for _ in tick:
                    pass
                tick = None
            if rec is not None and rt.children.is_dead("recorder"):
                rec = rt._recorder_lost(k, t + step_s, summary)
    else:
        summary.steps = rt.n_steps
        return
    summary.steps = k
