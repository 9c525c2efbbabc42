"""Env steps per second of hil.gym: the single env, the vector env, and a plain Python loop.

Scenario: configs/bioreactor_gym.toml (the bioreactor with every gap of bioreactor_gaps.toml:
sensor chains, actuator chains, observation and actuation delays, per-episode randomization;
reward expression, features, limits). Every figure is env steps (= plant steps of 1 s, with
every gap) per wall second, measured in this run on this machine:

    single_steps_per_s        HilEnv.step, one instance (what a single-env trainer gets)
    vector_steps_per_s        {"1": .., "64": .., "1024": ..}: HilVectorEnv.step, N instances
                              in one prange call (steps/s counts all N)
    python_loop_steps_per_s   N separate HilEnv instances stepped one by one in a Python loop
                              (the reference: what a vector env made of single envs costs,
                              e.g. gymnasium's SyncVectorEnv; N = 64)
    kernel_steps_per_s        the batch kernel alone at N = 1024 (no reward, features, info)
    kernel_steps_per_cpu_s    the serial kernel at N = 1024 per second of process CPU time: the
                              cost of a step whatever else runs on the machine (x cores = the
                              ceiling of vector_steps_per_s on an idle machine)
    vector_1024_steps_per_cpu_s   the whole vector step (N = 1024) per second of CPU time
    goal_1e6_met              vector_steps_per_s["1024"] >= 1e6

Human-readable lines go to stderr; the last line of stdout is one JSON object.
A shared, loaded machine gives noisy figures: each is the best of `--repeats` timed runs, and
`load_average` (1 min, before and after) says how busy the machine was. The vector env's
parallel region needs both cores at once: with other processes on them its barrier waits
for a descheduled thread, so a loaded machine hurts it far more than the single env.
Usage: python benchmarks/gym_speed.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numba  # noqa: E402

import hil.gym  # noqa: E402
from hil.loop.step import batch_step, batch_step_serial  # noqa: E402  (the kernel alone)

CONFIG = ROOT / "configs" / "bioreactor_gym.toml"


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def _action(names, n=None):
    vals = {"agitation_power": 30.0, "base_flow": 0.0003}
    a = np.array([vals.get(k, 0.0) for k in names])
    return a if n is None else np.tile(a, (n, 1))


def best_rate(fn, steps_per_call: int, calls: int, repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = max(best, steps_per_call * calls / (time.perf_counter() - t0))
    return best


def cpu_rate(fn, steps_per_call: int, calls: int, repeats: int) -> float:
    """Steps per second of this process's CPU time (all its threads), best of `repeats`."""
    best = 0.0
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        best = max(best, steps_per_call * calls / max(time.process_time() - t0, 1e-9))
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run; figures indicative only)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    q = args.quick
    load0 = os.getloadavg()[0]
    rep = 1 if q else args.repeats
    episode = 100_000.0  # long episodes: the timing is of steps, not of resets

    env = hil.gym.make(CONFIG, episode_s=episode)
    env.reset(seed=0)
    a1 = _action(env.action_names)
    env.step(a1)
    single = best_rate(lambda: env.step(a1), 1, 200 if q else 2000, rep)
    log(f"single env: {single:,.0f} steps/s")

    n_loop = 8 if q else 64
    envs = [hil.gym.make(CONFIG, episode_s=episode) for _ in range(n_loop)]
    for i, e in enumerate(envs):
        e.reset(seed=i)

    def loop_step():
        for e in envs:
            e.step(a1)

    loop_rate = best_rate(loop_step, n_loop, 5 if q else 20, rep)
    log(f"python loop over {n_loop} single envs: {loop_rate:,.0f} steps/s")

    vec = {}
    kernel = None
    for n in (1, 64, 1024):
        v = hil.gym.make_vec(CONFIG, n, episode_s=episode)
        v.reset(seed=0)
        a = _action(v.action_names, n)
        v.step(a)
        calls = max(3, (20_000 if q else 60_000) // n)
        vec[str(n)] = best_rate(lambda: v.step(a), n, calls, rep)
        log(f"vector env N = {n}: {vec[str(n)]:,.0f} steps/s")
        if n == 1024:
            m = v.model
            c = v.corr
            args_k = (v.advance, m.plant_step, v.outputs_of, m.plant_outputs, v.run, v.K, v.Tp, v.X, v.Z, v.D, v.P,
                      v.Ucmd, v.Uclip, v.Uapp, v.Y, v.Ymeas, v.W, (), v.Aact, v.Asen, v.counts, v.status, m.u_lo,
                      m.u_hi, m.x_lo, m.x_hi, m.x_tol, v.Xout, c[0], c[1], c[2], c[3], v.C_incr, v.Rows, m.step_s,
                      m.dt_plant, m.substeps)
            kernel = best_rate(lambda: batch_step(*args_k), n, calls, rep)
            log(f"batch kernel alone N = 1024: {kernel:,.0f} steps/s")
            # CPU cost per step, independent of how busy the machine is: the serial kernel's
            # steps per second of this process's CPU time (and the whole vector step's)
            cpu_kernel = cpu_rate(lambda: batch_step_serial(*args_k), n, calls, rep)
            cpu_vec = cpu_rate(lambda: v.step(a), n, calls, rep)
            log(f"CPU time: serial kernel {cpu_kernel:,.0f} steps per CPU-s, vector step {cpu_vec:,.0f}")
    result = {
        "load_average_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "scenario": str(CONFIG.relative_to(ROOT)),
        "gaps": "all of bioreactor_gaps.toml (sensors, actuators, latency, randomization)",
        "threads": numba.get_num_threads(),
        "quick": q,
        "single_steps_per_s": round(single),
        "vector_steps_per_s": {k: round(r) for k, r in vec.items()},
        "python_loop_steps_per_s": round(loop_rate),
        "python_loop_envs": n_loop,
        "kernel_steps_per_s": round(kernel),
        "kernel_steps_per_cpu_s": round(cpu_kernel),
        "vector_1024_steps_per_cpu_s": round(cpu_vec),
        "vector_speedup_vs_python_loop": round(vec["1024"] / loop_rate, 1),
        "goal_1e6_met": vec["1024"] >= 1e6,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
