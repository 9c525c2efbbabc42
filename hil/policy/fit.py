"""Fit the demo policy: an MLP ensemble imitating the baseline controller in simulation.

    python -m hil.policy.fit configs/bioreactor_policy.toml --out policies/bioreactor
    hil policy fit configs/bioreactor_policy.toml --out policies/bioreactor [--setpoint IN=V] ...

Data: closed-loop episodes of the scenario's plant under the baseline ([safety.fallback]: the
same PID loops the safety wrapper falls back to), from randomized initial states and plant
parameters (+/- `spread` around the scenario's, inside the physical bounds), with exploration:
the applied action is dithered (and optionally perturbed for a while; see `simulate`), the
baseline tracks what was applied (as it does in the wrapper), and the label is always what the
baseline does next from there (DAgger-style), so the data covers recoveries, not only the
nominal trajectory.

Features: the loops' measurements, their change since the previous observation (`d.<signal>`)
and the previously applied actions (`u.<input>`); the ensemble is residual on the latter (it
predicts the change of the action, as a PID's velocity form does: du = kp * de + ki * e * dt). Stored as a new version of the policy directory with the training statistics
(feature mean and covariance, for the wrapper's Mahalanobis distance), the distribution of
the training data's own distances, and a closed-loop validation against the baseline.
`--setpoint INPUT=VALUE` fits against a deliberately mis-set baseline (a bad candidate version
for rollback drills).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone

import numpy as np

from hil.bus.config import action_input_names
from hil.policy.ensemble import MLPEnsemble
from hil.policy.features import FeatureMap
from hil.policy.store import PolicyStore
from hil.safety.fallback import FallbackController


def default_features(scenario, spec) -> list[str]:
    names = action_input_names(scenario, spec)
    meas = []
    for loop in scenario.safety.fallback.loops:
        if loop.measurement not in meas:
            meas.append(loop.measurement)
    return meas + [f"d.{m}" for m in meas] + [f"u.{a}" for a in names]


class _Sim:
    """The scenario's plant with its non-action inputs as configured (fixed, profile, nominal)."""

    def __init__(self, scenario, rng, spread: float):
        from plants.base import Plant

        self.plant = plant = Plant(scenario.plant.load(), scenario.plant.substeps)
        self.spec = spec = plant.spec
        time_unit = float(getattr(plant.module, "TIME_UNIT_S", 1.0))
        self.dt_plant = scenario.loop.step_s / time_unit
        self.step_s = scenario.loop.step_s
        for name, v in scenario.plant.parameters.items():
            plant.p[spec.index("params", name)] = v
        for name, v in scenario.plant.initial_state.items():
            plant.x[spec.index("states", name)] = v
        if spread > 0:
            lo, hi = spec.lows("params"), spec.highs("params")
            plant.p[:] = np.clip(plant.p * rng.uniform(1 - spread, 1 + spread, plant.p.size), lo, hi)
            slo, shi = spec.lows("states"), spec.highs("states")
            keep = [spec.index("states", n) for n in scenario.plant.initial_state]
            x = plant.x.copy()
            x[keep] *= rng.uniform(1 - spread, 1 + spread, len(keep))
            plant.x[:] = np.clip(x, slo, shi)
        plant.u[:] = spec.nominal("inputs")
        self.profiles = []
        for name, inp in scenario.inputs.items():
            i = spec.index("inputs", name)
            if inp.value is not None:
                plant.u[i] = inp.value
            if inp.driver == "profile":
                self.profiles.append((i, inp.profile))
        self.y = plant.compute_outputs().copy()

    def step(self, t_s: float, idx: np.ndarray, action: np.ndarray) -> None:
        u = self.plant.u
        for i, prof in self.profiles:
            for t0, v in prof:
                if t0 <= t_s:
                    u[i] = v
        u[idx] = action
        self.plant.step(self.dt_plant)
        self.y = self.plant.compute_outputs().copy()


def simulate(scenario, *, episodes: int, seconds: float, seed: int, spread: float = 0.1,
             dither: float = 0.015, perturb_rate_per_s: float = 0.0, perturb: float = 0.1,
             setpoints: dict | None = None, policy=None, features: list[str]):
    """Closed-loop episodes; returns (X features, A baseline labels, info) and, with `policy`
    (callable on features), runs the policy instead of the baseline (no exploration).

    Exploration (baseline runs): white noise of std `dither` x span on every applied action
    (the baseline tracks it, so it wanders like a random walk the baseline pulls back), and,
    at `perturb_rate_per_s`, offsets of std `perturb` x span held 10-60 s. Larger excursions
    widen the data but reach the PID's anti-windup kinks, which a small ensemble imitates
    poorly (closed-loop tracking suffers): off by default."""
    sc = scenario
    rng = np.random.default_rng(seed)
    fb_sec = sc.safety.fallback
    if setpoints:  # (a copy keeps every other key of the section: on_bad, safe_output, ...)
        fb_sec = fb_sec.model_copy(update={"loops": [
            lp.model_copy(update={"setpoint": setpoints.get(lp.input, lp.setpoint)}) for lp in fb_sec.loops]})
    Xs, As, tracking = [], [], []
    n_steps = int(round(seconds / sc.loop.step_s))
    for ep in range(episodes):
        sim = _Sim(sc, rng, spread)
        spec = sim.spec
        names = action_input_names(sc, spec)
        idx = np.array([spec.index("inputs", a) for a in names], dtype=np.intp)
        lo = np.array([spec.quantity("inputs", a).low for a in names])
        hi = np.array([spec.quantity("inputs", a).high for a in names])
        for a_name, (blo, bhi) in sc.safety.projection.box.items():
            j = names.index(a_name)
            lo[j], hi[j] = max(lo[j], blo), min(hi[j], bhi)
        fmap = FeatureMap(spec, features)
        base = FallbackController(fb_sec, spec, names)
        perturb_left, offset = 0, np.zeros(len(names))
        for k in range(n_steps):
            t_s = k * sc.loop.step_s
            u_now = sim.plant.u
            x = fmap.build(sim.y, u_now)
            label = base.update(sim.y, u_now, sc.loop.step_s if k else 0.0)
            Xs.append(x)
            As.append(label)
            tracking.append(base.tracking_sq(sim.y, u_now))
            if policy is not None:
                act = np.clip(np.asarray(policy(x), dtype=np.float64), lo, hi)
            else:
                act = label.copy()
                if perturb_left <= 0 and rng.random() < perturb_rate_per_s * sc.loop.step_s:
                    perturb_left = int(rng.uniform(10, 60) / sc.loop.step_s)
                    offset = rng.normal(0.0, perturb, len(names)) * (hi - lo)
                if perturb_left > 0:
                    perturb_left -= 1
                    act = act + offset
                if dither > 0:
                    act = act + rng.normal(0.0, dither, len(names)) * (hi - lo)
                act = np.clip(act, lo, hi)
            base.track(act, sim.y, u_now)
            sim.step(t_s, idx, act)
            if not np.isfinite(sim.plant.x).all():
                raise RuntimeError(f"episode {ep}: plant diverged at t = {t_s} s")
    info = {"tracking_nrmse": float(np.sqrt(np.mean(tracking)))}
    return np.array(Xs), np.array(As), info


def fit_version(scenario, out_dir: str, *, version: str | None = None, seed: int = 0, episodes: int = 6,
                seconds: float = 1800.0, members: int = 5, hidden: int = 32, steps: int = 2500,
                setpoints: dict | None = None, known_good: bool | None = None, notes: str = "",
                features: list[str] | None = None) -> dict:
    """Simulate, fit, validate and store one version; returns its meta."""

    t0 = time.perf_counter()
    spec = scenario.plant.load().spec
    names = action_input_names(scenario, spec)
    feats = features or default_features(scenario, spec)
    X, A, info = simulate(scenario, episodes=episodes, seconds=seconds, seed=seed, setpoints=setpoints,
                          features=feats)
    res_idx = [feats.index(f"u.{a}") if f"u.{a}" in feats else -1 for a in names]
    t_sim = time.perf_counter() - t0
    ens, report = MLPEnsemble.fit(X, A, residual_index=res_idx, members=members, hidden=hidden, steps=steps,
                                  seed=seed)
    t_fit = time.perf_counter() - t0 - t_sim
    mean, cov = X.mean(0), np.cov(X, rowvar=False)
    cov = np.atleast_2d(cov)
    prec = np.linalg.inv(cov + 1e-9 * np.trace(cov) / cov.shape[0] * np.eye(cov.shape[0]))
    d = np.sqrt(np.einsum("nf,fg,ng->n", X - mean, prec, X - mean))
    spread = ens.predict_batch(X).std(axis=0)
    scale = np.array([spec.quantity("inputs", a).high - spec.quantity("inputs", a).low for a in names])
    dis = (spread / scale).max(axis=1)
    # closed-loop validation on fresh episodes: the policy alone vs the baseline alone
    _, _, val_pol = simulate(scenario, episodes=2, seconds=seconds, seed=seed + 1000, setpoints=setpoints,
                             policy=ens.act, features=feats)
    _, _, val_base = simulate(scenario, episodes=2, seconds=seconds, seed=seed + 1000, setpoints=setpoints,
                              dither=0.0, features=feats)
    store = PolicyStore(out_dir)
    version = version or store.next_version()
    path = store.path(version)
    path.mkdir(parents=True, exist_ok=True)
    ens.save(path / "policy.npz")
    np.savez(path / "stats.npz", mean=mean, cov=cov)
    q = lambda v, p: float(np.percentile(v, p))  # noqa: E731
    meta = {
        "kind": "mlp_ensemble", "file": "policy.npz", "stats": "stats.npz",
        "plant": spec.name, "features": feats, "actions": names,
        "known_good": bool(known_good if known_good is not None else not setpoints),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "notes": notes or ("imitation of the baseline" + (f" with setpoints {setpoints}" if setpoints else "")),
        "training": {
            **report, "seed": seed, "episodes": episodes, "episode_s": seconds,
            "baseline_setpoints": {f"{lp.measurement} -> {lp.input}": (setpoints or {}).get(lp.input, lp.setpoint)
                                   for lp in scenario.safety.fallback.loops},
            "mahalanobis": {"p50": q(d, 50), "p99": q(d, 99), "p99.9": q(d, 99.9), "max": float(d.max())},
            "disagreement": {"p50": q(dis, 50), "p99": q(dis, 99), "max": float(dis.max())},
            "validation": {"policy_tracking_nrmse": val_pol["tracking_nrmse"],
                           "baseline_tracking_nrmse": val_base["tracking_nrmse"]},
            "simulate_s": round(t_sim, 3), "fit_s": round(t_fit, 3),
        },
    }
    store.write_meta(version, meta)
    return store.meta(version)


def parse_setpoints(items) -> dict:
    out = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--setpoint {item!r}: expected INPUT=VALUE")
        out[name.strip()] = float(value)
    return out


def main(argv=None) -> int:
    from hil.scenario.config import load_scenario

    ap = argparse.ArgumentParser(prog="python -m hil.policy.fit", description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--out", required=True, help="policy directory (versions v1, v2, ...)")
    ap.add_argument("--version", default=None, help="version to write (default: the next one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=1800.0, help="simulated s per episode")
    ap.add_argument("--steps", type=int, default=2500, help="optimizer steps")
    ap.add_argument("--setpoint", action="append", default=[], help="INPUT=VALUE: mis-set baseline loop")
    ap.add_argument("--candidate", action="store_true", help="record as not known-good")
    ap.add_argument("--notes", default="")
    args = ap.parse_args(argv)
    scenario = load_scenario(args.config)
    meta = fit_version(scenario, args.out, version=args.version, seed=args.seed, episodes=args.episodes,
                       seconds=args.seconds, steps=args.steps, setpoints=parse_setpoints(args.setpoint),
                       known_good=False if args.candidate else None, notes=args.notes)
    print(json.dumps({"version": meta["version"], "known_good": meta["known_good"],
                      "training": meta["training"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
