"""End-to-end time of the shipped campaign (configs/campaigns/bioreactor_faults.toml), measured
on a stratified sample and projected to the whole mix, cold and warm workers in one run.

    python benchmarks/campaign_throughput.py [--campaign FILE] [--scenarios plc,policy]
        [--seeds-per-stratum K] [--workers W] [--modes warm,warm_spawn,warm_nocache,cold] [--check OUT --check-wall-s S]
        [--ab-policy-cache N]   # also: one policy run N times with, N times without the policy's Numba cache
        [--profile-policy N]    # also: one policy run N times on kept processes: CPU per step per process
        [--quick]      # smoke run: 2 strata, 30 min of batch per run; its times are no figure

Strata: one per (scenario, fault) of the campaign and one per canary. The sample is the first K
seeds of every stratum (the no-fault stratum takes the same seeds, so every sampled faulted
run has its twin) and the first seed of every canary. Each mode runs the sample end to end
(`run_campaign`, then `write_reports`: start-up, runs, paired criteria, reports) on W local
workers into a fresh directory:

- warm: the local pool as `hil campaign run` uses it (each worker started once: imports and the
  Numba cache paid once per worker; lockstep runs fork their recorder; policy runs reuse the
  worker's policy and safety processes, reset per run, hil/campaign/warm_procs.py; a fresh
  pair loads the policy's Numba kernel from the worker's cache, hil/campaign/warm.py);
- warm_spawn: the same pool with every policy run starting its own policy and safety processes
  (the warm pool before hil/campaign/warm_procs.py: the "before" of that change, same run);
- warm_nocache: the warm_spawn pool with every policy run compiling the policy's kernel (the
  warm pool before hil/campaign/warm.py: the "before" of that change, measured in the same run);
- cold: a fresh worker process per run (`max_tasks_per_child = 1`): imports and the Numba cache
  paid by every run, the policy's kernel compiled by every policy run.
Modes run one after the other in the order given (a mode is minutes; the load average before
and after is printed: this machine is shared). `helpers_start_stop_s` says what starting and
stopping a run's helpers costs per run (the run's own phase marks: Runtime.run start to its
on_started, on_stopping to its end; with kept processes: their reset and parking), and
`projected_full_s_helpers_free` is the projection with that time taken out of every run.

Projection of the full mix (per mode): sum over strata of N_stratum x mean run wall time of the
stratum / W, plus the sample's measured overhead (its end-to-end time minus its run time / W:
pool start, result handling, the imbalance of the last runs; counted once) plus the reports
(their measured time per run x all runs). `--check OUT --check-wall-s S` compares the projection
with a full run of the same selection done earlier (its results in OUT, its end-to-end wall time
S, e.g. from `time hil campaign run ...`): the projection error is printed, since a projection
nobody checked is not a figure. The reference measured in the same run is the cold mode.

Last line: one JSON object: per mode the sample's end-to-end s, mean run wall s per scenario,
projected_full_s, and the goal (the issue's 900 s, stretch 600 s for the 600-run campaign on 2
cores) with `met`; the 1-minute load average before and after (this machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL_S, STRETCH_S = 900.0, 600.0


def strata(runs) -> dict:
    """(scenario, fault) -> run specs, canaries each their own stratum."""
    out: dict = defaultdict(list)
    for r in runs:
        out[(r.scenario, r.fault)].append(r)
    return dict(out)


def sample(groups: dict, k: int) -> list:
    picked = []
    for (_sc, fault), rs in groups.items():
        rs = sorted(rs, key=lambda r: r.seed)
        picked += rs[:1] if fault.startswith("canary.") else rs[:k]
    return picked


def project(groups: dict, results: list[dict], workers: int, e2e_s: float, report_s: float) -> dict:
    """The full selection's end-to-end time from the sample's per-stratum mean run time."""
    by = defaultdict(list)
    for res in results:
        by[(res["run"]["scenario"], res["run"]["fault"])].append(float(res["wall_s"]))
    run_s = sum(float(res["wall_s"]) for res in results)
    overhead_s = max(0.0, e2e_s - report_s - run_s / workers)
    missing = [f"{s}.{f}" for (s, f) in groups if not by.get((s, f))]
    if missing:
        raise RuntimeError(f"no sampled result for {', '.join(missing)}")
    full_run_s = sum(len(rs) * (sum(by[key]) / len(by[key])) for key, rs in groups.items())
    n_full = sum(len(rs) for rs in groups.values())
    proj = overhead_s + full_run_s / workers + report_s / max(1, len(results)) * n_full
    return {"projected_full_s": round(proj, 1), "full_runs": n_full, "overhead_s": round(overhead_s, 2),
            "reports_s": round(report_s, 2)}


def helper_share(groups: dict, results: list[dict], workers: int) -> float:
    """The full selection's helper start and stop time (phases_s start_s + stop_s) per worker:
    per stratum, its number of runs x the sample's mean, summed, / workers."""
    by = defaultdict(list)
    for r in results:
        ph = r.get("phases_s") or {}
        by[(r["run"]["scenario"], r["run"]["fault"])].append(ph.get("start_s", 0.0) + ph.get("stop_s", 0.0))
    return sum(len(rs) * sum(by[k]) / len(by[k]) for k, rs in groups.items() if by.get(k)) / workers


def mean_phases(results: list[dict]) -> dict:
    """scenario -> phase -> mean wall s (hil/campaign/worker.py PhaseClock)."""
    by: dict = defaultdict(lambda: defaultdict(list))
    for r in results:
        for k, v in (r.get("phases_s") or {}).items():
            by[r["run"]["scenario"]][k].append(float(v))
    return {sc: {k: round(sum(v) / len(v), 3) for k, v in ph.items()} for sc, ph in by.items()}


MODES = {"warm": {}, "warm_spawn": {"warm_processes": False},
         "warm_nocache": {"policy_cache": False, "warm_processes": False}, "cold": {"cold": True}}


def run_mode(c, picked: list, workers: int, mode: str, tmp: Path) -> tuple[list[dict], float, float]:
    from hil.campaign.report import write_reports
    from hil.campaign.runner import run_campaign

    out = tmp / mode
    t0 = time.monotonic()
    res = run_campaign(c, out, workers=workers, progress=False, only=[r.run_id for r in picked], **MODES[mode])
    t1 = time.monotonic()
    write_reports(c, res, out)
    t2 = time.monotonic()
    errors = [r["run"]["run_id"] + ": " + str(r.get("error")) for r in res if r.get("verdict") == "error"]
    if errors:
        raise RuntimeError("runs errored (no timing for runs that did not run): " + "; ".join(errors[:5]))
    return res, t2 - t0, t2 - t1


def check(groups: dict, out_dir: Path, wall_s: float, projected_s: float) -> dict:
    """The projection against a full run of the same selection (its results and its wall time)."""
    done = [json.loads(p.read_text()) for p in (out_dir / "results").glob("*.json")]
    ids = {r.run_id for rs in groups.values() for r in rs}
    have = [d for d in done if d["run"]["run_id"] in ids and d.get("verdict") != "error"]
    return {"full_run_dir": str(out_dir), "full_runs_found": len(have), "full_runs_expected": len(ids),
            "full_wall_s": wall_s, "full_mean_run_s": round(sum(d["wall_s"] for d in have) / max(1, len(have)), 3),
            "projection_error": round(projected_s / wall_s - 1.0, 3)}


def _ab_one(run, out_dir: str, cached: bool) -> dict:
    """In a pool worker (hil.campaign.executors._worker_init): one run with or without the
    worker's policy Numba cache; its wall s, the CPU s of its child processes, its digest."""
    import resource

    from hil.campaign import executors, worker

    worker.WARM_POLICY_CACHE = cached
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = worker.execute_run(executors._CAMPAIGN, run, out_dir)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cached": res["warm"]["policy_numba_cache"], "wall_s": res["wall_s"], "digest": res.get("digest"),
            "error": res.get("error"), "children_cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 3)}


def ab_policy_cache(c, repeats: int, tmp: Path) -> dict:
    """The first no-fault policy run of the campaign, alternately with and without the policy's
    Numba cache (B A B A ...), in one warm pool worker, after one untimed run that builds the cache:
    median (min, max) wall s and CPU s of the run's child processes (policy, safety, recorder;
    RUSAGE_CHILDREN: less inflated by the machine's load than wall time). Digests checked equal."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp
    from statistics import median

    from hil.campaign.executors import _worker_init
    from hil.campaign.expand import expand
    from hil.campaign.schema import controller_of, load_scenario_ref

    policy_sc = [ref.name for ref in c.scenarios if controller_of(ref, load_scenario_ref(c, ref)) == "policy"]
    if not policy_sc:
        raise RuntimeError("--ab-policy-cache: the campaign has no policy scenario")
    run = next(r for r in expand(c) if r.fault == "none" and r.scenario == policy_sc[0])
    arms: dict = {True: [], False: []}
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                             initargs=(c, True)) as pool:
        pool.submit(_ab_one, run, str(tmp / "ab"), True).result()  # untimed: builds the cache
        for i in range(2 * repeats):
            cached = i % 2 == 1
            arms[cached].append(pool.submit(_ab_one, run, str(tmp / "ab"), cached).result())
    allr = arms[True] + arms[False]
    errors = [r["error"] for r in allr if r["error"]]
    if errors:
        raise RuntimeError(f"A/B run errored: {errors[0]}")
    if len({r["digest"] for r in allr}) != 1:
        raise RuntimeError("A/B runs with and without the cache recorded different runs")
    if not all(r["cached"] for r in arms[True]) or any(r["cached"] for r in arms[False]):
        raise RuntimeError("the cache was not (or not only) where it was meant to be")

    def stat(vals):
        return {"median": round(median(vals), 3), "min": round(min(vals), 3), "max": round(max(vals), 3)}

    out = {"run": run.run_id, "repeats": repeats}
    for key in ("wall_s", "children_cpu_s"):
        a, b = [r[key] for r in arms[False]], [r[key] for r in arms[True]]
        out[key] = {"compiled": stat(a), "cached": stat(b), "compiled_over_cached": round(median(a) / median(b), 3)}
    return out


def _proc_cpu(pid: int) -> tuple[float, int]:
    """(user + system CPU s, voluntary context switches) of a live process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/status") as f:
        vol = next(int(line.split(":")[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
    return cpu, vol


def _profile_one(run, out_dir: str) -> dict:
    """In a warm pool worker (kept processes on): one policy run; its wall s, steps, and the CPU s
    and voluntary context switches of the loop (this worker process, every thread: the loop's and
    zmq's), the recorder (a forked child, reaped at the run's end) and the kept policy and safety
    processes (every thread) over the run, with its digest."""
    import resource

    from hil.campaign import executors, worker

    k = worker._KEEPER
    before = {pid: _proc_cpu(pid) for pid in (k.pids() if k else [])}
    s0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    res = worker.execute_run(executors._CAMPAIGN, run, out_dir)
    s1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {"wall_s": res["wall_s"], "loop_s": (res.get("phases_s") or {}).get("loop_s"), "digest": res.get("digest"),
           "error": res.get("error"), "processes": ((res.get("warm") or {}).get("processes") or {}).get("processes"),
           "steps": (res.get("summary") or {}).get("steps"),
           "cpu_s": {"loop": s1.ru_utime + s1.ru_stime - s0.ru_utime - s0.ru_stime,
                     "recorder": c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime},
           "vol_ctxsw": {"loop": s1.ru_nvcsw - s0.ru_nvcsw}}
    for role, pid in zip(("policy", "safety"), worker._KEEPER.pids()):
        if pid in before:  # a pair reset for this run (a fresh pair's start-up is not the run's loop)
            (a, va), (b, vb) = before[pid], _proc_cpu(pid)
            out["cpu_s"][role], out["vol_ctxsw"][role] = b - a, vb - va
    return out


def profile_policy(c, repeats: int, tmp: Path) -> dict:
    """Where a lockstep policy run's time goes: the first no-fault policy run of the campaign
    `repeats` times on the kept processes of one warm pool worker (after one untimed run that
    spawns them): median (min, max) over the runs of the CPU us per step of each process (loop,
    recorder, policy, safety; threads included), their sum, the wall us per step, and the
    voluntary context switches per step (each one a wake-up). Digests checked equal."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp
    from statistics import median

    from hil.campaign.executors import _worker_init
    from hil.campaign.expand import expand
    from hil.campaign.schema import controller_of, load_scenario_ref

    policy_sc = [ref.name for ref in c.scenarios if controller_of(ref, load_scenario_ref(c, ref)) == "policy"]
    if not policy_sc:
        raise RuntimeError("--profile-policy: the campaign has no policy scenario")
    run = next(r for r in expand(c) if r.fault == "none" and r.scenario == policy_sc[0])
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                             initargs=(c, True, True)) as pool:
        pool.submit(_profile_one, run, str(tmp / "profile")).result()  # untimed: spawns the kept pair
        got = [pool.submit(_profile_one, run, str(tmp / "profile")).result() for _ in range(repeats)]
    errors = [g["error"] for g in got if g["error"]]
    if errors:
        raise RuntimeError(f"profiled run errored: {errors[0]}")
    if len({g["digest"] for g in got}) != 1 or any(g["processes"] != "reset" for g in got):
        raise RuntimeError("profiled runs differ, or did not run on the kept processes")

    def stat(vals):
        return {"median": round(median(vals), 1), "min": round(min(vals), 1), "max": round(max(vals), 1)}

    steps = got[0]["steps"]
    if not steps:
        raise RuntimeError("profiled run has no step count in its summary")
    roles = ("loop", "recorder", "policy", "safety")
    out = {"run": run.run_id, "repeats": repeats, "steps": steps,
           "cpu_us_per_step": {r: stat([g["cpu_s"][r] / steps * 1e6 for g in got]) for r in roles},
           "vol_ctxsw_per_step": {r: stat([g["vol_ctxsw"][r] / steps for g in got]) for r in ("loop", "policy", "safety")},
           "loop_wall_us_per_step": stat([g["loop_s"] / steps * 1e6 for g in got])}
    out["cpu_us_per_step"]["total"] = stat([sum(g["cpu_s"][r] for r in roles) / steps * 1e6 for g in got])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--campaign", default=str(ROOT / "configs/campaigns/bioreactor_faults.toml"))
    ap.add_argument("--scenarios", default="", help="comma-separated scenario names (default: all)")
    ap.add_argument("--seeds-per-stratum", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--modes", default="warm,warm_spawn,cold")
    ap.add_argument("--check", default=None, help="output directory of a full run of the same selection")
    ap.add_argument("--check-wall-s", type=float, default=None, help="that full run's end-to-end wall s")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 2 strata of the first scenario, 30 min of batch per run (no figure)")
    ap.add_argument("--ab-policy-cache", type=int, default=0, metavar="N",
                    help="also: one policy run N times with and N times without the policy's Numba cache, "
                         "alternating, in one worker (wall and child-process CPU s)")
    ap.add_argument("--profile-policy", type=int, default=0, metavar="N",
                    help="also: one no-fault policy run N times on one worker's kept processes: CPU us per "
                         "step of the loop, recorder, policy and safety processes, context switches per step")
    a = ap.parse_args()
    from hil.campaign.expand import expand
    from hil.campaign.schema import load_campaign

    c = load_campaign(a.campaign)
    if a.quick:  # a smoke run: 30 min of each batch instead of the shipped duration
        c = c.model_copy(update={"scenarios": [s.model_copy(update={"duration_s": 1800.0}) for s in c.scenarios]})
    only = [s for s in a.scenarios.split(",") if s]
    runs = [r for r in expand(c) if not only or r.scenario in only]
    groups = strata(runs)
    if a.quick:  # the no-fault stratum and one faulted one: every part runs, nothing is a figure
        keys = [k for k in groups if k[1] == "none"][:1]
        keys += [k for k in groups if k[0] == keys[0][0] and k[1] != "none" and not k[1].startswith("canary.")][:1]
        groups = {k: groups[k] for k in keys}
    picked = sample(groups, a.seeds_per_stratum)
    out: dict = {"campaign": c.name, "scenarios": only or [s.name for s in c.scenarios], "workers": a.workers,
                 "strata": len(groups), "sample_runs": len(picked), "quick": a.quick, "cpus": os.cpu_count(),
                 "load_average_1min_before": round(os.getloadavg()[0], 2), "modes": {}}
    with tempfile.TemporaryDirectory(prefix="hil-camp-bench-") as tmp:
        for mode in [m for m in a.modes.split(",") if m]:
            if mode not in MODES:
                ap.error(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
            res, e2e, rep = run_mode(c, picked, a.workers, mode, Path(tmp))
            by_sc = defaultdict(list)
            for r in res:
                by_sc[r["run"]["scenario"]].append(float(r["wall_s"]))
            m = {"sample_e2e_s": round(e2e, 2),
                 "mean_run_s": {k: round(sum(v) / len(v), 3) for k, v in by_sc.items()},
                 "worker_processes": len({r.get("worker_pid") for r in res}),
                 "mean_phases_s": mean_phases(res),
                 "policy_runs_with_warm_numba_cache": sum(bool((r.get("warm") or {}).get("policy_numba_cache"))
                                                          for r in res),
                 "policy_runs_on_kept_processes": sum(((r.get("warm") or {}).get("processes") or {})
                                                      .get("processes") == "reset" for r in res),
                 **project(groups, res, a.workers, e2e, rep)}
            phases = m["mean_phases_s"]
            m["helpers_start_stop_s"] = {sc: round(ph.get("start_s", 0.0) + ph.get("stop_s", 0.0), 3)
                                         for sc, ph in phases.items()}
            m["projected_full_s_helpers_free"] = round(m["projected_full_s"] - helper_share(groups, res, a.workers), 1)
            if not a.quick:
                m["goal_s"], m["stretch_s"] = GOAL_S, STRETCH_S
                m["goal_met"] = m["projected_full_s"] <= GOAL_S if m["full_runs"] >= 600 else None
            if a.check and a.check_wall_s:
                m["check"] = check(groups, Path(a.check), a.check_wall_s, m["projected_full_s"])
            out["modes"][mode] = m
            print(f"{mode}: sample of {len(res)} runs end to end in {e2e:.1f} s -> projected "
                  f"{m['projected_full_s']:.0f} s for {m['full_runs']} runs on {a.workers} worker(s)", file=sys.stderr)
        if a.profile_policy > 0:
            out["profile_policy"] = profile_policy(c, a.profile_policy, Path(tmp))
        if a.ab_policy_cache > 0:
            out["ab_policy_cache"] = ab_policy_cache(c, a.ab_policy_cache, Path(tmp))
    if "warm" in out["modes"] and "cold" in out["modes"]:
        out["cold_over_warm"] = round(out["modes"]["cold"]["projected_full_s"]
                                      / out["modes"]["warm"]["projected_full_s"], 3)
    if "warm" in out["modes"] and "warm_spawn" in out["modes"]:
        out["spawn_over_warm"] = round(out["modes"]["warm_spawn"]["projected_full_s"]
                                       / out["modes"]["warm"]["projected_full_s"], 3)
    if "warm" in out["modes"] and "warm_nocache" in out["modes"]:
        out["nocache_over_warm"] = round(out["modes"]["warm_nocache"]["projected_full_s"]
                                         / out["modes"]["warm"]["projected_full_s"], 3)
    out["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
