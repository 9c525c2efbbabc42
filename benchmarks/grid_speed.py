"""Speed and accuracy of the grid power flow and grid step, with pandapower, PYPOWER and lightsim2grid.

Human-readable lines go to stderr; the last line of stdout is one JSON object:

    case118_solve_ms   hil Newton-Raphson on the reference case118 (tests/data/case118_reference.npz:
                       pandapower's Ybus/Sbus), warm start: a time series where every solve starts
                       from the previous solution and loads follow a +-2 % sinusoid (median, ms)
    case300_solve_ms   the same on configs/grids/case300.m (MATPOWER data, our Ybus)
    case118_iterations / case300_iterations   median Newton iterations per warm solve
    case118_flat_ms    one solve from a flat start on the reference arrays (median, ms)
    max_dvm_pu, max_dva_rad   flat-start solution vs pandapower's on the reference arrays
    grid_step_ms       GridModel.step on case118 (flow + inertial sharing + protection + frequency
                       + thermal), 1 kHz time series with a +-2 % load sinusoid: median, p99, max (ms)
                       and the count of steps longer than 1 ms, wall clock and thread CPU time
                       (cpu_*: the step's own work; wall minus CPU is time the OS ran something else)
    grid_trip_step_ms  a case118 step in which a line opens and protection cascades (median, ms; lines
                       tripped, cascade rounds, Newton iterations) and the PTDF+LODF recomputation after it
    references         each measured in this same run:
        pandapower_runpp_case118_ms   pandapower.runpp(case118()) (median)
        pypower_runpf_case118_ms      PYPOWER runpf on ITS OWN case118 (median; not the same network)
        lightsim2grid_case118_ms      lightsim2grid NRSing_KLU.solve on the reference arrays, same warm
                                      series as ours, Python call wall time (median)
        lightsim2grid_case118_internal_ms   the same, lightsim2grid's own timer (C++ side only)
    goals              the issue's targets
    loop_1khz          (with --loop / --only-loop) the real hil loop (`hil run`, real time) stepping
                       the grid plant (model = "grid", case118, plants/grid/plant.py) at 1 ms steps for
                       --loop-seconds: steps, overruns, overruns_per_10k_steps, lateness_us (p50, p99,
                       p999, max), scheduling obtained; loads follow a +-2 % step profile every 0.5 s;
                       no servers, recording off unless --loop-record; plant_step_us: Plant.step +
                       compute_outputs from Python on the same plant (median, p99)

Usage: python benchmarks/grid_speed.py [--quick] [--loop | --only-loop] [--loop-seconds 10]
Timings are wall clock on whatever else the machine runs; read them as such.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plants.grid.case import PQ, PV, REF, read_matpower  # noqa: E402
from plants.grid.network import GridModel  # noqa: E402
from plants.grid.newton import CONVERGED, NewtonWorkspace, bus_flags  # noqa: E402
from plants.grid.ybus import make_sbus, make_ybus  # noqa: E402

GOALS = dict(case118_solve_ms=0.5, case118_solve_stretch_ms=0.2, case300_solve_ms=2.0, grid_step_budget_ms=1.0,
             max_dvm_pu=1e-6, max_dva_rad=1e-6)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def series(sbus: np.ndarray, k: int) -> np.ndarray:
    """Load/generation injections of step k: +-2 % sinusoid with a 50-step period."""
    return sbus * (1.0 + 0.02 * np.sin(2 * np.pi * k / 50))


def warm_series(ws, ydata, sbus, vm, va, free_va, free_vm, n):
    times, iters = [], []
    for k in range(n):
        s = series(sbus, k)
        t0 = time.perf_counter()
        status = ws.solve(ydata, s, vm, va, free_va, free_vm, 1e-8, 10)
        times.append(time.perf_counter() - t0)
        if status != CONVERGED:
            raise RuntimeError(f"warm solve {k} did not converge ({status})")
        iters.append(ws.stats[0])
    return statistics.median(times) * 1e3, statistics.median(iters)


def bench_reference118(ref, n):
    nb = len(ref["vm_pu"])
    ws = NewtonWorkspace.for_pattern(ref["ybus_indptr"], ref["ybus_indices"])
    free_va, free_vm = bus_flags(nb, ref["ref"], ref["pv"], ref["pq"])
    gen = ref["ppc_gen"]

    def flat():
        vm, va = np.ones(nb), np.zeros(nb)
        vm[gen[:, 0].astype(int)] = gen[:, 5]
        va[ref["ref"]] = np.radians(ref["ppc_bus"][ref["ref"], 8])
        return vm, va

    flat_times = []
    for _ in range(max(5, n // 20)):
        vm, va = flat()
        t0 = time.perf_counter()
        status = ws.solve(ref["ybus_data"], ref["sbus_pu"], vm, va, free_va, free_vm, 1e-10, 20)
        flat_times.append(time.perf_counter() - t0)
        assert status == CONVERGED
    max_dvm = float(np.abs(vm - ref["vm_pu"]).max())
    max_dva = float(np.abs(va - np.radians(ref["va_degree"])).max())
    warm_ms, warm_it = warm_series(ws, ref["ybus_data"], ref["sbus_pu"], vm, va, free_va, free_vm, n)
    return dict(flat_ms=statistics.median(flat_times) * 1e3, warm_ms=warm_ms, iterations=warm_it,
                max_dvm=max_dvm, max_dva=max_dva)


def bench_case300(n):
    case = read_matpower(ROOT / "configs" / "grids" / "case300.m")
    pattern, ydata, _ = make_ybus(case)
    ws = NewtonWorkspace.for_pattern(pattern.indptr, pattern.indices)
    free_va, free_vm = bus_flags(case.n_bus, np.flatnonzero(case.bus_type == REF), np.flatnonzero(case.bus_type == PV),
                                 np.flatnonzero(case.bus_type == PQ))
    vm, va = np.ones(case.n_bus), np.radians(case.va_deg)
    on = case.gen_status > 0
    vm[case.gen_bus[on]] = case.vg_pu[on]
    sbus = make_sbus(case)
    assert ws.solve(ydata, sbus, vm, va, free_va, free_vm, 1e-10, 20) == CONVERGED
    return warm_series(ws, ydata, sbus, vm, va, free_va, free_vm, n)


def bench_grid_step(n):
    case = read_matpower(ROOT / "configs" / "grids" / "case118.m")
    base = GridModel(case).out["i_pu"]
    case.rate_a_mva[:] = np.maximum(2.0 * base * case.base_mva, 50.0)   # protection and thermal active, no trip
    model = GridModel(case)
    times, cpu = [], []
    for k in range(n):
        model.load_scale[:] = 1.0 + 0.02 * np.sin(2 * np.pi * k / 500)
        c0 = time.thread_time()
        t0 = time.perf_counter()
        model.step(1e-3)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    ms = np.array(times) * 1e3
    cpu_ms = np.array(cpu) * 1e3
    assert model.out["n_islands"][0] == 1 and model.out["blackout"][0] == 0
    return dict(median=float(np.median(ms)), p99=float(np.percentile(ms, 99)), max=float(ms.max()),
                over_1ms=int((ms > 1.0).sum()), steps=n, iterations_last=int(model.out["pf_iterations"][0]),
                cpu_median=float(np.median(cpu_ms)), cpu_p99=float(np.percentile(cpu_ms, 99)),
                cpu_max=float(cpu_ms.max()), cpu_over_1ms=int((cpu_ms > 1.0).sum()))


def bench_trip_step(reps):
    """A step in which a line opens and protection trips others (case118, ratings 1.5x base current,
    at least 50 MVA; line 8-5 (row 8) opened): the worst case of a step, several solves and islands."""
    case = read_matpower(ROOT / "configs" / "grids" / "case118.m")
    base = GridModel(case).out["i_pu"]
    case.rate_a_mva[:] = np.maximum(1.5 * base * case.base_mva, 50.0)
    times, cpu, sens = [], [], []
    for _ in range(reps):
        model = GridModel(case)
        model.step(1.0)
        model.sensitivities()
        model.cmd_open[7] = 1
        c0 = time.thread_time()
        t0 = time.perf_counter()
        model.step(1.0)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        t0 = time.perf_counter()
        model.sensitivities()
        sens.append(time.perf_counter() - t0)
    return dict(median=statistics.median(times) * 1e3, cpu_median=statistics.median(cpu) * 1e3,
                tripped=int(model.out["tripped_this_step"][0]), rounds=int(model.out["cascade_rounds"][0]),
                iterations=int(model.out["pf_iterations"][0]), n_islands=int(model.out["n_islands"][0]),
                ptdf_lodf_ms=statistics.median(sens) * 1e3)


def ref_pandapower(reps):
    import pandapower as pp
    import pandapower.networks as pn
    net = pn.case118()
    times = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(reps):
            t0 = time.perf_counter()
            pp.runpp(net)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def ref_pypower(reps):
    from pypower.api import case118, ppoption, runpf
    opt = ppoption(VERBOSE=0, OUT_ALL=0)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        runpf(case118(), opt)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def ref_lightsim2grid(ref, n):
    import scipy.sparse as sp
    from lightsim2grid.algorithm import NRSing_KLU
    nb = len(ref["vm_pu"])
    Y = sp.csc_matrix(sp.csr_matrix((ref["ybus_data"], ref["ybus_indices"], ref["ybus_indptr"]), shape=(nb, nb)))
    solver = NRSing_KLU()
    weights = np.zeros(nb)
    weights[ref["ref"]] = 1.0
    V = ref["V_internal"].copy()
    wall, internal = [], []
    for k in range(n):
        s = series(ref["sbus_pu"], k)
        t0 = time.perf_counter()
        solver.solve(Y, V, s, ref["ref"], weights, ref["pv"], ref["pq"], 10, 1e-8)
        wall.append(time.perf_counter() - t0)
        if not solver.converged():
            raise RuntimeError("lightsim2grid did not converge")
        internal.append(solver.get_timers()[-1])
        V = solver.get_Vm() * np.exp(1j * solver.get_Va())
    return statistics.median(wall) * 1e3, statistics.median(internal) * 1e3


LOOP_SCENARIO = """
[scenario]
name = "grid118_1khz"
[plant]
model = "grid"
case = "{case}"
[loop]
step_s = 0.001
time_scale = 1.0
duration_s = {seconds}
seed = 1
priority = "auto"
cpu = "auto"
[inputs."load.scale"]
driver = "profile"
profile = {profile}
[recording]
path = "{rec}"
"""


def plant_step_us(n: int) -> dict:
    """Plant.step(1 ms) + compute_outputs on the grid plant, from Python (the loop's call)."""
    from plants.base import Plant, load_plant

    model = load_plant("grid", {"case": str(ROOT / "configs" / "grids" / "case118.m")})
    plant = Plant(model, dt=0.001)
    ls = model.spec.indices("inputs", "load.scale")
    times = []
    for k in range(n + 50):
        plant.u[ls] = 1.0 + 0.02 * np.sin(2 * np.pi * k / 500)
        t0 = time.perf_counter()
        plant.step(0.001)
        plant.compute_outputs()
        times.append(time.perf_counter() - t0)
    t = np.array(times[50:]) * 1e6
    return {"median": float(np.median(t)), "p99": float(np.percentile(t, 99)), "max": float(t.max())}


def bench_loop(seconds: float, record: bool) -> dict:
    """The real-time loop at 1 kHz with the grid plant, through `hil run` (its JSON summary)."""
    import subprocess
    import tempfile

    profile = [[round(0.5 * k, 3), 1.0 + (0.02 if k % 2 else -0.02)] for k in range(int(2 * seconds) + 2)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "grid1k.toml"
        path.write_text(LOOP_SCENARIO.format(case=ROOT / "configs" / "grids" / "case118.m", seconds=seconds,
                                             profile=json.dumps(profile), rec=Path(tmp) / "rec"))
        cmd = [sys.executable, "-m", "hil.cli", "run", str(path), "--json", "--quiet"]
        if not record:
            cmd.append("--no-record")
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds * 10 + 120,
                              env={**__import__("os").environ, "OPENBLAS_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"hil run failed: {proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = max(int(summary["steps"]), 1)
    return {"steps": steps, "overruns": summary["overruns"], "overruns_per_10k_steps": 1e4 * summary["overruns"] / steps,
            "late_steps": summary.get("late_steps"), "lateness_us": summary["lateness_us"],
            "scheduling": summary.get("scheduling"), "recording": record, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--loop", action="store_true", help="also run the real-time 1 kHz loop with the grid plant")
    ap.add_argument("--only-loop", action="store_true", help="only the 1 kHz loop part")
    ap.add_argument("--loop-seconds", type=float, default=10.0, help="wall seconds of the loop part (10 = 10k steps)")
    ap.add_argument("--loop-record", action="store_true", help="record the loop run (Parquet) as a user would")
    args = ap.parse_args()
    if args.only_loop:
        step_us = plant_step_us(200 if args.quick else 2000)
        log(f"grid plant step + outputs (Python call, 1 ms): median {step_us['median']:.1f} us, "
            f"p99 {step_us['p99']:.1f} us")
        loop = bench_loop(args.loop_seconds, args.loop_record)
        log(f"hil loop at 1 kHz with the grid plant: {loop['steps']} steps, {loop['overruns']} overruns "
            f"({loop['overruns_per_10k_steps']:.1f} per 10k), lateness p99 {loop['lateness_us']['p99']:.1f} us, "
            f"max {loop['lateness_us']['max']:.1f} us, {loop['scheduling']}")
        print(json.dumps({"loop_1khz": loop, "plant_step_us": step_us}))
        return
    n = 100 if args.quick else 1000
    reps = 3 if args.quick else 10
    with np.load(ROOT / "tests" / "data" / "case118_reference.npz") as d:
        ref = {k: d[k] for k in d.files}
    for k in ("ybus_indices", "ybus_indptr", "ref", "pv", "pq"):
        ref[k] = ref[k].astype(np.int64)

    bench_reference118(ref, 5)  # compile
    r118 = bench_reference118(ref, n)
    log(f"hil case118 (reference arrays): warm {r118['warm_ms']:.4f} ms ({r118['iterations']:.0f} it), "
        f"flat {r118['flat_ms']:.4f} ms, max dVm {r118['max_dvm']:.2e} pu, max dVa {r118['max_dva']:.2e} rad")
    c300_ms, c300_it = bench_case300(n)
    log(f"hil case300: warm {c300_ms:.4f} ms ({c300_it:.0f} it)")
    bench_grid_step(20)
    step = bench_grid_step(n if args.quick else 5000)
    log(f"hil grid step case118 at 1 kHz: median {step['median']:.3f} ms, p99 {step['p99']:.3f} ms, "
        f"max {step['max']:.3f} ms, {step['over_1ms']} of {step['steps']} over 1 ms; thread CPU: median "
        f"{step['cpu_median']:.3f} ms, p99 {step['cpu_p99']:.3f} ms, max {step['cpu_max']:.3f} ms, "
        f"{step['cpu_over_1ms']} over 1 ms")

    bench_trip_step(1)
    trip = bench_trip_step(5 if args.quick else 20)
    log(f"hil trip step case118: {trip['median']:.3f} ms (CPU {trip['cpu_median']:.3f} ms), {trip['tripped']} "
        f"lines tripped in {trip['rounds']} rounds, {trip['iterations']} Newton iterations, "
        f"{trip['n_islands']} islands; PTDF+LODF after it {trip['ptdf_lodf_ms']:.3f} ms")

    references: dict = {}
    for name, fn in (("pandapower_runpp_case118_ms", lambda: ref_pandapower(reps)),
                     ("pypower_runpf_case118_ms", lambda: ref_pypower(reps))):
        try:
            references[name] = fn()
            log(f"{name}: {references[name]:.3f}")
        except ImportError as exc:
            references[name] = None
            log(f"{name}: not installed ({exc.name}); pip install -e '.[bench]'")
    try:
        wall, internal = ref_lightsim2grid(ref, n)
        references["lightsim2grid_case118_ms"] = wall
        references["lightsim2grid_case118_internal_ms"] = internal
        log(f"lightsim2grid NRSing_KLU case118 warm: {wall:.4f} ms wall, {internal:.4f} ms internal")
    except ImportError as exc:
        references["lightsim2grid_case118_ms"] = None
        log(f"lightsim2grid: not installed ({exc.name})")

    result = dict(case118_solve_ms=r118["warm_ms"], case118_iterations=r118["iterations"],
                  case118_flat_ms=r118["flat_ms"], case300_solve_ms=c300_ms, case300_iterations=c300_it,
                  max_dvm_pu=r118["max_dvm"], max_dva_rad=r118["max_dva"], grid_step_ms=step, grid_trip_step_ms=trip,
                  references=references, goals=GOALS)
    if args.loop:
        result["plant_step_us"] = plant_step_us(200 if args.quick else 2000)
        result["loop_1khz"] = bench_loop(args.loop_seconds, args.loop_record)
        log(f"hil loop at 1 kHz with the grid plant: {result['loop_1khz']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
