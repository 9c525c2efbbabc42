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

Not measured here yet: the per-step round trip loop -> policy -> safety -> loop against the
shield in the real-time loop (the bus side of issue 22 is not wired yet); that comparison is
`benchmarks/bus_latency.py`'s today.

Usage: python benchmarks/shield.py [--quick]. Last stdout line: one JSON object.
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
from hil.bus_config import action_input_names  # noqa: E402
from hil.config import load_scenario  # noqa: E402
from hil.loop.shield import SOURCE_NAMES, Shield, shield_kernel  # noqa: E402

STEP_S = 0.001
SCENARIO = Path(__file__).resolve().parents[1] / "configs" / "panda_policy.toml"
GOAL_US = 5.0  # issue 22: shield cost in the loop <= 5 us per step with the arm's three families


@njit(nogil=True)
def _shield_many(sh_fill, fill_args, P, Y, U, PREV, OUT, codes, lo, hi, rate, W, Wz, b0, By, Bu, scale, m_static,
                 reads_y, reads_u, fb_kind, fb_value, fb_iq, fb_idq, fb_kp, fb_kd, act_u, q_ref, state, a,
                 lo_eff, hi_eff, src, bvec, work, max_iter, band_lo, band_hi):
    for s in range(P.shape[0]):
        codes[s] = shield_kernel(sh_fill, fill_args, 100, P[s], 100, 4, True, Y[s], U[s], PREV[s], STEP_S,
                                 lo, hi, rate, W, Wz, b0, By, Bu, scale, m_static, reads_y, reads_u,
                                 fb_kind, fb_value, fb_iq, fb_idq, fb_kp, fb_kd, act_u, q_ref, state, a,
                                 OUT[s], lo_eff, hi_eff, src, bvec, work, max_iter, band_lo, band_hi)


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
                       sh.band_lo, sh.band_hi)
        _shield_many(sh.fill, sh.fill_args, P, Y, U, PREV, OUT, codes, *kernel_args)
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
            _shield_many(sh.fill, sh.fill_args, P, Y, U, PREV, OUT, codes, *kernel_args)

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
    out["headline"] = {"shield_kernel_us_typical": out["mixes"]["typical"]["shield_kernel_us"]["median"],
                       "shield_kernel_us_adversarial": out["mixes"]["adversarial"]["shield_kernel_us"]["median"],
                       "old_projection_us_typical": out["mixes"]["typical"]["old_projection_us"]["median"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few states and repeats (a smoke test)")
    args = ap.parse_args()
    print(json.dumps(run(args.quick)))


if __name__ == "__main__":
    main()
