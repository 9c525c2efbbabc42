"""Per-step cost of the gaps on the bioreactor, no gaps vs every gap on every signal, one run.

    python benchmarks/gap_cost.py [--quick] [--steps N] [--rounds R]

Two views, both measured here in the same process, interleaved round by round (A, B, A, B ...)
and summarized by the median over rounds so that a noisy shared machine biases neither side:

- loop: the whole lockstep step of hil's loop (hil.runtime.Runtime, recording off, no
  servers): image read, clip, actuate, plant step, sense, publish. The issue's definition:
  "per-step cost of the loop". -> step_us_no_gaps, step_us_all_gaps, overhead_ratio.
- plant: only plant.step + compute_outputs + the gap calls (identity pipeline vs all gaps),
  the tightest view. -> plant_step_us_no_gaps, plant_step_us_all_gaps, plant_overhead_ratio.

overhead_ratio = median over rounds of (all-gaps / no-gaps of the same round) - 1 (the goal is
< 0.20); step_us_* are the medians over rounds.

"All gaps": every sensor feature on each of the 9 outputs (white + AR(1) noise, bias, linear and
random-walk drift, spikes, ADC quantization, sample-and-hold, dropouts), every actuator element
on each of the 7 inputs (gain/offset, quantization, deadband, breakaway, saturation, rate limit,
lag, backlash), an observation delay channel per output (lognormal, 'latest') and an actuation
channel per input (uniform + jitter, 'fifo'), and plant + gap randomization.

Allocations: net growth over n steps of actuate + sense (the per-step gap path, same arrays,
precomputed times, after a warm-up): sys.getallocatedblocks() delta with the GC off (whole
interpreter; a few blocks of noise) and tracemalloc's blocks/bytes attributed to hil/gaps/
(should be 0).

The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hil.scenario.config import load_scenario  # noqa: E402
from hil.gaps import GapPipeline, GapsSection  # noqa: E402
from plants.base import Plant  # noqa: E402


def all_gaps(spec) -> dict:
    """A [gaps] table with every gap type on every signal of `spec`."""
    sensors, obs = {}, {}
    for q in spec.outputs:
        span = q.high - q.low
        sensors[q.name] = {
            "gain": 1.01, "bias": 0.001 * span, "drift_per_day": 0.002 * span,
            "random_walk_std": 1e-5 * span, "noise_std": 0.001 * span, "colored_std": 0.001 * span,
            "colored_tau_s": 30.0, "spike_rate_per_s": 1e-3, "spike_size": 0.01 * span,
            "adc_bits": 16, "adc_range": [q.low, q.high], "sample_period_s": 2.0,
            "dropout_rate_per_s": 1e-4, "dropout_duration_s": 30.0, "dropout_mode": "hold",
        }
        obs[q.name] = {"dist": "lognormal", "median_s": 1.5, "sigma": 0.5, "max_s": 20.0,
                       "order": "latest"}
    actuators, act = {}, {}
    for q in spec.inputs:
        span = q.high - q.low
        actuators[q.name] = {
            "gain": 1.02, "offset": 0.001 * span, "dac_bits": 12, "deadband": 0.001 * span,
            "breakaway": 0.002 * span, "saturation": [q.low, q.low + 0.95 * span],
            "rate_limit_per_s": 0.01 * span, "lag_tau_s": 5.0, "backlash": 0.002 * span,
        }
        act[q.name] = {"dist": "uniform", "low_s": 1.0, "high_s": 3.0, "jitter_s": 0.5}
    return {
        "max_delay_s": 30.0, "sensors": sensors, "actuators": actuators,
        "latency": {"observation": obs, "actuation": act},
        "randomize": {
            "plant": {"mu_x": {"dist": "uniform", "low": 0.9, "high": 1.1, "relative": True}},
            "sensors": {spec.outputs[2].name: {"bias": {"dist": "normal", "mean": 0.0, "std": 0.01}}},
        },
    }


def time_plant(plant: Plant, gaps: GapPipeline, n: int, dt: float, step_s: float) -> float:
    """us per step of actuate + plant step + outputs + sense."""
    u_cmd = plant.u.copy()
    u_app = np.zeros_like(u_cmd)
    y_meas = np.zeros(plant.spec.n_outputs)
    times = [k * step_s for k in range(n + 1)]
    t0 = time.perf_counter()
    for k in range(n):
        gaps.actuate(times[k], u_cmd, u_app)
        plant.u[:] = u_app
        plant.step(dt)
        gaps.sense(times[k + 1], plant.compute_outputs(), y_meas)
    return (time.perf_counter() - t0) / n * 1e6


def time_loop(scenario, n: int) -> float:
    """us per step of hil's lockstep loop, recording off, no servers."""
    from hil.runtime import Runtime

    duration = n * scenario.loop.step_s
    rt = Runtime(scenario, lockstep=True, duration_s=duration, record=False,
                 start_servers=False, start_processes=False)
    try:
        t0 = time.perf_counter()
        summary = rt.run()
        wall = time.perf_counter() - t0
    finally:
        rt.close()
    return wall / max(summary.steps, 1) * 1e6


def allocations(gaps: GapPipeline, n_in: int, n_out: int, n: int, step_s: float) -> dict:
    u, ua = np.linspace(0.0, 0.01, n_in), np.zeros(n_in)
    y, ym = np.ones(n_out), np.zeros(n_out)
    times = [k * step_s for k in range(n + 1)]
    for k in range(100):  # warm (binds the arrays)
        gaps.actuate(times[k], u, ua)
        gaps.sense(times[k + 1], y, ym)
    import gc

    def blocks(steps: int) -> int:
        """Net change of the interpreter's allocated blocks over `steps` steps, GC off."""
        gc.collect()
        gc.disable()  # a collection inside the window would free unrelated blocks
        try:
            b0 = sys.getallocatedblocks()
            for k in range(steps):
                gaps.actuate(times[k], u, ua)
                gaps.sense(times[k + 1], y, ym)
            return sys.getallocatedblocks() - b0
        finally:
            gc.enable()

    blocks_small, blocks_big = blocks(n // 10), blocks(n)
    flt = [tracemalloc.Filter(True, str(ROOT / "hil" / "gaps" / "*"))]

    def traced(steps: int) -> tuple[int, int]:
        """(blocks, bytes) retained in hil/gaps/ after `steps` steps under tracemalloc."""
        tracemalloc.start()
        for k in range(100):  # traced warm-up
            gaps.actuate(times[k], u, ua)
            gaps.sense(times[k + 1], y, ym)
        snap0 = tracemalloc.take_snapshot()
        for k in range(steps):
            gaps.actuate(times[k], u, ua)
            gaps.sense(times[k + 1], y, ym)
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        diff = snap1.filter_traces(flt).compare_to(snap0.filter_traces(flt), "lineno")
        return sum(d.count_diff for d in diff), sum(d.size_diff for d in diff)

    # a snapshot itself takes objects from the interpreter's free lists, so a window may show
    # a constant block or two; per-step growth is the difference between two window lengths
    small = traced(n // 10)
    big = traced(n)
    return {
        "alloc_steps": n,
        "allocated_blocks_delta": blocks_big,
        "allocated_blocks_per_step": (blocks_big - blocks_small) / (n - n // 10),
        "tracemalloc_blocks_delta": int(big[0]),
        "tracemalloc_bytes_delta": int(big[1]),
        "tracemalloc_blocks_per_step": (big[0] - small[0]) / (n - n // 10),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few steps: check that it runs")
    ap.add_argument("--steps", type=int, default=None, help="steps per round")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per variant")
    args = ap.parse_args(argv)
    n = args.steps or (2000 if args.quick else 20000)
    rounds = args.rounds or (2 if args.quick else 7)

    base = load_scenario(ROOT / "configs" / "bioreactor.toml")
    plant = Plant.from_name("bioreactor")
    spec = plant.spec
    step_s = base.loop.step_s
    dt = step_s / getattr(plant.module, "TIME_UNIT_S", 1.0)
    section = GapsSection.model_validate(all_gaps(spec))
    with_gaps = base.model_copy(update={"gaps": section})
    none = GapPipeline.build(None, spec, step_s, base.loop.seed)
    full = GapPipeline.build(section, spec, step_s, base.loop.seed)
    full.randomize(plant.p.copy(), 0)
    x0 = plant.x.copy()

    res = {"loop_none": [], "loop_all": [], "plant_none": [], "plant_all": []}
    time_loop(base, 200)  # warm both paths (compilation, caches)
    time_loop(with_gaps, 200)
    for r in range(rounds):
        for key, g in (("plant_none", none), ("plant_all", full)):
            plant.x[:] = x0
            g.reset(r)
            time_plant(plant, g, 200, dt, step_s)
            plant.x[:] = x0
            res[key].append(time_plant(plant, g, n, dt, step_s))
        res["loop_none"].append(time_loop(base, n))
        res["loop_all"].append(time_loop(with_gaps, n))
    med = {k: statistics.median(v) for k, v in res.items()}
    # paired: each round's all-gaps run against the no-gaps run just before it
    ratio = statistics.median(a / b for a, b in zip(res["loop_all"], res["loop_none"]))
    p_ratio = statistics.median(a / b for a, b in zip(res["plant_all"], res["plant_none"]))
    out = {
        "step_us_no_gaps": round(med["loop_none"], 3),
        "step_us_all_gaps": round(med["loop_all"], 3),
        "overhead_ratio": round(ratio - 1.0, 4),
        "plant_step_us_no_gaps": round(med["plant_none"], 3),
        "plant_step_us_all_gaps": round(med["plant_all"], 3),
        "plant_overhead_ratio": round(p_ratio - 1.0, 4),
        "gap_us_per_step": round(med["plant_all"] - med["plant_none"], 3),
        "goal_overhead_ratio": 0.20,
        "steps_per_round": n,
        "rounds": rounds,
        "signals": {"outputs": spec.n_outputs, "inputs": spec.n_inputs},
        "quick": args.quick,
    }
    out.update(allocations(full, spec.n_inputs, spec.n_outputs, n, step_s))
    for k in ("loop_none", "loop_all", "plant_none", "plant_all"):
        print(f"{k:11s} us/step per round: " + " ".join(f"{v:.3f}" for v in res[k]))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
