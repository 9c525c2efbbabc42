"""Env steps per second of hil.gym: the single env, the vector env, and a plain Python loop.

Scenario: configs/bioreactor_gym.toml (the bioreactor with every gap of bioreactor_gaps.toml:
sensor chains, actuator chains, observation and actuation delays, per-episode randomization;
reward expression, features, limits). Every figure is env steps (= plant steps of 1 s, with
every gap) per wall second, measured in this run on this machine:

    single_steps_per_s        HilEnv.step, one instance (what a single-env trainer gets)
    vector_steps_per_s        {"1": .., "64": .., "1024": ..}: HilVectorEnv.step, N instances
                              (steps/s counts all N)
    python_loop_steps_per_s   N separate HilEnv instances stepped one by one in a Python loop
                              (the reference: what a vector env made of single envs costs,
                              e.g. gymnasium's SyncVectorEnv; N = 64)
    kernel_steps_per_s        the batch kernel alone at N = 1024 (no reward, features, info)
    cpu_us_per_instance_step  THE load-independent figure and the goal's: CPU time per
                              instance-step, {name: median, min, max over repeats}:
                              "vector_1024" (HilVectorEnv.step, N = 1024, as made by default: the
                              whole step compiled, hil/gym/fused.py: kernel, features, reward,
                              stops, info; one block of rows per core from Python threads; every
                              thread of this process), "vector_1024_serial" (the same fused
                              step on the calling thread), "vector_1024_numpy" (the step before
                              hil/gym/fused.py, kept as fused=False: the loop's batch kernel plus
                              numpy over the rows, on the calling thread), "kernel_serial_1024"
                              (the loop's batch kernel alone), "python_loop" (N single envs
                              stepped in a Python loop, the SyncVectorEnv-style reference).
                              Process CPU time (every thread), every side interleaved, order
                              rotated; warm-up call first, >= 3 repeats of blocks (benchmarks/fair.py)
    ratio_python_loop_over_vector  python_loop / vector_1024 CPU time per instance-step
    ratio_numpy_over_fused    vector_1024_numpy / vector_1024_serial (the fused step's gain, both
                              on one thread)
    answers_agree             the fused and the numpy step gave identical observations, rewards
                              and stops over 20 steps of 1024 instances (checked before timing;
                              no figure is reported otherwise)
    goal_us_per_instance_step 2.0 (= 1e6 instance-steps/s on 2 free cores)
    goal_met                  cpu_us_per_instance_step["vector_1024"] median <= the goal

Wall-clock rates (steps per wall second; best of `--repeats`, they depend on the machine's
load, so no goal is computed from them; the vector env's blocks need both cores at once and
suffer most from other processes): single_steps_per_s, vector_steps_per_s
{"1","64","1024"}, python_loop_steps_per_s, kernel_steps_per_s.

Human-readable lines go to stderr; the last line of stdout is one JSON object.
`--quick` is a smoke run (few blocks; its figures are not results: results.py refuses to
store a result marked quick).
Usage: python benchmarks/gym_speed.py [--quick] [--repeats 5]
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
sys.path.insert(0, str(ROOT / "benchmarks"))

import fair  # noqa: E402

import numba  # noqa: E402

import hil.gym  # noqa: E402
from hil.loop.step import fused_kernels  # noqa: E402  (the kernel alone)

CONFIG = ROOT / "configs" / "bioreactor_gym.toml"
GOAL_US_PER_INSTANCE_STEP = 2.0  # CPU us per instance-step on the vector env (1e6 steps/s on 2 free cores)


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run; figures indicative only)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    q = args.quick
    load0 = os.getloadavg()[0]
    rep = 3 if q else max(3, args.repeats)
    episode = 100_000.0  # long episodes: the timing is of steps, not of resets

    env = hil.gym.make(CONFIG, episode_s=episode)
    env.reset(seed=0)
    a1 = _action(env.action_names)
    env.step(a1)
    single = best_rate(lambda: env.step(a1), 1, 200 if q else 2000, rep)
    log(f"single env: {single:,.0f} steps/s (wall)")

    n_loop = 8 if q else 64
    envs = [hil.gym.make(CONFIG, episode_s=episode) for _ in range(n_loop)]
    for i, e in enumerate(envs):
        e.reset(seed=i)

    def loop_step():
        for e in envs:
            e.step(a1)

    loop_rate = best_rate(loop_step, n_loop, 5 if q else 20, rep)
    log(f"python loop over {n_loop} single envs: {loop_rate:,.0f} steps/s (wall)")

    vec = {}
    for n in (1, 64, 1024):
        v = hil.gym.make_vec(CONFIG, n, episode_s=episode)
        v.reset(seed=0)
        a = _action(v.action_names, n)
        v.step(a)  # warm-up (compilation, first touch)
        calls = max(3, (20_000 if q else 60_000) // n)
        vec[str(n)] = best_rate(lambda: v.step(a), n, calls, rep)
        log(f"vector env N = {n}: {vec[str(n)]:,.0f} steps/s (wall)")
    m = v.model
    c = v.corr
    kern = fused_kernels(m.plant_model)  # the loop's batch kernel (specialised to the plant, cached)
    batch_step, batch_step_serial = kern.batch_step, kern.batch_step_serial
    # on the loop's own layout (one gap arena per instance): the fused env keeps the shared one
    g = v.template
    Aact, Asen = np.repeat(g._act_buf[None, :], 1024, axis=0), np.repeat(g._sense_buf[None, :], 1024, axis=0)
    args_k = (*kern.prefix, v.run, v.K, v.Tp, v.X, v.Z, v.D, v.P,
              v.Ucmd, v.Uclip, v.Uapp, v.Y, v.Ymeas, v.W, (), Aact, Asen, v.counts, v.status, m.u_lo,
              m.u_hi, m.x_lo, m.x_hi, m.x_tol, v.Xout, c[0], c[1], c[2], c[3], v.C_incr, v.Rows, m.step_s,
              m.dt_plant, m.substeps)
    kernel = best_rate(lambda: batch_step(*args_k), 1024, max(3, (20_000 if q else 60_000) // 1024), rep)
    log(f"batch kernel alone N = 1024: {kernel:,.0f} steps/s (wall)")

    # the fused step on one thread and the numpy path it replaced, checked to agree first
    n_big = 1024
    v_serial = hil.gym.make_vec(CONFIG, n_big, episode_s=episode, parallel=False)
    v_numpy = hil.gym.make_vec(CONFIG, n_big, episode_s=episode, parallel=False, fused=False)
    if not (v.fused and v_serial.fused) or v_numpy.fused:
        raise AssertionError("the vector env is not fused (or the reference is): nothing to compare")
    a_big = _action(v.action_names, n_big)
    o1, _ = v_serial.reset(seed=0)
    o2, _ = v_numpy.reset(seed=0)
    agree = bool(np.array_equal(o1, o2))
    for _ in range(20):
        r1, r2 = v_serial.step(a_big), v_numpy.step(a_big)
        agree &= all(np.array_equal(x, y) for x, y in zip(r1[:4], r2[:4]))
    if not agree:
        raise AssertionError("fused and numpy steps disagree: no timing is reported for different answers")

    # the load-independent figure: CPU time (all threads) per instance-step, warm-up, interleaved repeats
    # Every side interleaved, process CPU time (every thread): the vector env's second core is a
    # Python thread that blocks between steps (no OpenMP region here, so no worker spins after
    # one and charges the next block), and the other sides run on this thread alone.
    if any(not e.fused and e._kernel is batch_step for e in (v, v_serial, v_numpy)):
        raise AssertionError("a timed env steps through a prange: its spin-waiting would be charged to other sides")
    blocks = 3 if q else 20
    sides = {"vector_1024": lambda: v.step(a), "vector_1024_serial": lambda: v_serial.step(a_big),
             "vector_1024_numpy": lambda: v_numpy.step(a_big), "kernel_serial_1024": lambda: batch_step_serial(*args_k),
             "python_loop": loop_step}
    cpu = fair.interleaved(sides, {"vector_1024": 1024, "vector_1024_serial": n_big, "vector_1024_numpy": n_big,
                                   "kernel_serial_1024": 1024, "python_loop": n_loop}, blocks, rep, clock=fair.PROCESS)
    us = cpu["vector_1024"]["median"]
    goal_met = us <= GOAL_US_PER_INSTANCE_STEP
    ratio_loop = fair.ratio(cpu["python_loop"], cpu["vector_1024"])
    ratio_fused = fair.ratio(cpu["vector_1024_numpy"], cpu["vector_1024_serial"])
    for k, r in cpu.items():
        log(f"CPU per instance-step, {k}: {r['median']:.3f} us (min {r['min']:.3f}, max {r['max']:.3f} over {rep} repeats)")
    log(f"goal <= {GOAL_US_PER_INSTANCE_STEP} us per instance-step on the vector env: "
        f"{'met' if goal_met else 'NOT met'} ({us:.3f} us); Python loop / vector = {ratio_loop:.1f}; "
        f"numpy path / fused (1 thread) = {ratio_fused:.2f}")
    result = {
        "load_average_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "scenario": str(CONFIG.relative_to(ROOT)),
        "gaps": "all of bioreactor_gaps.toml (sensors, actuators, latency, randomization)",
        "threads": numba.get_num_threads(),
        "quick": q,
        "cpu_us_per_instance_step": cpu,
        "ratio_python_loop_over_vector": ratio_loop,
        "ratio_numpy_over_fused": ratio_fused,
        "answers_agree": agree,
        "timing": {"clock": "process CPU time (every thread), all sides interleaved, order rotated",
                   "blocks": blocks, "repeats": rep, "warmup_call": True},
        "goal_us_per_instance_step": GOAL_US_PER_INSTANCE_STEP,
        "goals_met": {"cpu_us_per_instance_step": goal_met},
        "goal_met": goal_met,
        "single_steps_per_s": round(single),
        "vector_steps_per_s": {k: round(r) for k, r in vec.items()},
        "python_loop_steps_per_s": round(loop_rate),
        "python_loop_envs": n_loop,
        "kernel_steps_per_s": round(kernel),
        "headline": [
            {"figure": "CPU per instance-step, vector env N = 1024 (all threads)", "hil": us,
             "peer": cpu["python_loop"]["median"], "peer_name": f"{n_loop} single envs in a Python loop",
             "ratio": ratio_loop, "unit": "us", "goal": GOAL_US_PER_INSTANCE_STEP, "met": goal_met},
            {"figure": "CPU per instance-step, vector env N = 1024, 1 thread (fused)",
             "hil": cpu["vector_1024_serial"]["median"], "peer": cpu["vector_1024_numpy"]["median"],
             "peer_name": "the same env, numpy path (fused=False)", "ratio": ratio_fused, "unit": "us"},
            {"figure": "CPU per instance-step, batch kernel alone (1 thread)", "hil": cpu["kernel_serial_1024"]["median"],
             "unit": "us"},
        ],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
