"""Fit speed: 3 runs of 48 h at 10 s samples, 4 bioreactor parameters, hil's Numba sysid vs
the same least_squares fit with each run simulated by scipy solve_ivp (LSODA) over the same
zero-order-hold inputs (one solve_ivp per interval of constant inputs), same start.

The logged inputs are measured flows (feed and aeration steps plus 1 % flowmeter noise), so
they change at every sample, as a real unit's log does: the reference restarts its
integrator at every sample. Both fits see the same data and start from the nominal.

Usage: python benchmarks/sysid_speed.py [--hours 48] [--runs 3] [--sample-s 10] [--ref-max-nfev N]
Last line: JSON with fit_s, reference_fit_s, speedup, the fitted values with 95 % intervals.
The Numba compile time is reported apart (compile_s) and not counted in fit_s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from scipy.integrate import solve_ivp
from scipy.optimize import least_squares

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from hil.calibration.synthetic import SensorTruth, UnitTruth, real_unit_run  # noqa: E402
from hil.calibration.sysid import SysIdProblem  # noqa: E402
from plants.base import load_plant_module  # noqa: E402

PARAMS = ["mu_x", "kla_alpha", "Y_xs", "m_x"]
TRUE = {"mu_x": 0.1, "kla_alpha": 80.0, "Y_xs": 0.42, "m_x": 0.016}
OUTS = ["dissolved_oxygen", "glucose", "biomass"]


def make_runs(module, n, hours, sample_s):
    spec = module.SPEC
    truth = UnitTruth(params=TRUE, sensors={"dissolved_oxygen": SensorTruth(noise_std=0.5),
                                            "glucose": SensorTruth(noise_std=0.05),
                                            "biomass": SensorTruth(noise_std=0.05)})
    x0 = spec.nominal("states")
    x0[0] = 1.0
    runs = []
    for r in range(n):
        t = np.arange(0.0, hours * 3600.0 + 1.0, sample_s)
        rng = np.random.default_rng(r)
        U = np.tile(spec.nominal("inputs"), (t.size, 1))
        b = (t // 7200).astype(int)
        U[:, 0] = rng.uniform(0.02, 0.08, b.max() + 1)[b]
        a = (t // 3600).astype(int)
        U[:, 3] = rng.uniform(5.0, 15.0, a.max() + 1)[a]
        # logged inputs are measured flows: 1 % flowmeter noise, a new value every sample
        U[:, 0] *= 1.0 + 0.01 * rng.standard_normal(t.size)
        U[:, 3] *= 1.0 + 0.01 * rng.standard_normal(t.size)
        runs.append(real_unit_run(module, truth, t, U, x0, seed=r, name=f"run{r}")[0])
    return runs, x0


def reference_residuals(problem, module, theta):
    """The same residuals, each run simulated by solve_ivp (LSODA) between input changes."""
    p = problem.p_of(theta)
    spec = module.SPEC
    tu = module.TIME_UNIT_S
    dx = np.zeros(spec.n_states)
    y = np.zeros(spec.n_outputs)
    parts = []
    for r, run in enumerate(problem.runs):
        Ysim = np.full((run.t_s.size, spec.n_outputs), np.nan)
        x = problem.x0_of(theta, r).copy()
        change = np.flatnonzero(np.any(np.diff(run.U, axis=0) != 0, axis=1)) + 1
        bounds = np.concatenate([[0], change, [run.t_s.size - 1]])
        for a, b in zip(bounds[:-1], bounds[1:]):
            u = run.U[a].copy()
            if b == a:
                module.outputs(x, u, p, y)
                Ysim[a] = y
                continue

            def f(t, xx, u=u):
                module.derivatives(t, xx, u, p, dx)
                return dx.copy()

            t_eval = run.t_s[a:b + 1] / tu
            sol = solve_ivp(f, (t_eval[0], t_eval[-1]), x, method="LSODA", t_eval=t_eval,
                            rtol=1e-6, atol=1e-9)
            if not sol.success:
                raise RuntimeError(f"solve_ivp failed on run {r}, samples {a}..{b}: {sol.message}")
            for k in range(t_eval.size):
                module.outputs(sol.y[:, k], u, p, y)
                Ysim[a + k] = y
            x = sol.y[:, -1].copy()
        parts.append(problem._run_residuals(r, Ysim))
    return np.concatenate(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=48.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--ref-max-nfev", type=int, default=None,
                    help="cap the reference's evaluations (then the speedup compares per evaluation)")
    args = ap.parse_args()
    module = load_plant_module("bioreactor")
    runs, x0 = make_runs(module, args.runs, args.hours, args.sample_s)
    pb = SysIdProblem(module, runs, PARAMS, x0=x0, outputs=OUTS)
    t0 = time.perf_counter()
    pb.residuals(pb.theta_of())  # compile
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = pb.fit()
    fit_s = time.perf_counter() - t0
    # reference: same problem (the weights the fast fit settled on), same start, same solver
    lo, hi = pb.bounds()
    t0 = time.perf_counter()
    ref = least_squares(lambda th: reference_residuals(pb, module, th), pb.theta_of(), bounds=(lo, hi),
                        method="trf", x_scale="jac", max_nfev=args.ref_max_nfev)
    ref_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sol = least_squares(pb.residuals, pb.theta_of(), bounds=(lo, hi), method="trf", x_scale="jac",
                        max_nfev=args.ref_max_nfev)
    same_s = time.perf_counter() - t0
    out = {
        "runs": args.runs, "hours": args.hours, "sample_s": args.sample_s, "params": PARAMS,
        "fit_s": round(fit_s, 3), "fit_nfev": res.nfev, "compile_s": round(compile_s, 3),
        "reference_fit_s": round(ref_s, 3), "reference_nfev": int(ref.nfev),
        "numba_same_solve_s": round(same_s, 3), "numba_same_solve_nfev": int(sol.nfev),
        "speedup": round(ref_s / fit_s, 2),
        "speedup_same_solve": round(ref_s / same_s, 2),
        "reference_values": dict(zip(PARAMS, map(float, pb.p_of(ref.x)[pb.p_idx]))),
        "fitted": {n: {"value": float(v), "ci95": [float(a), float(b)], "true": TRUE[n]}
                   for n, v, (a, b) in zip(PARAMS, res.values, res.ci95)},
        "cpus": os.cpu_count(), "loadavg_1min": os.getloadavg()[0],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
