"""The loop step's overhead beyond the plant step (issue 19: goal <= 2 us per step, lockstep).

The bioreactor of configs/bioreactor.toml (no gaps, no residual model: the loop's own work
only), stepped N times two ways, interleaved in every repeat:

    loop_step   hil/loop/step.py LoopStep.step(k): clip, actuation latency and gaps (identity),
                the plant's step kernel, the (empty) residual correction and state check,
                outputs, sensor gaps (identity), the recording row; one Python call per step
    plant_step  the plant's own compiled `step` kernel alone (plants/bioreactor.py), one
                Python call per step, the same inputs held

CPU time of this thread (time.thread_time_ns), per step, median over the repeats; the
overhead is the difference of the two medians. Both sides are warm (compiled, caches hot)
before the first repeat; the state is restored before each run, so both integrate the same
trajectory.

Human-readable lines go to stderr; the last line of stdout is one JSON object:

    loop_step_us, plant_step_us   per-step CPU time, median over the repeats (us)
    overhead_us                   loop_step_us - plant_step_us
    goal_us                       2.0 (the issue's goal)
    spread                        {"loop_step_us": [min, max], "plant_step_us": [min, max]}
    steps, repeats, headline      (benchmarks/results.py's table row: the overhead vs the goal)

Usage: python benchmarks/loop_overhead.py [--quick] [--steps N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hil.scenario.config import load_scenario  # noqa: E402
from hil.loop.plant import scenario_plant  # noqa: E402
from hil.loop.step import LoopStep  # noqa: E402

GOAL_US = 2.0


def build():
    sc = load_scenario(ROOT / "configs" / "bioreactor.toml", {"gaps": {"enabled": False}})
    plant = scenario_plant(sc)
    ls = LoopStep(plant, None, None, step_s=sc.loop.step_s, seed=sc.loop.seed)
    ls.u_cmd[:] = plant.u
    ls.warm_up()
    return plant, ls


def time_loop_step(ls, plant, snap, n: int) -> float:
    """CPU us per LoopStep.step over n steps from the snapshot."""
    plant.restore(snap)
    ls.sync_in()
    step = ls.step
    t0 = time.thread_time_ns()
    for k in range(n):
        step(k)
    return (time.thread_time_ns() - t0) / n / 1e3


def time_plant_step(ls, plant, snap, n: int) -> float:
    """CPU us per call of the plant's step kernel alone over n steps from the snapshot."""
    plant.restore(snap)
    kernel, x, u, p, dt, n_sub, W = plant.model.step, plant.x, plant.u, plant.p, ls.dt, plant.substeps, plant._work
    t = plant.t
    t0 = time.thread_time_ns()
    for _ in range(n):
        t = kernel(t, x, u, p, dt, n_sub, W)
    return (time.thread_time_ns() - t0) / n / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short run (checks that it works)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 20000; --quick 500)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 7; --quick 3)")
    args = ap.parse_args()
    n = args.steps or (500 if args.quick else 20000)
    reps = max(3, args.repeats or (3 if args.quick else 7))
    plant, ls = build()
    if plant.model.form != "ode" or not ls.fused:
        raise SystemExit("the bioreactor is expected to be an 'ode' plant on the fused path")
    snap = plant.snapshot()
    time_plant_step(ls, plant, snap, 10)  # warm both paths
    time_loop_step(ls, plant, snap, 10)
    loop_us, plant_us = [], []
    for r in range(reps):
        if r % 2 == 0:
            plant_us.append(time_plant_step(ls, plant, snap, n))
            loop_us.append(time_loop_step(ls, plant, snap, n))
        else:
            loop_us.append(time_loop_step(ls, plant, snap, n))
            plant_us.append(time_plant_step(ls, plant, snap, n))
        print(f"repeat {r}: loop step {loop_us[-1]:.3f} us, plant step {plant_us[-1]:.3f} us", file=sys.stderr)
    # both integrated the same trajectory: the loop step's state equals the kernel's
    time_plant_step(ls, plant, snap, 50)
    x_kernel = plant.x.copy()
    time_loop_step(ls, plant, snap, 50)
    if not np.array_equal(x_kernel, plant.x):
        raise SystemExit("the loop step and the plant kernel integrated different trajectories")
    loop_med, plant_med = statistics.median(loop_us), statistics.median(plant_us)
    out = {"loop_step_us": round(loop_med, 4), "plant_step_us": round(plant_med, 4),
           "overhead_us": round(loop_med - plant_med, 4), "goal_us": GOAL_US,
           "spread": {"loop_step_us": [round(min(loop_us), 4), round(max(loop_us), 4)],
                      "plant_step_us": [round(min(plant_us), 4), round(max(plant_us), 4)]},
           "steps": n, "repeats": reps, "clock": "thread_time_ns (CPU)",
           "headline": [{"figure": "loop step beyond the plant step (bioreactor, lockstep, CPU)",
                         "hil": round(loop_med - plant_med, 4), "unit": " us", "goal": GOAL_US,
                         "met": bool(loop_med - plant_med <= GOAL_US)}]}
    print(f"overhead {out['overhead_us']:.3f} us per step (goal <= {GOAL_US} us)", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
