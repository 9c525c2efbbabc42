"""Where the vector env's step time goes: CPU time per instance-step of each stage (issue 18, Gym).

Scenario and N as benchmarks/gym_speed.py (configs/bioreactor_gym.toml, every gap, N = 1024),
one thread (the serial fused env), process CPU time, every side interleaved with the order
rotated, warm-up call, >= 3 repeats (benchmarks/fair.py). Interleaving means every side finds
its data evicted by the others (~75 kB of gap records per instance, ~75 MB in all, mostly
delay rings of which a step reads a few lines): each figure is a
step from cold caches, the regime gym_speed.py measures. Sides, us per instance-step:

    step                  HilVectorEnv.step (fused, one thread): the goal's work
    fused_kernel          its compiled call alone (hil/gym/fused.py gym_step)
    fused_without_loop    the same call with every instance resetting, so that row_step is
                          skipped: profiles, action, features, reward, stops, prefetch
    loop_batch_step       the loop's own batch kernel alone (row_step over the rows: clip,
                          gaps, plant, correction, outputs, recording row; no prefetch)
    plant                 the plant's step + outputs alone (RK4 sub-steps of plants/bioreactor.py,
                          rows of X, u, p): the floor no gap or env work can go under
    actuation_gaps        the actuation delay + actuator gap alone, as the fused step runs them: the
                          kernels generated for the scenario (hil/gaps/specialize.py actuate_spec) on
                          the record layout of hil/gaps/compact.py
    sensing_gaps          the sensor gap + observation delay alone (specialize.py sense_spec)

and derived: python_per_call = step - fused_kernel (argument binding, autoreset check, info
arrays), gaps = actuation_gaps + sensing_gaps, "hot" figures of the plant and gap stages (each
repeated on its own, data staying in cache) to separate their compute from their cache misses.
Answers are not compared here (gym_speed.py and tests/hil/gym/test_fused.py do); the stages
run on copies of the env's arrays.

Human-readable lines go to stderr; the last line of stdout is one JSON object.
Usage: python benchmarks/gym_stages.py [--quick] [--n 1024]
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

from numba import njit  # noqa: E402

import hil.gym  # noqa: E402
from hil.gaps.specialize import specialised_gaps  # noqa: E402
from hil.gym.prefetch import block_of, row_of  # noqa: E402
from hil.loop.step import fused_kernels  # noqa: E402

CONFIG = ROOT / "configs" / "bioreactor_gym.toml"


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def plant_rows(step, outputs):
    """The plant's step and outputs over every row (scratch W[0]), compiled for these kernels."""

    @njit(nogil=True)
    def run(t, X, U, P, Y, W, dt, n_sub):
        for i in range(X.shape[0]):
            step(t, row_of(X, i), row_of(U, i), row_of(P, i), dt, n_sub, block_of(W, 0))
            outputs(row_of(X, i), row_of(U, i), row_of(P, i), row_of(Y, i))

    return run


def gap_rows(mod):
    """The scenario's generated gap kernels (hil/gaps/specialize.py, what the fused step calls)
    over every record row."""
    actuate_spec, sense_spec = mod.actuate_spec, mod.sense_spec

    @njit(nogil=True)
    def actuate_rows(t, REC, U, Uapp):
        for i in range(REC.shape[0]):
            actuate_spec(row_of(REC, i), t, row_of(U, i), row_of(Uapp, i))

    @njit(nogil=True)
    def sense_rows(t, REC, Y, Ymeas):
        for i in range(REC.shape[0]):
            sense_spec(row_of(REC, i), t, row_of(Y, i), row_of(Ymeas, i))

    return actuate_rows, sense_rows


def hot(fn, calls: int, n: int, repeats: int) -> float:
    """Median over repeats of CPU us per instance-step, `calls` calls in a row (warm caches)."""
    out = []
    for _ in range(repeats):
        c0 = time.process_time_ns()
        for _ in range(calls):
            fn()
        out.append((time.process_time_ns() - c0) / 1e3 / calls / n)
    return float(np.median(out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run (few blocks; figures indicative only)")
    ap.add_argument("--n", type=int, default=1024, help="instances (default 1024, gym_speed.py's)")
    args = ap.parse_args(argv)
    q, n = args.quick, args.n
    load0 = os.getloadavg()[0]
    v = hil.gym.make_vec(CONFIG, n, episode_s=100_000.0, parallel=False)
    if not v.fused:
        raise AssertionError("the vector env is not fused here: nothing to profile")
    v.reset(seed=0)
    vals = {"agitation_power": 30.0, "base_flow": 0.0003}
    a = np.tile(np.array([vals.get(k, 0.0) for k in v.action_names]), (n, 1))
    v.step(a)  # binds the fused calls
    m = v.model
    fn, fargs = v._fused_calls[0]
    # the fused call with row_step skipped: every row "autoresetting" (the kernel clears the flag)
    autoreset = fargs[1]
    if autoreset is not v.autoreset and not np.shares_memory(autoreset, v.autoreset):
        raise AssertionError("the fused call's second argument is not the env's autoreset array")
    v2 = hil.gym.make_vec(CONFIG, n, episode_s=100_000.0, parallel=False)
    v2.reset(seed=0)
    v2.step(a)
    fn2, fargs2 = v2._fused_calls[0]

    def without_loop():
        v2.autoreset[:] = True
        fn2(*fargs2)

    kern = fused_kernels(m.plant_model)
    c = v.corr
    K3, Tp3, X3, Z3, D3, P3 = v.K.copy(), v.Tp.copy(), v.X.copy(), v.Z.copy(), v.D.copy(), v.P.copy()
    Uc3, Ucl3, Ua3, Y3, Ym3 = v.Ucmd.copy(), v.Uclip.copy(), v.Uapp.copy(), v.Y.copy(), v.Ymeas.copy()
    g = v.template  # the loop's own layout: one arena per instance
    Aa3, As3 = np.repeat(g._act_buf[None, :], n, axis=0), np.repeat(g._sense_buf[None, :], n, axis=0)
    args_k = (*kern.prefix, np.ones(n, bool), K3, Tp3, X3, Z3, D3, P3, Uc3, Ucl3, Ua3, Y3, Ym3, v.W.copy(), (),
              Aa3, As3, v.counts.copy(), v.status.copy(), m.u_lo, m.u_hi, m.x_lo, m.x_hi, m.x_tol, v.Xout.copy(),
              c[0], c[1], c[2], c[3], v.C_incr.copy(), v.Rows.copy(), m.step_s, m.dt_plant, m.substeps)
    plant = plant_rows(m.plant_step, m.plant_outputs)
    Xp, Up, Pp, Yp = v.X.copy(), v.Uapp.copy(), v.P.copy(), v.Y.copy()
    Wp = np.zeros((1, 5, m.n_x))
    gc = v.gaps
    rec_a, rec_s = gc.REC.copy(), gc.REC.copy()
    actuate_rows, sense_rows = gap_rows(specialised_gaps(gc))
    Ui, Uo, Yi, Yo = v.Uclip.copy(), v.Uapp.copy(), v.Y.copy(), v.Ymeas.copy()
    Ui[:] = v.Uapp
    clock = {"plant": float(v.K[0]), "act": float(v.K[0]) * m.step_s, "sen": float(v.K[0] + 1) * m.step_s}

    def plant_side():
        clock["plant"] += m.dt_plant
        plant(clock["plant"], Xp, Up, Pp, Yp, Wp, m.dt_plant, m.substeps)

    def act_side():
        clock["act"] += m.step_s
        actuate_rows(clock["act"], rec_a, Ui, Uo)

    def sen_side():
        clock["sen"] += m.step_s
        sense_rows(clock["sen"], rec_s, Yi, Yo)

    sides = {"step": lambda: v.step(a), "fused_kernel": lambda: fn(*fargs), "fused_without_loop": without_loop,
             "loop_batch_step": lambda: kern.batch_step_serial(*args_k), "plant": plant_side,
             "actuation_gaps": act_side, "sensing_gaps": sen_side}
    rep = 3 if q else 5
    blocks = 3 if q else 20
    cpu = fair.interleaved(sides, {k: n for k in sides}, blocks, rep, clock=fair.PROCESS)
    med = {k: r["median"] for k, r in cpu.items()}
    calls = 3 if q else max(20, 40_000 // n)
    hot_us = {"plant": hot(plant_side, calls, n, rep), "actuation_gaps": hot(act_side, calls, n, rep),
              "sensing_gaps": hot(sen_side, calls, n, rep), "fused_kernel": hot(lambda: fn(*fargs), calls, n, rep)}
    derived = {"python_per_call": med["step"] - med["fused_kernel"],
               "gaps": med["actuation_gaps"] + med["sensing_gaps"],
               "gaps_hot": hot_us["actuation_gaps"] + hot_us["sensing_gaps"],
               "env_work_in_kernel": med["fused_without_loop"],
               "loop_step_in_kernel": med["fused_kernel"] - med["fused_without_loop"]}
    for k, r in cpu.items():
        log(f"{k:20s} {r['median']:.3f} us per instance-step (min {r['min']:.3f}, max {r['max']:.3f})")
    for k, x in hot_us.items():
        log(f"{k + ' (hot)':20s} {x:.3f} us per instance-step")
    for k, x in derived.items():
        log(f"{k:20s} {x:.3f} us per instance-step (derived)")
    print(json.dumps({
        "load_average_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "scenario": str(CONFIG.relative_to(ROOT)), "instances": n, "quick": q,
        "arena_items_per_instance": {"actuation": int(g._act_buf.size), "sensing": int(g._sense_buf.size)},
        "layout": {"record_items_per_instance": int(gc.REC.shape[1]), "record_hot_items": int(gc.hot_items),
                   "shared_items_per_block": int(gc.SP[0].size), "drawn_rows": [list(r) for r in gc.drawn_rows]},
        "ring_slots": {"actuation": int(v.template.actuation.m), "observation": int(v.template.observation.m)},
        "cpu_us_per_instance_step": cpu, "hot_us_per_instance_step": hot_us, "derived_us": derived,
        "timing": {"clock": "process CPU time, one thread, sides interleaved (cold caches), order rotated",
                   "blocks": blocks, "repeats": rep, "warmup_call": True},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
