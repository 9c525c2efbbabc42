"""`hil safety ...`: the safety process, its status, promotion through the gates, the log."""

from __future__ import annotations

import json
import sys
from collections import Counter

import click


def _load(config: str):
    from hil.scenario.config import load_scenario
    from hil.errors import ConfigError

    try:
        sc = load_scenario(config)
    except ConfigError as exc:
        click.echo(f"config error {exc}", err=True)
        sys.exit(2)
    if sc.safety is None or sc.bus is None:
        click.echo("config error: the scenario has no [safety] / [bus] section", err=True)
        sys.exit(2)
    from hil.run_dirs import locate

    return locate(sc)  # a run moved off an unusable default run directory is in this user's index


def _request(sc, msg: dict, timeout_s: float) -> dict:
    """One request to the running safety process's control socket (hil/safety/control_client.py)."""
    from hil.safety.control_client import ControlError, control_request

    try:
        return control_request(sc, msg, timeout_s)
    except ControlError as exc:
        raise click.ClickException(str(exc)) from None


@click.group("safety")
def command() -> None:
    """The safety wrapper: status, promotion through KPI gates, demotion, rollback, its log."""


@command.command("run")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--log", default=None, help="Decision log (JSONL).")
@click.option("--status", default=None, help="Status file (JSON).")
def run_cmd(config, log, status) -> None:
    """Run the safety process in the foreground (as `hil run` starts it)."""
    from hil.safety.wrapper import main

    sys.exit(main([config] + (["--log", log] if log else []) + (["--status", status] if status else [])))


@command.command("status")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True)
@click.option("--timeout", type=float, default=2.0, show_default=True)
def status_cmd(config, as_json, timeout) -> None:
    """Mode, policy version, fallback, alarms and counters of the running safety process."""
    st = full_status(_load(config), timeout)
    if as_json:
        click.echo(json.dumps(st))
        return
    for line in status_lines(st):
        click.echo(line)


def full_status(sc, timeout_s: float) -> dict:
    """The safety process's status; with placement = "loop" also the loop's shield (from the
    run's live status snapshot, hil/live_runs.py) under "shield" (None when not found)."""
    st = _request(sc, {"op": "status"}, timeout_s)["status"]
    if st.get("placement") == "loop":
        from hil.live_runs import find, read_stats

        entry = find(sc.name)
        snap = read_stats(entry) if entry is not None else None
        st["shield"] = (snap or {}).get("shield")
    return st


def status_lines(st: dict) -> list[str]:
    """The human form of a safety status (SafetyCore.status plus the process's counters)."""
    out = []
    fb = st["fallback"]
    out.append(f"mode {st['mode']}  policy {st['version']}  acting: {st['source']}  t_sim {st['t_s']}")
    pol = st.get("policy") or {}
    state = pol.get("state", "silent" if st.get("policy_silent") else "ok")
    if state == "lost":
        state = (f"LOST since t = {pol['lost_since_t_s']:g} s (last valid proposal at t = "
                 f"{pol['last_answer_t_s']:g} s; lost after {pol['lost_after_s']:g} s of silence)")
    elif state == "none":
        state = "none may act (every version rolled back)"
    out.append(f"policy: {state}; lost {len(pol.get('losses', []))} time(s) in this run")
    out.append(f"fallback {'ACTIVE' if fb['active'] else 'off'} ({fb['reason'] or '-'})")
    for name, chk in (fb.get("checks") or {}).items():
        if not chk["enabled"]:
            out.append(f"  check {name}: DISABLED in [safety.confidence] (not gated)")
            continue
        extra = "" if chk.get("statistics", True) else " (no training statistics: cannot be computed, fails closed)"
        limits = f"enter > {chk['enter']}, exit <= {chk['exit']}" if chk["enter"] is not None else "no threshold"
        out.append(f"  check {name}: enabled, last {chk['last'] if chk['last'] is not None else '-'} "
                   f"({limits}){extra}")
    acc = fb.get("single_network")
    if acc:
        out.append(f"  single network {acc['version']}: OPERATOR-ACCEPTED by {acc['accepted_by']} at "
                   f"{acc['accepted_utc']} (disagreement and consistency not applied to it; {acc['reason'] or '-'})")
    if st.get("bad_signals"):
        out.append(f"Bad signals: {', '.join(st['bad_signals'])}")
    if st.get("applied_overrides"):
        out.append(f"actuators moved by someone else (baseline follows): {', '.join(st['applied_overrides'])}")
    out.append(f"alarms {st['alarm_count']}; rolled back: {', '.join(st['rolled_back']) or '-'}")
    for a in st["alarms"]:
        out.append(f"  ALARM t={a['t_s']:g} s {a['message']}")
    gate = st["gate"]
    verdict = "passes" if gate["passed"] else "refuses: " + "; ".join(gate["reasons"])
    out.append(f"gate {gate['mode']} -> {gate['target']}: {verdict}")
    sup = st.get("supervisor")
    if sup is not None:
        band = ", ".join(f"{n} [{lo:g}, {hi:g}]" for n, (lo, hi) in sup["band"].items()) or "none"
        out.append(f"supervisor (placement loop): policy {'MAY act' if sup['allow_policy'] else 'may NOT act'} "
                   f"({sup['reason']}), mode {sup['mode']}, band {band}, at step {sup['step']}")
    if st.get("placement") == "loop":
        sh = st.get("shield")
        if sh:
            steps = ", ".join(f"{k} {v}" for k, v in sh["steps"].items() if v)
            out.append(f"shield (in the loop): now {sh['last_source']}; steps: {steps or '-'}")
        else:
            out.append("shield (in the loop): no status from the loop (run not announced or not started)")
    c = st["counters"]
    out.append("counters " + ", ".join(f"{k} {v}" for k, v in c.items() if v))
    return out


@command.command("promote")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--timeout", type=float, default=2.0, show_default=True)
def promote_cmd(config, timeout) -> None:
    """Promote one mode up, if the KPI gate of the current mode passes (exit 1 if refused)."""
    sc = _load(config)
    res = _request(sc, {"op": "promote", "by": "operator"}, timeout)
    gate = res["gate"]
    if res["ok"]:
        click.echo(f"promoted {gate['mode']} -> {res['mode']}; KPIs {gate['kpis']}")
        return
    click.echo(f"refused: {gate['mode']} stays ({'; '.join(gate['reasons'])}); KPIs {gate['kpis']}", err=True)
    sys.exit(1)


@command.command("demote")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--to", "to", required=True, type=click.Choice(["shadow", "advisory", "limited", "full"]))
@click.option("--reason", default="operator")
def demote_cmd(config, to, reason) -> None:
    """Demote the running wrapper to a lower mode (immediate)."""
    res = _request(_load(config), {"op": "demote", "to": to, "reason": reason}, 2.0)
    if not res["ok"]:
        raise click.ClickException(res.get("error", "refused"))
    click.echo(f"mode {res['mode']}" + ("" if res["changed"] else " (unchanged: demotion never raises the mode)"))


@command.command("rollback")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--reason", default="manual rollback")
def rollback_cmd(config, reason) -> None:
    """Roll the running policy back to the previous known-good version."""
    res = _request(_load(config), {"op": "rollback", "reason": reason}, 2.0)
    click.echo(f"policy version now {res['version'] or 'none (the baseline controller holds)'}")


@command.command("log")
@click.argument("path", type=click.Path(dir_okay=False, exists=True))
@click.option("--all", "show_all", is_flag=True, help="Also list every decision record.")
def log_cmd(path, show_all) -> None:
    """Summarize a decision log: events with their reasons, counts of sources and clips."""
    events, sources, clips = Counter(), Counter(), Counter()
    for line in open(path):
        rec = json.loads(line)
        ev = rec.get("event")
        events[ev] += 1
        if ev == "decision":
            sources[rec["source"]] += 1
            for c in rec.get("clips", []):
                clips[f"{c['input']}:{c['reason']}"] += 1
            if not show_all:
                continue
        if ev in ("start", "stop") and not show_all:
            continue
        t = rec.get("t_s")
        click.echo(f"t={t if t is None else f'{t:g}'} s  {ev:<15} {rec.get('reason', '')}")
    click.echo("events: " + ", ".join(f"{k} {v}" for k, v in events.most_common()))
    click.echo("acting: " + ", ".join(f"{k} {v}" for k, v in sources.most_common()))
    if clips:
        click.echo("clips: " + ", ".join(f"{k} {v}" for k, v in clips.most_common()))


@command.command("acknowledge")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--by", default="operator", show_default=True, help="Who acknowledges (in the decision log).")
def acknowledge_cmd(config, by) -> None:
    """Acknowledge the running wrapper's alarms (logged; changes no mode and no limit)."""
    res = _request(_load(config), {"op": "acknowledge", "by": by}, 2.0)
    if not res["ok"]:
        raise click.ClickException(res.get("error", "refused"))
    click.echo(f"{res['acknowledged']} alarm(s) acknowledged")


@command.command("check-fallback")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--hours", type=float, default=4.0, show_default=True, help="Simulated hours per run.")
@click.option("--runs", type=int, default=3, show_default=True, help="Randomized runs (parameters and initial state +/-10 percent).")
def check_fallback_cmd(config, hours, runs) -> None:
    """Validate the fallback controller on its own: it alone must keep every output in bounds."""
    import numpy as np

    from hil.bus.config import action_input_names
    from hil.policy.fit import _Sim
    from hil.safety.fallback import FallbackController

    sc = _load(config)
    bad = 0
    for seed in range(runs):
        sim = _Sim(sc, np.random.default_rng(seed), spread=0.1)
        spec = sim.spec
        names = action_input_names(sc, spec)
        idx = np.array([spec.index("inputs", n) for n in names])
        base = FallbackController(sc.safety.fallback, spec, names)
        lo, hi = spec.lows("outputs"), spec.highs("outputs")
        track, worst = [], None
        for k in range(int(hours * 3600 / sc.loop.step_s)):
            a = base.update(sim.y, sim.plant.u, sc.loop.step_s if k else 0.0)
            sim.step(k * sc.loop.step_s, idx, a)
            out = ~np.isfinite(sim.y) | (sim.y < lo) | (sim.y > hi)
            if out.any():
                worst = f"{spec.outputs[int(np.flatnonzero(out)[0])].name} out of bounds at t = {k * sc.loop.step_s:g} s"
                break
            track.append(base.tracking_sq(sim.y, sim.plant.u))
        nrmse = float(np.sqrt(np.mean(track))) if track else float("nan")
        click.echo(f"run {seed}: {'FAIL ' + worst if worst else 'ok'}; tracking NRMSE {nrmse:.4f}")
        bad += worst is not None
    sys.exit(1 if bad else 0)
