"""`hil policy ...`: fit, list, show, check, mark and run policy versions."""

from __future__ import annotations

import json
import sys
import time

import click


def _load(config: str):
    from hil.scenario.config import load_scenario
    from hil.errors import ConfigError

    try:
        return load_scenario(config)
    except ConfigError as exc:
        click.echo(f"config error {exc}", err=True)
        sys.exit(2)


@click.group("policy")
def command() -> None:
    """Policies: versioned directories, the demo ensemble, the policy process."""


@command.command("fit")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Policy directory (v1, v2, ...).")
@click.option("--version", default=None, help="Version to write (default: the next one).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--episodes", type=int, default=6, show_default=True)
@click.option("--seconds", type=float, default=1800.0, show_default=True, help="Simulated s per episode.")
@click.option("--steps", type=int, default=2500, show_default=True, help="Optimizer steps.")
@click.option("--setpoint", multiple=True, metavar="INPUT=VALUE", help="Imitate a mis-set baseline loop.")
@click.option("--candidate", is_flag=True, help="Record as not known-good.")
@click.option("--notes", default="")
def fit_cmd(config, out, version, seed, episodes, seconds, steps, setpoint, candidate, notes) -> None:
    """Fit an MLP ensemble imitating the scenario's baseline ([safety.fallback]) in simulation."""
    from hil.policy.fit import fit_version, parse_setpoints

    sc = _load(config)
    if sc.safety is None:
        raise click.UsageError("the scenario has no [safety] section (its fallback is the baseline to imitate)")
    t0 = time.perf_counter()
    meta = fit_version(sc, out, version=version, seed=seed, episodes=episodes, seconds=seconds, steps=steps,
                       setpoints=parse_setpoints(setpoint), known_good=False if candidate else None, notes=notes)
    tr = meta["training"]
    click.echo(f"{out}/{meta['version']}: {tr['samples']} samples, {tr['members']} members, "
               f"known_good={meta['known_good']}, {time.perf_counter() - t0:.1f} s")
    click.echo(f"  Mahalanobis of the training data: p99 {tr['mahalanobis']['p99']:.2f}, "
               f"p99.9 {tr['mahalanobis']['p99.9']:.2f}, max {tr['mahalanobis']['max']:.2f}")
    click.echo(f"  disagreement: p99 {tr['disagreement']['p99']:.2g}, max {tr['disagreement']['max']:.2g}")
    v = tr["validation"]
    click.echo(f"  closed loop tracking NRMSE: policy {v['policy_tracking_nrmse']:.4f}, "
               f"baseline {v['baseline_tracking_nrmse']:.4f}")


@command.command("list")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True)
def list_cmd(directory, as_json) -> None:
    """The versions of a policy directory, oldest first."""
    from hil.policy.store import PolicyStore

    store = PolicyStore(directory)
    rows = []
    for v in store.versions():
        m = store.meta(v)
        rows.append({"version": v, "kind": m["kind"], "known_good": bool(m.get("known_good")),
                     "created_utc": m.get("created_utc", ""), "notes": m.get("notes", "")})
    if as_json:
        click.echo(json.dumps(rows))
        return
    for r in rows:
        flag = "known-good" if r["known_good"] else "candidate "
        click.echo(f"{r['version']:>5}  {flag}  {r['kind']:<13} {r['created_utc']:<26} {r['notes']}")


@command.command("show")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.argument("version")
def show_cmd(directory, version) -> None:
    """A version's meta data (features, actions, training statistics) as JSON."""
    from hil.policy.store import PolicyStore

    try:
        click.echo(json.dumps(PolicyStore(directory).meta(version), indent=2))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@command.command("mark")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.argument("version")
@click.option("--known-good/--candidate", required=True, help="The release decision for this version.")
def mark_cmd(directory, version, known_good) -> None:
    """Record the release decision of a version (rollback only goes to known-good ones)."""
    from hil.policy.store import PolicyStore

    store = PolicyStore(directory)
    try:
        meta = store.meta(version)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    meta["known_good"] = known_good
    store.write_meta(version, {k: v for k, v in meta.items() if k not in ("format", "format_version", "version")})
    click.echo(f"{version}: known_good = {known_good}")


FORMATS = {".zip": "sb3", ".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript", ".ts": "torchscript",
           ".torchscript": "torchscript"}


@command.command("import")
@click.argument("model", type=click.Path(dir_okay=False, exists=True))
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Policy directory (v1, v2, ...).")
@click.option("--format", "fmt", type=click.Choice(["auto", "sb3", "onnx", "torchscript"]), default="auto",
              show_default=True, help="auto: from the file name (.zip SB3, .onnx, .pt/.pth/.ts TorchScript).")
@click.option("--vecnormalize", default=None, type=click.Path(dir_okay=False, exists=True),
              help="The VecNormalize saved with the model (SB3: folded in; a graph: recorded and applied).")
@click.option("--action-map", type=click.Choice(["none", "clip", "squash"]), default="none", show_default=True,
              help="A graph's action mapping it does not fold in: clip to the bounds, or squash ([-1, 1] "
                   "rescaled to the bounds). SB3 zips: taken from the algorithm.")
@click.option("--heads", type=int, default=5, show_default=True,
              help="Bootstrapped heads fitted on the rollout: a single network's disagreement signal for the "
                   "confidence gate (0: none; the gate then refuses it unless an operator accepts it).")
@click.option("--algo", default="auto", show_default=True, help="SB3: PPO, A2C, SAC, TD3, DDPG or auto.")
@click.option("--version", default=None, help="Version to write (default: the next one).")
@click.option("--rollout-steps", type=int, default=2000, show_default=True,
              help="Env steps of the imported policy whose features give the Mahalanobis statistics and the "
                   "heads' buffer.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--known-good", is_flag=True, help="Record as known-good (default: a candidate).")
@click.option("--notes", default="")
@click.option("--residual-scale", default=None, metavar="S[,S...]",
              help="SB3: a residual model (hil.gym.residual): its [-1, 1] output is a correction of this fraction "
                   "of each input's span (one value, or one per action in the env's order) added to the "
                   "[safety.fallback] PID block's command.")
@click.option("--residual-track", is_flag=True, help="The residual's PID tracks the decided action (as trained).")
@click.option("--residual-open-loop", multiple=True, metavar="INPUT",
              help="The residual rides on [safety.fallback] with this input's loop open (held at its bias).")
def import_cmd(model, config, out, fmt, vecnormalize, action_map, heads, algo, version, rollout_steps, seed,
               known_good, notes, residual_scale, residual_track, residual_open_loop) -> None:
    """Import a model trained on CONFIG's gym env (an SB3 zip, an ONNX or a TorchScript file) as a
    policy version."""
    from pathlib import Path

    from hil.policy.imported import ImportRefused

    sc = _load(config)
    if sc.gym is None:
        raise click.ClickException(f"{config} has no [gym] section: features and actions come from its env")
    if fmt == "auto":
        fmt = FORMATS.get(Path(model).suffix.lower())
        if fmt is None:
            raise click.ClickException(f"--format: cannot tell the format of {model} from its name "
                                       f"({', '.join(FORMATS)}): give --format sb3|onnx|torchscript")
    if heads == 1 or heads < 0:
        raise click.ClickException(f"--heads: {heads} (0 for none, or at least 2: a spread needs two)")
    common = dict(version=version, rollout_steps=rollout_steps, seed=seed, heads=heads, known_good=known_good,
                  notes=notes)
    try:
        if fmt == "sb3":
            if action_map != "none":
                raise click.ClickException("--action-map: an SB3 zip's mapping comes from its algorithm")
            from hil.policy.importer import import_sb3

            try:
                scale = None if residual_scale is None else [float(v) for v in residual_scale.split(",")]
            except ValueError:
                raise click.ClickException(f"--residual-scale: {residual_scale!r} is not numbers") from None
            residual = None if scale is None else {
                "scale": scale, "track": residual_track, "open_loops": list(residual_open_loop)}
            vdir = import_sb3(model, sc, out, vecnormalize_path=vecnormalize, algo=algo, residual=residual, **common)
        else:
            if residual_scale is not None or residual_track or residual_open_loop:
                raise click.ClickException("--residual-*: residual models are imported from an SB3 zip")
            from hil.policy.import_graph import import_onnx, import_torchscript

            fn = import_onnx if fmt == "onnx" else import_torchscript
            vdir = fn(model, sc, out, vecnormalize_path=vecnormalize, action_map=action_map, **common)
    except ImportRefused as exc:
        raise click.ClickException(f"cannot import {model}: {exc}") from None
    from hil.policy.store import PolicyStore

    meta = PolicyStore(out).meta(vdir.name)
    click.echo(f"{vdir}: kind {meta['kind']}, {'known-good' if known_good else 'candidate'}")
    if meta.get("residual"):
        r = meta["residual"]
        click.echo(f"  residual on the PID block: correction amplitude {r['amplitude']} (plant units, "
                   f"{', '.join(meta['actions'])}), track {r['track']}")
    unc = meta.get("uncertainty")
    if unc:
        sc_b = unc["scores_on_buffer"]
        click.echo(f"  {unc['heads']} bootstrapped heads: disagreement on the rollout buffer p50 "
                   f"{sc_b['disagreement']['p50']:.3g}, p99 {sc_b['disagreement']['p99']:.3g}, max "
                   f"{sc_b['disagreement']['max']:.3g} (set [safety.confidence] disagreement_enter above these)")
    elif not meta.get("training", {}).get("graph_members"):
        click.echo("  a single network without heads: the confidence gate's disagreement and consistency checks "
                   "cannot be computed, so it holds the fallback (fail closed) unless an operator accepts this "
                   "version ([safety.confidence] single_network = \"operator-accepted\")")


@command.command("check")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--version", default=None)
@click.option("--policy", "policy_dir", default=None, type=click.Path(file_okay=False, exists=True),
              help="A versioned policy directory to check instead of the scenario's [policy] (no copy of "
                   "the scenario needed).")
def check_cmd(config, version, policy_dir) -> None:
    """Load the scenario's policy (or --policy DIR) and run it once on the nominal observation."""
    import os

    import numpy as np

    from hil.bus import Receiver, Sender, payload_schema
    from hil.policy.runner import PolicyRunner

    sc = _load(config)
    if policy_dir is not None:
        if sc.policy is None:
            raise click.ClickException(f"{config} has no [policy] section (features and actions come from it)")
        pol = sc.policy.model_copy(update={"directory": os.path.abspath(policy_dir), "entry": "", "onnx": ""})
        sc = sc.model_copy(update={"policy": pol})
    try:
        r = PolicyRunner(sc, config, version)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    y, u = r.spec.nominal("outputs"), r.spec.nominal("inputs")
    obs = Receiver("obs", payload_schema("obs", len(y), len(u), r.n_act), r.key).decode(
        Sender("obs", r.key).encode(0, 0.0, {"y": y.tolist(), "q": [0] * len(y), "u": u.tolist(), "lockstep": True}))
    t0 = time.perf_counter()
    raw = r.answer(obs)
    dt_us = (time.perf_counter() - t0) * 1e6
    if raw is None:
        raise click.ClickException(f"the policy is silent on the nominal observation ({r.counters}, {r.last_error})")
    msg = Receiver("proposal", payload_schema("proposal", len(y), len(u), r.n_act), r.key).decode(raw)
    click.echo(f"{r.version} ({r.policy.kind}) features {r.policy.features}")
    for name, a in zip(r.action_names, msg.payload["a"]):
        click.echo(f"  {name} = {a:.6g} {r.spec.quantity('inputs', name).unit}")
    if len(msg.payload["members"]):
        click.echo(f"  members: {len(msg.payload['members'])}, spread {np.ptp(msg.payload['members'], axis=0)}")
    click.echo(f"  answer in {dt_us:.0f} us")


@command.command("run")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--version", default=None)
@click.option("--status", default=None, help="JSON status file.")
def run_cmd(config, version, status) -> None:
    """Run the policy process in the foreground (as `hil run` starts it)."""
    from hil.policy.runner import main

    args = [config] + (["--version", version] if version else []) + (["--status", status] if status else [])
    sys.exit(main(args))
