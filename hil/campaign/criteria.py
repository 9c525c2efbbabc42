"""Per-run pass criteria, evaluated on the run's recording (and the safety's decision log).

    [[criteria]]
    name = "do_in_band"
    kind = "bounds"             # see below
    signal = "y.dissolved_oxygen"   # a recording column: y.<output> (true), meas.<output> (served),
                                # x.<state>, cmd.<input> (commanded), app.<input> (applied);
                                # a bare name is y.<output>, else app.<input>, else x.<state>
    window = "all"              # "all" | "fault" (the fault window) | "after_fault" (from its end)
                                # | "after_start" (from its start)
    scenarios = [...], faults = [...]   # where it applies (default: every run)

Kinds:
    bounds              every sample of signal(s) in [low, high] (default: the spec bounds); NaN fails
    envelope            every signal of [envelopes.<envelope>] within its [low, high]
    fallback_within     the fallback engaged within `periods` loop steps of the fault start:
                        the safety's baseline took over (decision log: fallback_enter,
                        silent_enter, a baseline decision), the loop's watchdog (cmd.<input>
                        equal to bus.fallback_action) or, in real time, the SoftPLC declared
                        a comm loss (its scan log; its safe outputs reach the plant only once
                        the link is back). n/a without a fault
    rollback            expect = true: a rollback happened after the fault start; false: none did
    iae                 integral of |signal - setpoint| dt over the window <= max (signal unit x s)
    final               the last value of signal within [min, max] (e.g. product titer)
    time_outside        seconds of the window with signal outside [low, high] <= max_s
    recording_complete  no data lost: rows = ceil(steps / decimate), consecutive steps, no
                        dropped rows
    run_completed       the run ended as planned (duration reached, or stopped by stop_after_s),
                        exit code 0: the plant did not diverge, no helper died
    safety_envelope     cmd.* / app.* inside the scenario's declared [safety.projection]
                        (hil/campaign/envelope.py)
    paired_deviation, paired_iae, paired_time_outside, paired_final, paired_detection
                        against the no-fault run of the same scenario and seed
                        (hil/campaign/paired.py)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

PASS, FAIL, NA = "pass", "fail", "n/a"


def resolve_signal(name: str, columns) -> str:
    if name in columns:
        return name
    for prefix in ("y.", "app.", "x."):
        if prefix + name in columns:
            return prefix + name
    raise KeyError(f"no recording column {name!r} (y.<output>, meas.<output>, x.<state>, cmd.<input>, app.<input>)")


def _window_mask(window: str, t_end: np.ndarray, step_s: float, start_k: int | None, end_k: int | None):
    """Rows in the window; a row at t_end covers the step [t_end - step_s, t_end)."""
    k = np.rint(t_end / step_s).astype(np.int64) - 1  # the step index of each row
    if window == "all":
        return np.ones(k.size, bool)
    if start_k is None:  # no fault: the fault window is empty, the "after" windows are all
        return np.zeros(k.size, bool) if window == "fault" else np.ones(k.size, bool)
    if window == "fault":
        return (k >= start_k) & (k < end_k)
    if window == "after_fault":
        return k >= end_k
    return k >= start_k


def load_decisions(path: Path) -> list[dict]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def interventions(decisions: list[dict], df, sc, step_s: float) -> list[dict]:
    """Safety clips, fallbacks, rollbacks (decision log) and the loop's watchdog / the PLC's safe
    outputs (commanded inputs equal to the configured fallback): [{"t_s", "kind", "detail"}]."""
    out = []
    for d in decisions:
        ev, t = d.get("event"), d.get("t_s")
        if t is None:
            continue
        if ev in ("fallback_enter", "silent_enter", "rollback", "alarm"):
            out.append({"t_s": float(t), "kind": ev, "detail": str(d.get("reason", ""))[:160]})
        elif ev == "decision" and d.get("clips") and d.get("mode") in ("limited", "full"):
            out.append({"t_s": float(t), "kind": "clip", "detail": ", ".join(
                str(c.get("input", c.get("name", ""))) for c in d["clips"])[:160]})
    for t in fallback_command_times(df, sc, step_s):
        out.append({"t_s": t, "kind": "loop_fallback", "detail": "commanded inputs = the configured fallback"})
    out.sort(key=lambda e: e["t_s"])
    # keep the report readable: at most 200 marks, evenly thinned
    if len(out) > 200:
        out = out[:: math.ceil(len(out) / 200)]
    return out


def _fallback_targets(sc) -> dict:
    if sc.bus is not None and getattr(sc.bus, "fallback_action", None):
        return dict(sc.bus.fallback_action)
    if sc.softplc is not None and sc.softplc.safe_outputs:
        return dict(sc.softplc.safe_outputs)
    return {}


def fallback_command_times(df, sc, step_s: float) -> list[float]:
    """Start times (s) of the stretches in which every fallback input is commanded at exactly its
    fallback value (the loop's watchdog action, or the PLC's safe outputs)."""
    targets = _fallback_targets(sc)
    cols = [(f"cmd.{n}", v) for n, v in targets.items() if f"cmd.{n}" in df.columns]
    if not cols or df.empty:
        return []
    m = np.ones(len(df), bool)
    for col, v in cols:
        m &= df[col].to_numpy() == v
    starts = np.flatnonzero(m & ~np.r_[False, m[:-1]])
    t = df["t_s"].to_numpy()
    return [float(t[i] - step_s) for i in starts]


def _engaged_step(decisions, fb_times, start_s: float, step_s: float) -> int | None:
    cands = []
    for d in decisions:
        t = d.get("t_s")
        if t is None or t < start_s - 1e-9:
            continue
        ev = d.get("event")
        if ev in ("fallback_enter", "silent_enter") or (
                ev == "decision" and str(d.get("source", "")).startswith("baseline") and d.get("mode") in ("limited", "full")):
            cands.append(t)
            break
    cands += [t for t in fb_times if t >= start_s - 1e-9][:1]
    if not cands:
        return None
    return int(round((min(cands) - start_s) / step_s))


def check(cr, c, df, sc, spec, summary, step_s, decimate, window, decisions, fb_times, fault_kind,
          info: dict | None = None, sc_declared=None, plant=None) -> dict:
    """One criterion on one run: {"status", "value", "detail"}."""
    start_k, end_k = window
    t = df["t_s"].to_numpy() if not df.empty else np.zeros(0)
    if cr.kind == "run_completed":
        ok = summary.get("state") == "stopped" and summary.get("exit_code", 0) == 0
        return {"status": PASS if ok else FAIL, "value": summary.get("stop_reason"),
                "detail": summary.get("error") or ""}
    if cr.kind == "recording_complete":
        steps = int(summary.get("steps", 0))
        want = math.ceil(steps / decimate)
        rows = len(df)
        dropped = int(summary.get("dropped_rows", 0))
        consecutive = bool(rows < 2 or np.all(np.diff(df["step"].to_numpy()) == decimate))
        ok = rows == want and dropped == 0 and consecutive
        return {"status": PASS if ok else FAIL, "value": rows,
                "detail": f"{rows} rows of {want} expected, {dropped} dropped, consecutive: {consecutive}"}
    if cr.kind == "fallback_within":
        if start_k is None or fault_kind == "none":
            return {"status": NA, "value": None, "detail": "no fault in this run"}
        k = _engaged_step(decisions, fb_times, start_k * step_s, step_s)
        plc_k = (info or {}).get("plc_comm_loss_periods")  # real time: the SoftPLC's comm loss
        if plc_k is not None:
            k = plc_k if k is None else min(k, plc_k)
        if k is None:
            return {"status": FAIL, "value": None, "detail": "the fallback never engaged after the fault"}
        return {"status": PASS if k <= cr.periods else FAIL, "value": k, "margin": cr.periods - k,
                "detail": f"engaged {k} period(s) after the fault start (limit {cr.periods})"}
    if cr.kind == "rollback":
        since = start_k * step_s if start_k is not None else 0.0
        rb = [d for d in decisions if d.get("event") == "rollback" and d.get("t_s", -1) >= since - 1e-9]
        ok = bool(rb) == cr.expect
        return {"status": PASS if ok else FAIL, "value": len(rb),
                "detail": f"{len(rb)} rollback(s) since t = {since:g} s (expected {'some' if cr.expect else 'none'})"}
    mask = _window_mask(cr.window, t, step_s, start_k, end_k) if t.size else np.zeros(0, bool)
    if cr.kind == "safety_envelope":
        from hil.campaign.envelope import check_safety_envelope

        return check_safety_envelope(cr, df, sc_declared if sc_declared is not None else sc, spec, mask, plant)
    if cr.kind in ("bounds", "envelope"):
        if cr.kind == "envelope":
            items = [(s, lo, hi) for s, (lo, hi) in c.envelopes[cr.envelope].items()]
        else:
            items = []
            for s in (cr.signals or [cr.signal]):
                col = resolve_signal(s, df.columns)
                lo, hi = cr.low, cr.high
                if math.isinf(lo) and math.isinf(hi):
                    kind, name = _spec_kind(col)
                    if kind is not None:
                        q = spec.quantity(kind, name)
                        lo, hi = q.low, q.high
                items.append((col, lo, hi))
        worst, detail, margin = 0.0, [], math.inf
        for s, lo, hi in items:
            col = resolve_signal(s, df.columns)
            v = df[col].to_numpy()[mask]
            if v.size == 0:
                continue
            with np.errstate(invalid="ignore"):
                m = float(np.min(np.minimum(v - lo, hi - v)))
            margin = min(margin, m if math.isfinite(m) else -math.inf)
            bad = ~((v >= lo) & (v <= hi))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                ex = float(np.nanmax(np.r_[lo - v[bad], v[bad] - hi])) if np.isfinite(v[bad]).any() else math.inf
                worst = max(worst, ex)
                detail.append(f"{col} outside [{lo:g}, {hi:g}] in {int(bad.sum())} sample(s) from "
                              f"t = {float(t[mask][i]):g} s (by up to {ex:.4g})")
        return {"status": FAIL if detail else PASS, "value": worst, "margin": margin, "detail": "; ".join(detail)}
    col = resolve_signal(cr.signal, df.columns)
    v = df[col].to_numpy()
    if cr.kind == "final":
        last = float(v[-1]) if v.size else math.nan
        ok = cr.min <= last <= cr.max
        margin = min(last - cr.min, cr.max - last) if math.isfinite(last) else -math.inf
        return {"status": PASS if ok else FAIL, "value": last, "margin": margin, "detail": f"{col} = {last:.6g} at the end "
                f"(limits [{cr.min:g}, {cr.max:g}])"}
    dt = step_s * decimate
    vw = v[mask]
    if cr.kind == "iae":
        iae = float(np.sum(np.abs(vw - cr.setpoint)) * dt) if vw.size else 0.0
        if not math.isfinite(iae):
            iae = math.inf
        return {"status": PASS if iae <= cr.max else FAIL, "value": iae, "margin": cr.max - iae,
                "detail": f"IAE of {col} around {cr.setpoint:g} = {iae:.6g} (limit {cr.max:g}) over {vw.size * dt:g} s"}
    if cr.kind == "time_outside":
        out_s = float(np.sum(~((vw >= cr.low) & (vw <= cr.high))) * dt)
        return {"status": PASS if out_s <= cr.max_s else FAIL, "value": out_s, "margin": cr.max_s - out_s,
                "detail": f"{col} outside [{cr.low:g}, {cr.high:g}] for {out_s:g} s (limit {cr.max_s:g} s)"}
    raise ValueError(cr.kind)


def _spec_kind(col: str):
    prefix, _, name = col.partition(".")
    return {"y": "outputs", "meas": "outputs", "x": "states", "cmd": "inputs", "app": "inputs"}.get(prefix), name


def applies(cr, run) -> bool:
    """A criterion applies to a run of its scenarios and faults; a canary run is held to every
    criterion of its scenario that names no faults (it must fail one of them)."""
    if cr.scenarios is not None and run.scenario not in cr.scenarios:
        return False
    if getattr(run, "canary", ""):
        return cr.faults is None
    return cr.faults is None or run.fault in cr.faults


def plot_series(c, df, step_s: float) -> dict:
    """The report's signals, downsampled to [report].points: {"t_s": [...], col: [...]}."""
    if df.empty:
        return {}
    n = len(df)
    idx = np.unique(np.linspace(0, n - 1, min(n, c.report.points)).astype(np.int64))
    out = {"t_s": np.round(df["t_s"].to_numpy()[idx], 3).tolist()}
    for s in c.report.signals:
        for col in (f"y.{s}", f"meas.{s}", f"cmd.{s}", f"app.{s}", s):
            if col in df.columns:
                v = df[col].to_numpy()[idx]
                out[col] = [None if not math.isfinite(x) else float(f"{x:.6g}") for x in v]
    return out


def evaluate(c, run, sc, runtime, summary: dict, stage, run_dir: Path, extra_info: dict,
             sc_declared=None) -> dict:
    """The run's result dict (see hil/campaign/worker.py). The paired criteria (against the
    no-fault run of the same scenario and seed) are left to hil/campaign/paired.py, which the
    driver runs once both runs are done."""
    from hil.campaign.digest import recording_digest
    from hil.campaign.schema import PAIRED_KINDS, decimate_of
    from hil.recorder import read_recording

    rec = summary.get("record_path")
    df = read_recording(rec) if rec else None
    if df is None:
        import pandas as pd

        df = pd.DataFrame(columns=["step", "t_s"])
    step_s, decimate = runtime.step_s, decimate_of(c, run)
    f = stage.faults[0] if stage.faults else None
    window = (f.start_k, f.end_k) if f is not None else (None, None)
    decisions = load_decisions(run_dir / "safety-decisions.jsonl")
    fb_times = fallback_command_times(df, sc, step_s)
    kind = c.fault_def(run.fault).get("kind", "none")
    crit = {}
    for cr in c.criteria:
        if not applies(cr, run) or cr.kind in PAIRED_KINDS:
            continue
        try:
            crit[cr.name] = check(cr, c, df, sc, runtime.spec, summary, step_s, decimate, window, decisions,
                                  fb_times, kind, extra_info, sc_declared=sc_declared,
                                  plant=getattr(runtime.plant, "model", None))
        except KeyError as exc:
            crit[cr.name] = {"status": FAIL, "value": None, "detail": str(exc)}
    failed = [n for n, r in crit.items() if r["status"] == FAIL]
    end_k = window[1] if window[1] is not None and window[1] < 1 << 60 else None
    return {
        "run": run.as_dict(),
        "fault": {"name": run.fault, "kind": kind, "start_step": window[0],
                  "start_s": None if window[0] is None else window[0] * step_s,
                  "end_s": None if end_k is None else end_k * step_s, "log": stage.log},
        "summary": {k: summary.get(k) for k in ("state", "stop_reason", "steps", "sim_time_s", "wall_time_s",
                                                 "exit_code", "error", "dropped_rows", "record_path", "alarms",
                                                 "bus", "safety", "policy", "clipped_inputs")},
        "step_s": step_s,
        "criteria": crit,
        "verdict": "fail" if failed else "pass",
        "failed": failed,
        "interventions": interventions(decisions, df, sc, step_s),
        "plot": plot_series(c, df, step_s),
        "digest": recording_digest(df),
        "rows": len(df),
        **({"info": extra_info} if extra_info else {}),
    }
