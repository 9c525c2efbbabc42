"""The in-loop shield (hil/loop/shield.py) against the safety process's projection, per step.

Same scenario (configs/panda_policy.toml: box, rate, and the arm's three state-dependent limit
families ee_box, joint_position, joint_velocity, 42 rows on 8 actions), same states, same
proposals, answers checked to agree (max |difference| / span printed; the run fails above 1e-9)
before any figure:

    old_projection_us    `Projector.project` called from Python, what the safety process pays
                         per step today (numpy fill of the families + the compiled kernel)
    shield_python_us     `Shield.step` called from Python (one Numba call: compiled fill + the
                         same kernel + the fallback choice)
    shield_kernel_us     the shield in a Numba loop over the states: what it costs inside the
                         loop's compiled step, where it runs (no Python call per step)

The states are a lockstep run of the scenario itself (measured outputs, applied inputs, previous
applied action per step). Two proposal mixes: `typical` (the commanded actions of that run: what
its policy proposed and the safety let through) and `adversarial` (proposals drawn anywhere in
the box: the envelope acts on nearly every step, Dykstra over the active rows, up to
[safety.projection].max_iter iterations). Timing: fair.interleaved (blocks interleaved, order
rotated, thread CPU time, >= 3 repeats, medians with min/max). Ratios are old / new (> 1: the
shield is cheaper).

End to end (`realtime`): the same scenario run in real time at 1 kHz (SCHED_FIFO where allowed),
both placements interleaved in one run of this script, order rotated, `--rt-repeats` each:

    old   [safety] placement = "process", the policy answering every step: the per-step round
          trip loop -> policy -> safety -> loop, the loop's watchdog fallback after 2 ms
    new   placement = "loop" as shipped: the policy proposes at 250 Hz, the shield in the loop
          decides every step, the safety process supervises

per run: overruns per 10k steps, steps on a fallback and why (old: the watchdog; new: late
proposal / supervisor silent / supervisor's mode), the loop's decide stage (mean, max us),
lateness p99. Goals (issue 22): new <= 5 overruns per 10k, no step on the fallback for a late
proposal while the policy runs (the shipped policy always answers).

Usage: python benchmarks/shield.py [--quick] [--rt-seconds S] [--rt-repeats N]. Last stdout
line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fair import interleaved, ratio  # noqa: E402
from hil.bus.config import action_input_names  # noqa: E402
from hil.scenario.config import load_scenario  # noqa: E402
from hil.loop.shield import SOURCE_NAMES, Shield, shield_kernel  # noqa: E402

STEP_S = 0.001
SCENARIO = Path(__file__).resolve().parents[1] / "configs" / "panda_policy.toml"
GOAL_US = 5.0  # issue 22: shield cost in the loop <= 5 us per step with the arm's three families


@njit(nogil=True)
def _shield_many(sh_fill, fill_args, P, Y, U, PREV, OUT, codes, lo, hi, rate, W, Wz, b0, By, Bu, scale, m_static,
                 reads_y, reads_u, fb_kind, fb_value, fb_iq, fb_idq, fb_kp, fb_kd, act_u, q_ref, state, a,
                 lo_eff, hi_eff, src, bvec, work, max_iter, band_lo, band_hi, fb_pid, pid_state, open_band):
    for s in range(P.shape[0]):
        codes[s] = shield_kernel(sh_fill, fill_args, 100, P[s], 100, 4, True, Y[s], U[s], PREV[s], STEP_S,
                                 lo, hi, rate, W, Wz, b0, By, Bu, scale, m_static, reads_y, reads_u,
                                 fb_kind, fb_value, fb_iq, fb_idq, fb_kp, fb_kd, act_u, q_ref, state, a,
                                 OUT[s], lo_eff, hi_eff, src, bvec, work, max_iter, band_lo, band_hi, fb_pid,
                                 pid_state, open_band)


def recorded_states(spec, names, seconds: float, workdir: Path) -> tuple[np.ndarray, ...]:
    """(proposal, y, u, prev) per step of a lockstep run of the scenario itself (its scripted
    policy through the safety process): measured outputs, applied inputs, the previous step's
    applied actions, and the commanded action as the proposal (what the policy asked and the
    safety let through)."""
    import subprocess

    from hil.recorder import read_recording

    rec = workdir / "rec"
    cmd = [sys.executable, "-m", "hil.cli", "run", str(SCENARIO), "--lockstep", "--duration", f"{seconds}s",
           "--record", str(rec), "--quiet"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=str(workdir))
    df = read_recording(rec)
    outs, ins = spec.names("outputs"), spec.names("inputs")
    y = df[[f"meas.{o}" if f"meas.{o}" in df.columns else f"y.{o}" for o in outs]].to_numpy()
    u = df[[f"app.{i}" for i in ins]].to_numpy()
    prop = df[[f"cmd.{a}" for a in names]].to_numpy()
    app = df[[f"app.{a}" for a in names]].to_numpy()
    # step s decides from the outputs measured at s and the action applied at s (prev)
    return prop[1:], y[1:], u[1:], app[:-1]


def run(quick: bool) -> dict:
    sc = load_scenario(SCENARIO)
    plant = sc.plant.load()
    spec = plant.spec
    names = action_input_names(sc, spec)
    sh = Shield(sc, spec, names, plant=plant, max_age_steps=4)
    proj = sh.projector
    import tempfile

    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(prefix="hil-shield-bench-") as tmp:
        P0, Y, U, PREV = recorded_states(spec, names, 0.3 if quick else 2.0, Path(tmp))
    count = len(P0)
    out: dict = {"scenario": "configs/panda_policy.toml", "actions": len(names), "limit_rows": int(sh.W.shape[0]),
                 "states": count, "goal_shield_kernel_us": GOAL_US, "mixes": {}}
    for mix in ("typical", "adversarial"):
        P = P0 if mix == "typical" else rng.uniform(sh.lo, sh.hi, size=P0.shape)
        OUT = np.zeros_like(P)
        codes = np.zeros(count, dtype=np.int64)
        ref = np.array([proj.project(P[s], PREV[s], STEP_S, Y[s], U[s])[0] for s in range(count)])
        kernel_args = (sh.lo, sh.hi, sh.rate, sh.W, sh.Wz, sh.b0, sh.By, sh.Bu, sh.scale, sh.m_static, sh.reads_y,
                       sh.reads_u, sh.fb_kind, sh.fb_value, sh.fb_iq, sh.fb_idq, sh.fb_kp, sh.fb_kd, sh.act_u,
                       sh.q_ref, sh.state, sh.a, sh.lo_eff, sh.hi_eff, sh.src, sh.bvec, sh.work, sh.max_iter,
                       sh.band_lo, sh.band_hi, sh.fb_pid, sh.pid_state, sh.open_band)
        _shield_many(sh.kernel_fill, sh.fill_args, P, Y, U, PREV, OUT, codes, *kernel_args)
        diff_kernel = float(np.max(np.abs(OUT - ref) / sh.scale))
        one = np.zeros(len(names))
        diff_python = 0.0
        for s in range(count):
            sh.step(100, P[s], 100, Y[s], U[s], PREV[s], STEP_S, one)
            diff_python = max(diff_python, float(np.max(np.abs(one - ref[s]) / sh.scale)))
        if max(diff_kernel, diff_python) > 1e-9:
            raise SystemExit(f"shield and projection disagree ({mix}): {diff_kernel:.3g}, {diff_python:.3g} of span")
        sources = {SOURCE_NAMES[c]: int((codes == c).sum()) for c in np.unique(codes)}
        block = 32 if quick else 128

        def old():
            for s in range(block):
                proj.project(P[s], PREV[s], STEP_S, Y[s], U[s])

        def new_python():
            for s in range(block):
                sh.step(100, P[s], 100, Y[s], U[s], PREV[s], STEP_S, one)

        def new_kernel():
            _shield_many(sh.kernel_fill, sh.fill_args, P, Y, U, PREV, OUT, codes, *kernel_args)

        t = interleaved({"old_projection_us": old, "shield_python_us": new_python, "shield_kernel_us": new_kernel},
                        {"old_projection_us": block, "shield_python_us": block, "shield_kernel_us": count},
                        blocks=3 if quick else 10, repeats=3 if quick else 5)
        out["mixes"][mix] = {**t, "sources": sources, "max_abs_diff_over_span": max(diff_kernel, diff_python),
                             "ratio_old_over_kernel": ratio(t["old_projection_us"], t["shield_kernel_us"]),
                             "ratio_old_over_python": ratio(t["old_projection_us"], t["shield_python_us"])}
        print(f"{mix:12s} old {t['old_projection_us']['median']:8.2f} us  shield (Python call) "
              f"{t['shield_python_us']['median']:7.2f} us  shield (in kernel) {t['shield_kernel_us']['median']:7.2f} us"
              f"  sources {sources}", file=sys.stderr)
    worst = max(m["shield_kernel_us"]["median"] for m in out["mixes"].values())
    out["goal_met"] = worst <= GOAL_US
    out["headline"] = [
        {"figure": f"enforcement per step, {mix} proposals (thread CPU)", "hil": m["shield_kernel_us"]["median"],
         "peer": m["old_projection_us"]["median"], "peer_name": "the safety process's projection (old path)",
         "ratio": m["ratio_old_over_kernel"], "unit": "us", "goal": GOAL_US, "met": m["shield_kernel_us"]["median"] <= GOAL_US}
        for mix, m in out["mixes"].items()]
    return out


def realtime_headline(rt: dict) -> list[dict]:
    """Headline rows of the real-time runs: the new placement's overruns and fallbacks beside the old's."""
    new, old = rt["new"], rt["old"]
    return [
        {"figure": "overruns per 10k steps, panda at 1 kHz (median of runs)", "hil": new["overruns_per_10k_median"],
         "peer": old["overruns_per_10k_median"], "peer_name": "placement process (old)", "unit": "",
         "goal": OVERRUN_GOAL_PER_10K, "met": rt["goals"]["new_overruns_per_10k_le_5"]},
        {"figure": "fallback steps per 10k, panda at 1 kHz (median of runs)", "hil": new["fallback_per_10k_median"],
         "peer": old["fallback_per_10k_median"], "peer_name": "placement process (old)", "unit": "",
         "goal": 0.0, "met": rt["goals"]["new_no_late_fallback"]},
        {"figure": "decide stage mean, panda at 1 kHz (median of runs)", "hil": new["decide_us_mean_median"],
         "peer": old["decide_us_mean_median"], "peer_name": "placement process (old)", "unit": "us"},
    ]


PLACEMENTS = {
    "old": ["safety.placement='process'", "policy.rate_hz=1000.0"],
    "new": [],  # as shipped: placement = "loop", rate_hz = 250
}
OVERRUN_GOAL_PER_10K = 5.0


def realtime_run(which: str, seconds: float, workdir: Path) -> dict:
    """One real-time run of the scenario in placement `which` (PLACEMENTS); its figures."""
    import subprocess
    import tempfile

    ipc = tempfile.mkdtemp(prefix="hsb", dir="/tmp")
    cmd = [sys.executable, "-m", "hil.cli", "run", str(SCENARIO), "--wall", f"{seconds}s", "--json", "--quiet",
           "--no-record", "--set", f"bus.ipc_dir='{ipc}'",
           "--set", f"safety.decision_log='{workdir / (which + '.jsonl')}'"]
    for s in PLACEMENTS[which]:
        cmd += ["--set", s]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 10 + 120,
                              cwd=str(SCENARIO.parents[1]))
    finally:
        import shutil

        shutil.rmtree(ipc, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"{which} run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    d = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = max(1, d["steps"])
    bus = d["bus"]
    if which == "old":
        fallback = {"watchdog": bus["fallback_steps"] + bus["no_action_steps"]}
    else:
        fallback = {"late": bus["shield_fallback_late_steps"], "supervisor_silent":
                    bus["shield_fallback_supervisor_silent_steps"], "mode": bus["shield_fallback_mode_steps"],
                    "bad_proposal": bus["shield_fallback_bad_proposal_steps"],
                    "unknown_limits": bus["shield_fallback_unknown_limits_steps"]}
    stage = d.get("stage_us", {}).get("decide", {})
    blame = {} if which == "old" else {  # who made the late / silent steps (hil/loop/shield_bus.py)
        "late_policy": bus["shield_late_policy_steps"], "late_transport": bus["shield_late_transport_steps"],
        "silent_supervisor": bus["shield_silent_supervisor_steps"],
        "silent_transport": bus["shield_silent_transport_steps"], "silent_startup": bus["shield_silent_startup_steps"],
        "proposal_transit_us_max": bus["proposal_transit_us_max"],
        "supervisor_transit_us_max": bus["supervisor_transit_us_max"]}
    return {"steps": d["steps"], "fallback_blame": blame, "overruns": d["overruns"], "overruns_per_10k": 1e4 * d["overruns"] / steps,
            "fallback_steps": fallback, "fallback_per_10k": 1e4 * sum(fallback.values()) / steps,
            "decide_us_mean": stage.get("mean"), "decide_us_max": stage.get("max"),
            "lateness_p99_us": d.get("lateness_us", {}).get("p99"),
            "scheduling": d.get("scheduling", {}).get("policy")}


def realtime(seconds: float, repeats: int) -> dict:
    """Both placements in real time, interleaved (old, new / new, old ...): module docstring."""
    import tempfile

    runs: dict[str, list] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="hil-shield-rt-") as tmp:
        for r in range(repeats):
            for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
                runs[which].append(realtime_run(which, seconds, Path(tmp)))
                print(f"realtime {which}: {runs[which][-1]}", file=sys.stderr)
    out = {"seconds": seconds, "repeats": repeats}
    for which, rs in runs.items():
        out[which] = {"runs": rs,
                      "overruns_per_10k_median": float(np.median([x["overruns_per_10k"] for x in rs])),
                      "fallback_per_10k_median": float(np.median([x["fallback_per_10k"] for x in rs])),
                      "decide_us_mean_median": float(np.median([x["decide_us_mean"] for x in rs]))}
    new = runs["new"]
    out["goals"] = {"new_overruns_per_10k_le_5": all(x["overruns_per_10k"] <= OVERRUN_GOAL_PER_10K for x in new),
                    "new_no_late_fallback": all(x["fallback_steps"]["late"] == 0 for x in new),
                    "new_no_transport_fallback": all(x["fallback_blame"]["late_transport"] == 0
                                                     and x["fallback_blame"]["silent_transport"] == 0 for x in new)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few states and repeats (a smoke test)")
    ap.add_argument("--rt-seconds", type=float, default=None, help="wall s per real-time run (default 10, quick 2)")
    ap.add_argument("--rt-repeats", type=int, default=None, help="real-time runs per placement (default 3, quick 1)")
    args = ap.parse_args()
    out = run(args.quick)
    seconds = args.rt_seconds if args.rt_seconds is not None else (2.0 if args.quick else 10.0)
    repeats = args.rt_repeats if args.rt_repeats is not None else (1 if args.quick else 3)
    out["realtime"] = realtime(seconds, repeats)
    out["headline"] += realtime_headline(out["realtime"])
    out["goal_met"] = out["goal_met"] and all(out["realtime"]["goals"].values())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
