"""The playbook's reality-gap diagnostic, computed from evidence on disk.

Input: a project directory, or a manifest TOML:

    [project]
    unit = "BR-07"                       # the physical unit the policy will be deployed on
    scenario = "configs/deploy.toml"     # the scenario the policy is trained/validated in
    fits = ["fitted.toml"]               # `hil sysid` outputs
    latency_profiles = ["plc.json"]      # `hil profile` outputs
    recordings = ["runs/hil-plc"]        # HIL runs against the real control stack
    campaigns = ["reports/faults.json"]  # campaign / fault-test reports

A directory is searched for the same kinds of files (*.toml with [sysid] or [scenario],
*.json latency profiles, recording directories with _meta.json).

Each row (visual, dynamics, sensor/noise, contact/actuator, latency, safety wrapper) gets
green / amber / red / n/a, the evidence it rests on and the next step to turn it green.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROWS = ("visual", "dynamics", "sensor/noise", "contact/actuator", "latency", "safety wrapper")


@dataclass
class Cell:
    gap: str
    status: str   # green | amber | red | n/a
    evidence: list[str] = field(default_factory=list)
    next_step: str = ""


@dataclass
class Evidence:
    unit: str = ""
    scenario: dict | None = None
    scenario_path: str = ""
    fits: list[tuple[str, dict]] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)
    recordings: list[tuple[str, dict]] = field(default_factory=list)
    campaigns: list[tuple[str, dict]] = field(default_factory=list)


def _toml(p: Path) -> dict | None:
    try:
        return tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None


def _json(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def gather(target: str | Path) -> Evidence:
    target = Path(target)
    ev = Evidence()
    if target.is_file():
        man = _toml(target) or {}
        proj = man.get("project", {})
        base = target.parent
        ev.unit = proj.get("unit", "")
        if proj.get("scenario"):
            ev.scenario_path = str(base / proj["scenario"])
            ev.scenario = _toml(base / proj["scenario"])
        for f in proj.get("fits", []):
            d = _toml(base / f)
            if d and "sysid" in d:
                ev.fits.append((str(base / f), d))
        ev.profiles = [str(base / f) for f in proj.get("latency_profiles", []) if (base / f).exists()]
        for r in proj.get("recordings", []):
            meta = _json(base / r / "_meta.json")
            if meta is not None:
                ev.recordings.append((str(base / r), meta))
        for c in proj.get("campaigns", []):
            d = _json(base / c)
            if d is not None:
                ev.campaigns.append((str(base / c), d))
        return ev
    for p in sorted(target.rglob("*.toml")):
        d = _toml(p)
        if not d:
            continue
        if "sysid" in d:
            ev.fits.append((str(p), d))
        elif "scenario" in d and "plant" in d and ev.scenario is None:
            ev.scenario, ev.scenario_path = d, str(p)
        elif "project" in d:
            ev.unit = d["project"].get("unit", ev.unit)
    for p in sorted(target.rglob("*.json")):
        d = _json(p)
        if isinstance(d, dict) and "series" in d and p.name != "_meta.json":
            ev.profiles.append(str(p))
        elif isinstance(d, dict) and p.name != "_meta.json" and ("verdicts" in d or "campaign" in d):
            ev.campaigns.append((str(p), d))
    for p in sorted(target.rglob("_meta.json")):
        d = _json(p)
        if d is not None:
            ev.recordings.append((str(p.parent), d))
    return ev


def _visual(ev: Evidence) -> Cell:
    return Cell("visual", "n/a", ["the plant has no camera or rendered image signal"],
                "none: a visual gap exists only for camera-based policies")


def chosen_fit(ev: Evidence) -> tuple[tuple[str, dict] | None, str]:
    """The fit the dynamics and sensor rows rest on: the newest (`sysid.created`) fit on the
    deployment unit; with no deployment unit named, the newest fit. Returns ((path, doc) or
    None, why this one) -- one fit for both rows, never a mix."""
    if not ev.fits:
        return None, ""

    def created(f):
        return str(f[1]["sysid"].get("created", ""))

    def newest(f):  # ties (same second) broken by the file's modification time
        try:
            return created(f), Path(f[0]).stat().st_mtime
        except OSError:
            return created(f), 0.0

    if ev.unit:
        on_unit = [f for f in ev.fits if f[1]["sysid"].get("unit", "") == ev.unit]
        if on_unit:
            best = max(on_unit, key=newest)
            return best, (f"newest of {len(on_unit)} fit(s) on the deployment unit {ev.unit}"
                          f" ({created(best) or 'no date'})")
        best = max(ev.fits, key=newest)
        return best, (f"no fit on the deployment unit {ev.unit}; newest fit on another unit "
                      f"({created(best) or 'no date'})")
    best = max(ev.fits, key=newest)
    return best, f"newest of {len(ev.fits)} fit(s) ({created(best) or 'no date'}); no deployment unit named"


# findings of `hil sysid` that mean the model lacks something (hil/calibration/findings.py)
LACKS = ("trend", "correlation", "run_spread", "at_bound")


def _dynamics(ev: Evidence) -> Cell:
    if not ev.fits:
        overrides = (ev.scenario or {}).get("plant", {}).get("parameters", {})
        if overrides:
            return Cell("dynamics", "amber", [f"{ev.scenario_path}: {len(overrides)} parameter(s) set by hand "
                                              "(spec sheet / literature), no fit on file"],
                        "run `hil sysid` on >= 3 runs of the deployment unit")
        return Cell("dynamics", "red", ["no system identification on file: first-principles model only"],
                    "log >= 3 runs of the deployment unit and run `hil sysid`")
    (path, best), why_this = chosen_fit(ev)
    s = best["sysid"]
    n = int(s.get("n_runs", 0))
    unit = s.get("unit", "")
    files = s.get("files") or []
    evidence = [f"{path}: fit of {', '.join(s.get('estimates', {}))} on {n} run(s) of unit {unit or '(unnamed)'} "
                f"({why_this})"]
    if files:
        evidence.append("logs: " + ", ".join(files))
    status, step = "green", "keep fitting on each new batch; widen randomization to the spread"
    if ev.unit and unit != ev.unit:
        status, step = "amber", f"the fit is on unit {unit or '(unnamed)'}, deployment on {ev.unit}: refit on {ev.unit}"
    elif n < 3:
        status, step = "amber", f"{n} run(s): log >= 3 runs to capture run-to-run variability"
    lacks = [f for f in s.get("identifiability", {}).values() if f.get("kind") in LACKS]
    if lacks:
        status = "amber"
        # name the effect: trends and correlations first (they say what changes, and with what)
        lacks.sort(key=lambda f: LACKS.index(f["kind"]))
        for f in lacks:
            evidence.append(f"{path}: finding ({f['kind']}): {f['why']}")
        step = f"the model lacks an effect: {lacks[0]['why']}; model it, or ship a residual model"
    fitted_outputs = set(s.get("outputs") or [])
    me = {k: v for k, v in (s.get("model_error") or {}).items() if not fitted_outputs or k in fitted_outputs}
    if me:
        status = "amber"
        evidence.append(f"{path}: structured misfit (model error) on {', '.join(sorted(me))}")
        if not lacks:
            step = f"the model misfits {', '.join(sorted(me))} with structure: find the missing effect"
    res = s.get("residual_model")
    if res:
        imp = res.get("improvement", {})
        big = {k: v for k, v in imp.items() if v > 0.3}
        raw, unit = res.get("rmse_without_raw"), res.get("unit", {})
        evidence.append(f"residual model on {', '.join(res.get('states', []))}: {res.get('evaluated_on')} "
                        + ", ".join(f"{k} {res['rmse_without_raw'][k]:.3g}->{res['rmse_with_raw'][k]:.3g} "
                                    f"{unit.get(k, '')}".rstrip() if raw else
                                    f"{k} {res['rmse_without'][k]:.2f}->{res['rmse_with'][k]:.2f}"
                                    for k in res.get("rmse_without", {})))
        if big:
            status = "amber"
            cut = f"a learned correction cuts the held-out error on {', '.join(big)} by {max(big.values()):.0%}"
            ship = ("ship the residual model in the plant step" if not res.get("not_written") else
                    f"the residual model is for diagnosis only, the loop cannot apply it ({res['not_written']})")
            step = (f"{step}; {cut}" if lacks else f"unmodelled effect: {cut}; model the effect, or {ship}")
    wm = s.get("world_model")
    if wm and wm.get("diverging_regions"):
        outs = sorted({r.split(" ")[0] for r in wm["diverging_regions"]})
        wm_step = (f"the world model predicts {', '.join(outs)} better than the simulator in some operating "
                   "regions: find the effect the simulator misses there")
        evidence.append(f"world model diverges from the simulator in: {'; '.join(wm['diverging_regions'][:6])}"
                        + (f" (+{len(wm['diverging_regions']) - 6} more)" if len(wm["diverging_regions"]) > 6 else ""))
        step = wm_step if status != "amber" or not res else f"{step}; {wm_step}"
        status = "amber"
    elif wm:
        evidence.append(f"world model on held-out runs {', '.join(wm.get('heldout_runs', []))}: no region "
                        "where it beats the simulator")
    return Cell("dynamics", status, evidence, step)


def _sensor(ev: Evidence) -> Cell:
    sc_sensors = ((ev.scenario or {}).get("gaps") or {}).get("sensors", {})
    chosen, why_this = chosen_fit(ev)
    fitted, model_error = {}, {}
    if chosen:
        path, d = chosen
        for name, fields in (d.get("gaps", {}).get("sensors", {}) or {}).items():
            fitted[name] = (path, fields)
        model_error = d["sysid"].get("model_error") or {}
    if not sc_sensors and not fitted:
        return Cell("sensor/noise", "red", ["no [gaps.sensors] in the scenario and no fitted profile: sensors ideal"],
                    "fit noise profiles with `hil sysid` and inject them in [gaps.sensors]")
    injected = [n for n in fitted if n in sc_sensors and _same(sc_sensors[n], fitted[n][1])]
    scen = (f"{ev.scenario_path}: [gaps.sensors] for {', '.join(sorted(sc_sensors))}" if sc_sensors
            else f"{ev.scenario_path}: no [gaps.sensors]" if ev.scenario_path else "no scenario on file")
    ev_lines = [scen]
    if fitted:
        ev_lines.append(f"fitted profiles ({why_this}): "
                        + ", ".join(f"{n} ({p})" for n, (p, _) in sorted(fitted.items())))
    suspect = sorted(n for n in injected if n in model_error)
    if suspect:
        ev_lines.append(f"the model misfits {', '.join(suspect)} with structure in that fit: its profile rests on a "
                        "model that does not explain the signal")
        return Cell("sensor/noise", "amber", ev_lines,
                    f"fix the dynamics of {', '.join(suspect)} first (model error, not sensor error), then refit "
                    "the sensor profiles")
    if fitted and len(injected) == len(fitted):
        return Cell("sensor/noise", "green", ev_lines + [f"injected as fitted: {', '.join(sorted(injected))}"],
                    "refit when a probe or its calibration changes")
    missing = sorted(set(fitted) - set(injected))
    return Cell("sensor/noise", "amber", ev_lines,
                f"inject the fitted profiles of {', '.join(missing)} into [gaps.sensors]" if missing
                else "fit the noise from real logs (`hil sysid`): the injected profiles are not fitted")


def _same(a: dict, b: dict) -> bool:
    for k, v in b.items():
        if isinstance(v, float):
            if not isinstance(a.get(k), (int, float)) or abs(a[k] - v) > 1e-6 * max(abs(v), 1e-12):
                return False
    return True


def _actuator(ev: Evidence) -> Cell:
    acts = ((ev.scenario or {}).get("gaps") or {}).get("actuators", {})
    hil_runs = [p for p, m in ev.recordings
                if (m.get("scenario") or {}).get("modbus") or (m.get("scenario") or {}).get("opcua")]
    if acts and hil_runs:
        return Cell("contact/actuator", "green", [f"[gaps.actuators] for {', '.join(sorted(acts))}",
                                                  f"HIL recordings against a PLC: {', '.join(hil_runs)}"],
                    "repeat after actuator maintenance")
    if acts:
        return Cell("contact/actuator", "amber", [f"[gaps.actuators] for {', '.join(sorted(acts))} (bounded by models)"],
                    "validate against the real control stack in HIL (`hil run` with the PLC) and keep the recording")
    return Cell("contact/actuator", "red", ["no [gaps.actuators]: commands treated as effects"],
                "model lag, rate limits and saturation of each actuator in [gaps.actuators]")


def _latency(ev: Evidence) -> Cell:
    lat = ((ev.scenario or {}).get("gaps") or {}).get("latency", {})
    chans = [c for side in ("observation", "actuation") for c in (lat.get(side) or {}).values()]
    replayed = [c for c in chans if c.get("dist") == "profile"]
    if replayed and ev.profiles:
        return Cell("latency", "green", [f"latency replayed from measured profiles: {', '.join(ev.profiles)}"],
                    "re-profile after network or PLC changes (`hil profile`)")
    if chans:
        return Cell("latency", "amber", [f"{len(chans)} latency channel(s), assumed distributions"],
                    "measure the real PLC with `hil profile` and replay it (dist = \"profile\")")
    return Cell("latency", "red", ["no [gaps.latency]: the simulation assumes zero latency"],
                "measure with `hil profile` and add [gaps.latency] channels")


def _safety(ev: Evidence) -> Cell:
    sf = (ev.scenario or {}).get("safety")
    if not sf:
        return Cell("safety wrapper", "red", ["no [safety] section: raw policy"],
                    "configure projection, fallback and monitor + rollback in [safety]")
    layers = [k for k in ("projection", "fallback", "monitor") if k in sf]
    faulted = [p for p, d in ev.campaigns if d.get("verdicts") or d.get("faults")]
    if len(layers) == 3 and faulted:
        return Cell("safety wrapper", "green", [f"[safety] layers: {', '.join(layers)}",
                                                f"fault campaigns: {', '.join(faulted)}"],
                    "re-run the campaigns on every policy version")
    return Cell("safety wrapper", "amber", [f"[safety] layers: {', '.join(layers) or 'none'}; fault-tested: "
                                            f"{', '.join(faulted) or 'no campaign report on file'}"],
                "complete the missing layers and fault-test them (`hil campaign`)")


def audit(target) -> list[Cell]:
    ev = gather(target)
    return [_visual(ev), _dynamics(ev), _sensor(ev), _actuator(ev), _latency(ev), _safety(ev)]


def markdown(cells: list[Cell]) -> str:
    lines = ["| Gap | Status | Evidence | Next step |", "|---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c.gap} | {c.status} | {'<br>'.join(c.evidence)} | {c.next_step} |")
    return "\n".join(lines) + "\n"


def html(cells: list[Cell]) -> str:
    import html as h

    color = {"green": "#2e7d32", "amber": "#f9a825", "red": "#c62828", "n/a": "#757575"}
    rows = "".join(
        f"<tr><td>{h.escape(c.gap)}</td><td style='background:{color[c.status]};color:white'>{c.status}</td>"
        f"<td>{'<br>'.join(h.escape(e) for e in c.evidence)}</td><td>{h.escape(c.next_step)}</td></tr>"
        for c in cells)
    return ("<html><body><h1>Reality-gap audit</h1><table border=1 cellpadding=4>"
            "<tr><th>Gap</th><th>Status</th><th>Evidence</th><th>Next step</th></tr>"
            f"{rows}</table></body></html>\n")
