"""The deployment path from a trained policy: save it as a `hil policy` version, run it in
HIL in shadow mode beside the baseline, compare.

`save_ensemble` writes a new version of a versioned policy directory (hil/policy/store.py,
kind mlp_ensemble) that `hil policy list/show/check` and the policy process load.

`shadow_run` runs the scenario in the real loop (hil.runtime.Runtime, lockstep, recorded)
with the policy and safety processes over the bus (hil.safety.launch), the safety wrapper in
shadow mode: the baseline controller ([safety.fallback], the SoftPLC's PID block) acts, the
policy's every proposal is logged beside it. `comparison` reads the decision log and the
recording: per action input, how far the proposals were from what the baseline did (RMSE and
max, plant units and as a fraction of the input's span), how often a proposal would have
been clipped by the projection, the silent steps, the shadow gate's verdict, and the run's
KPI (the scenario's [gym] reward summed over the recording).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import tomllib
from datetime import datetime, timezone
from pathlib import Path

import numpy as np


def save_ensemble(out_dir, ens, plant: str, features: list[str], actions: list[str], mean: np.ndarray,
                  cov: np.ndarray, training: dict, *, known_good: bool = False, notes: str = "",
                  version: str | None = None) -> dict:
    """Write `ens` (hil.policy.ensemble.MLPEnsemble) as the next version of `out_dir`; returns its meta."""
    from hil.policy.store import PolicyStore

    store = PolicyStore(out_dir)
    version = version or store.next_version()
    path = store.path(version)
    path.mkdir(parents=True, exist_ok=True)
    ens.save(path / "policy.npz")
    np.savez(path / "stats.npz", mean=np.asarray(mean, np.float64), cov=np.asarray(cov, np.float64))
    store.write_meta(version, {
        "kind": "mlp_ensemble", "file": "policy.npz", "stats": "stats.npz", "plant": plant,
        "features": list(features), "actions": list(actions), "known_good": bool(known_good),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "notes": notes,
        "training": training})
    return store.meta(version)


def shadow_run(config, policy_dir, version: str, *, duration_s: float, seed: int | None = None,
               workdir=None) -> dict:
    """Run `config` in lockstep with policy `version` of `policy_dir` in shadow mode; returns
    {"summary": the run's summary dict, "comparison": see `comparison`, "workdir": path}."""
    from hil.scenario.config import parse_scenario
    from hil.runtime import Runtime

    config = Path(config)
    # absolute: the decision log and status paths go into the scenario, whose relative paths are
    # resolved against the scenario file, not the caller's cwd
    work = Path(workdir).resolve() if workdir else Path(tempfile.mkdtemp(prefix="hil-shadow-"))
    work.mkdir(parents=True, exist_ok=True)
    ipc = tempfile.mkdtemp(prefix="hg", dir="/tmp")  # short: an ipc path is at most 107 bytes
    data = tomllib.loads(config.read_text())
    data.setdefault("policy", {}).update({"directory": str(Path(policy_dir).resolve()), "version": version})
    data["policy"].pop("entry", None)
    data["policy"].pop("onnx", None)
    data.setdefault("safety", {}).update({"mode": "shadow", "decision_log": str(work / "decisions.jsonl"),
                                          "status_path": str(work / "safety-status.json")})
    data.setdefault("bus", {}).update({"transport": "ipc", "ipc_dir": ipc})
    if seed is not None:
        data["loop"]["seed"] = int(seed)
    sc = parse_scenario(data, source=str(config), base_dir=config.resolve().parent)
    rt = Runtime(sc, lockstep=True, duration_s=duration_s, record=True, record_path=str(work / "rec"),
                 start_servers=False, scenario_path=str(config))
    try:
        summary = rt.run()
    finally:
        rt.close()
        shutil.rmtree(ipc, ignore_errors=True)
    if summary.state != "stopped":
        raise RuntimeError(f"shadow run {summary.state}: {summary.stop_reason} {summary.error or ''}")
    return {"summary": summary.as_dict(), "comparison": comparison(sc, work), "workdir": str(work)}


def comparison(scenario, work: Path) -> dict:
    """Proposals vs the baseline's actions from a shadow run's decision log and recording."""
    from hil.bus.config import action_input_names
    from hil.gym.expr import Expression
    from hil.recorder import read_recording
    from plants.base import load_plant_module

    spec = load_plant_module(scenario.plant.model).SPEC
    names = action_input_names(scenario, spec)
    recs = [json.loads(line) for line in open(work / "decisions.jsonl")]
    dec = [r for r in recs if r.get("event") == "decision"]
    with_p = [r for r in dec if r.get("proposal") is not None]
    out: dict = {"decisions": len(dec), "proposals": len(with_p), "silent_steps": len(dec) - len(with_p),
                 "modes": sorted({r["mode"] for r in dec}), "sources": sorted({r["source"] for r in dec}),
                 "alarms": [r.get("rule") for r in recs if r.get("event") == "alarm"], "inputs": {}}
    if with_p:
        P = np.array([r["proposal"] for r in with_p])
        A = np.array([r["action"] for r in with_p])
        J = np.array([r["projected"] for r in with_p])
        for j, n in enumerate(names):
            q = spec.quantity("inputs", n)
            span = max(q.high - q.low, 1e-12)
            diff = P[:, j] - A[:, j]
            rmse = float(np.sqrt(np.mean(diff ** 2)))
            out["inputs"][n] = {"unit": q.unit, "rmse": rmse, "nrmse": rmse / span,
                                "max_abs": float(np.max(np.abs(diff))),
                                "mean_proposal": float(P[:, j].mean()), "mean_baseline": float(A[:, j].mean()),
                                "would_be_clipped": float(np.mean(np.abs(P[:, j] - J[:, j]) > 1e-12))}
    try:
        status = json.loads((work / "safety-status.json").read_text())
        gate = status.get("gate") or {}
        out["shadow_gate"] = {"passed": gate.get("passed"), "reasons": gate.get("reasons", [])}
    except (OSError, ValueError):
        out["shadow_gate"] = {"passed": None, "reasons": ["the safety process left no status"]}
    if scenario.gym is not None:
        df = read_recording(work / "rec")
        blk = {"x": ("x", "states"), "y": ("y", "outputs"), "meas": ("meas", "outputs"),
               "u": ("app", "inputs"), "cmd": ("cmd", "inputs")}
        sig = {b: df[[f"{c}.{n}" for n in spec.names(kind)]].to_numpy(float) for b, (c, kind) in blk.items()}
        prev = np.vstack([sig["u"][:1], sig["u"][:-1]])
        sig["du"] = sig["u"] - prev
        sig["t_s"] = df["t_s"].to_numpy(float)
        r = np.asarray(Expression(scenario.gym.reward, spec)(sig), dtype=np.float64)
        out["baseline_kpi"] = {"reward_sum": float(np.nansum(r)), "steps": int(r.size)}
    return out


def print_comparison(res: dict, echo=print) -> None:
    """The comparison as a table (what `python -m hil.gym.train_example` prints)."""
    c = res["comparison"]
    s = res["summary"]
    echo(f"shadow run: {s['steps']} steps ({s['sim_time_s']:g} s simulated, lockstep), mode {', '.join(c['modes'])}; "
         f"the baseline acted ({', '.join(c['sources'])}); {c['proposals']} proposals, {c['silent_steps']} silent steps")
    echo(f"  {'input':<18}{'unit':<6}{'mean policy':>14}{'mean baseline':>15}{'RMSE':>12}{'NRMSE':>9}"
         f"{'max |diff|':>12}{'clipped':>9}")
    for n, v in c["inputs"].items():
        echo(f"  {n:<18}{v['unit']:<6}{v['mean_proposal']:>14.5g}{v['mean_baseline']:>15.5g}{v['rmse']:>12.4g}"
             f"{v['nrmse']:>9.4f}{v['max_abs']:>12.4g}{v['would_be_clipped']:>9.1%}")
    g = c["shadow_gate"]
    verdict = {True: "passed", False: "refused", None: "unknown"}[g["passed"]]
    echo(f"  shadow gate: {verdict}" + (f" ({'; '.join(g['reasons'])})" if g["reasons"] else ""))
    if "baseline_kpi" in c:
        echo(f"  KPI of the run (baseline acting, [gym].reward summed): {c['baseline_kpi']['reward_sum']:.1f}")
    if c["alarms"]:
        echo(f"  alarms: {', '.join(map(str, c['alarms']))}")
