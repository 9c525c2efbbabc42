"""Paired criteria: each faulted run against the no-fault run of the same scenario and seed.

An absolute limit ("IAE <= 2e5 % x s over the run") cannot tell a fault from the process's own
variation: the seed draws the randomization and the gaps, so two runs differ even without a
fault. Paired with the no-fault twin (same scenario, same seed: same plant, same noise up to the
fault start; bit for bit identical before it in lockstep), the difference IS the fault's effect.
The twin is the run of [campaign].baseline (default: the fault of kind "none").

    [[criteria]]
    name = "do_iae_vs_baseline"
    kind = "paired_iae"           # IAE(faulted) / max(IAE(baseline), floor) <= max_ratio
    signal = "y.dissolved_oxygen"
    setpoint = 70.0
    window = "after_start"        # from the fault start to the end of the run (default "all")
    max_ratio = 1.5
    floor = 600.0                 # % x s: below it the baseline IAE counts as this (a tight
                                  # loop does not turn noise into a huge ratio)

    kind = "paired_time_outside"  # s outside [low, high] in the window: faulted - baseline <= max_extra_s
    kind = "paired_final"         # the last value vs the baseline's at the same step:
                                  # |d| <= max_abs and |d| / |baseline| <= max_rel
    kind = "paired_deviation"     # the largest |value - baseline value| over the window, row by
                                  # row at the same steps, <= max_abs (signal unit): how far the
                                  # fault moved the process from where it would have been; NaN fails
    kind = "paired_detection"     # the fallback (safety baseline, loop watchdog, PLC comm loss)
                                  # engaged within `periods` steps of the fault start, and the
                                  # no-fault run did NOT engage in that stretch (else it is not a
                                  # detection of the fault)

Both runs are compared over the same steps: a faulted run stopped early (stop_after_s) is
compared with the baseline's rows up to its own last step. A missing or errored baseline fails
the criterion (it cannot be compared: fail closed). On the baseline run itself the criteria are
n/a. Evaluated by the driver once both runs have results (`apply_paired`), written into the
faulted run's result (criteria, failed, verdict) and again on every resume and replay.

A fault is "seen" in a run when a paired criterion fails (its effect on the process is
measured) or a detection criterion (paired_detection, fallback_within) passes (the wrapper or
the PLC detected it in time): `result["seen"]`, summarised per fault in summary.json.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from hil.campaign.criteria import FAIL, NA, PASS, _engaged_step, _window_mask, applies, fallback_command_times, \
    load_decisions, resolve_signal
from hil.campaign.schema import PAIRED_KINDS

DETECTION_KINDS = ("paired_detection", "fallback_within")


def baseline_id(c, run: dict) -> str | None:
    base = c.baseline_fault()
    return None if base is None else f"{run['scenario']}.{base}.s{run['seed']}"


def _window(res: dict) -> tuple[int | None, int | None]:
    f = res.get("fault") or {}
    start = f.get("start_step")
    if start is None:
        return None, None
    end_s, step_s = f.get("end_s"), res["step_s"]
    return int(start), (1 << 62) if end_s is None else int(round(end_s / step_s))


def _masked(df, window: str, step_s: float, win, last_step: int | None):
    t = df["t_s"].to_numpy()
    m = _window_mask(window, t, step_s, *win) if t.size else np.zeros(0, bool)
    if last_step is not None:
        m &= df["step"].to_numpy() <= last_step
    return m


def _iae(v: np.ndarray, setpoint: float, dt: float) -> float:
    x = float(np.sum(np.abs(v - setpoint)) * dt) if v.size else 0.0
    return x if math.isfinite(x) else math.inf


def _outside_s(v: np.ndarray, lo: float, hi: float, dt: float) -> float:
    return float(np.sum(~((v >= lo) & (v <= hi))) * dt)


def check_paired(cr, fdf, bdf, step_s: float, decimate: int, win, detection: tuple | None = None) -> dict:
    """One paired criterion: fdf / bdf the faulted and baseline recordings (DataFrames with
    step, t_s and the signal), win = (start_k, end_k) of the fault (None, None: no fault).
    detection: (faulted engaged step or None, baseline engaged step or None), steps after the
    fault start, for paired_detection."""
    start_k, _ = win
    if cr.kind == "paired_detection":
        if start_k is None:
            return {"status": NA, "value": None, "detail": "no fault in this run"}
        kf, kb = detection or (None, None)
        if kb is not None and kb <= cr.periods:
            return {"status": FAIL, "value": kf, "detail": f"the no-fault run engaged the fallback too ({kb} period(s) "
                    f"after the same start): not a detection of the fault"}
        if kf is None:
            return {"status": FAIL, "value": None, "detail": "the fallback never engaged after the fault"}
        return {"status": PASS if kf <= cr.periods else FAIL, "value": kf, "margin": cr.periods - kf,
                "detail": f"detected {kf} period(s) after the fault start (limit {cr.periods}); the no-fault run "
                          f"did not engage"}
    last = int(fdf["step"].iloc[-1]) if len(fdf) else None
    col = resolve_signal(cr.signal, fdf.columns)
    mf = _masked(fdf, cr.window, step_s, win, None)
    mb = _masked(bdf, cr.window, step_s, win, last)
    vf, vb = fdf[col].to_numpy()[mf], bdf[col].to_numpy()[mb]
    dt = step_s * decimate
    if cr.kind == "paired_iae":
        a, b = _iae(vf, cr.setpoint, dt), _iae(vb, cr.setpoint, dt)
        ratio = a / max(b, cr.floor) if max(b, cr.floor) > 0 else (math.inf if a > 0 else 1.0)
        return {"status": PASS if ratio <= cr.max_ratio else FAIL, "value": ratio, "margin": cr.max_ratio - ratio,
                "detail": f"IAE of {col} around {cr.setpoint:g}: {a:.6g} vs {b:.6g} without the fault (ratio "
                          f"{ratio:.3g}, limit {cr.max_ratio:g}, floor {cr.floor:g}) over {vf.size * dt:g} s"}
    if cr.kind == "paired_time_outside":
        a, b = _outside_s(vf, cr.low, cr.high, dt), _outside_s(vb, cr.low, cr.high, dt)
        extra = a - b
        return {"status": PASS if extra <= cr.max_extra_s else FAIL, "value": extra, "margin": cr.max_extra_s - extra,
                "detail": f"{col} outside [{cr.low:g}, {cr.high:g}] for {a:g} s vs {b:g} s without the fault "
                          f"(+{extra:g} s, limit {cr.max_extra_s:g} s)"}
    if cr.kind == "paired_deviation":
        sf, sb = fdf["step"].to_numpy()[mf], bdf["step"].to_numpy()[mb]
        _, i_f, i_b = np.intersect1d(sf, sb, assume_unique=True, return_indices=True)
        if i_f.size == 0:
            return {"status": FAIL, "value": None, "detail": f"no common rows of {col} in the window: cannot compare"}
        d = np.abs(vf[i_f] - vb[i_b])
        worst = float(np.max(d)) if not np.isnan(d).any() else math.inf  # NaN: not comparable, fails
        at = int(sf[i_f][int(np.argmax(np.where(np.isnan(d), math.inf, d)))])
        return {"status": PASS if worst <= cr.max_abs else FAIL, "value": worst, "margin": cr.max_abs - worst,
                "detail": f"{col} at most {worst:.4g} from the run without the fault (step {at}; limit "
                          f"{cr.max_abs:g}) over {i_f.size} row(s)"}
    if cr.kind == "paired_final":
        a = float(vf[-1]) if vf.size else math.nan
        b = float(vb[-1]) if vb.size else math.nan
        d = abs(a - b)
        rel = d / abs(b) if b else (0.0 if d == 0 else math.inf)
        ok = d <= cr.max_abs and rel <= cr.max_rel  # NaN fails
        margin = min(cr.max_abs - d, (cr.max_rel - rel) * abs(b) if math.isfinite(cr.max_rel) else math.inf)
        return {"status": PASS if ok else FAIL, "value": a - b, "margin": margin if math.isfinite(d) else -math.inf,
                "detail": f"{col} = {a:.6g} at the end vs {b:.6g} without the fault (|d| = {d:.4g}, "
                          f"{100 * rel:.3g} %; limits {cr.max_abs:g}, {100 * cr.max_rel:g} %)"}
    raise ValueError(cr.kind)


def seen(result: dict) -> bool:
    """The fault registered: a paired criterion failed or a detection criterion passed."""
    crit = result.get("criteria", {})
    kinds = result.get("criteria_kinds", {})
    return any((kinds.get(n) in PAIRED_KINDS and kinds.get(n) != "paired_detection" and r["status"] == FAIL)
               or (kinds.get(n) in DETECTION_KINDS and r["status"] == PASS) for n, r in crit.items())


class _Loader:
    """Recordings, decision logs and scenarios, each loaded once per pass."""

    def __init__(self, c):
        self.c = c
        self._df: dict = {}
        self._sc: dict = {}

    def df(self, res: dict):
        from hil.recorder import read_recording

        path = (res.get("summary") or {}).get("record_path")
        if not path or not Path(path).exists():
            return None
        if path not in self._df:
            if len(self._df) > 64:
                self._df.clear()
            self._df[path] = read_recording(path)
        return self._df[path]

    def scenario(self, name: str):
        from hil.campaign.schema import load_scenario_ref

        if name not in self._sc:
            ref = next(s for s in self.c.scenarios if s.name == name)
            self._sc[name] = load_scenario_ref(self.c, ref)
        return self._sc[name]

    def engaged(self, res: dict, df, start_k: int, step_s: float) -> int | None:
        run_dir = Path((res.get("summary") or {}).get("record_path") or ".").parent
        sc = self.scenario(res["run"]["scenario"])
        k = _engaged_step(load_decisions(run_dir / "safety-decisions.jsonl"), fallback_command_times(df, sc, step_s),
                          start_k * step_s, step_s)
        plc_k = (res.get("info") or {}).get("plc_comm_loss_periods")
        if plc_k is not None:
            k = plc_k if k is None else min(k, plc_k)
        return k


def evaluate_pair(c, res: dict, base: dict | None, loader: _Loader | None = None) -> dict:
    """The paired criteria of one result (a dict name -> criterion result), in campaign order."""
    from hil.campaign.schema import decimate_of

    loader = loader or _Loader(c)
    run = SimpleNamespace(**res["run"])
    out: dict = {}
    crs = [cr for cr in c.criteria if cr.kind in PAIRED_KINDS and applies(cr, run)]
    if not crs:
        return out
    bid = baseline_id(c, res["run"])
    if res["run"]["run_id"] == bid:
        return {cr.name: {"status": NA, "value": None, "detail": "the no-fault baseline run itself"} for cr in crs}
    why = None
    fdf = bdf = None
    if base is None or base.get("verdict") == "error":
        why = f"no baseline result for {bid}: cannot compare"
    else:
        fdf, bdf = loader.df(res), loader.df(base)
        if fdf is None or bdf is None:
            why = f"the recording of {res['run']['run_id'] if fdf is None else bid} is missing: cannot compare"
    if why is not None:
        return {cr.name: {"status": FAIL, "value": None, "detail": why} for cr in crs}
    win = _window(res)
    step_s = float(res["step_s"])
    detection = None
    if win[0] is not None and any(cr.kind == "paired_detection" for cr in crs):
        detection = (loader.engaged(res, fdf, win[0], step_s), loader.engaged(base, bdf, win[0], step_s))
    dec = decimate_of(c, run)
    for cr in crs:
        try:
            out[cr.name] = check_paired(cr, fdf, bdf, step_s, dec, win, detection)
        except KeyError as exc:
            out[cr.name] = {"status": FAIL, "value": None, "detail": str(exc)}
    return out


def finalize(c, res: dict, paired: dict) -> dict:
    """Merge the paired criteria into a result: criteria (campaign order), failed, verdict, seen."""
    if res.get("verdict") == "error":
        return res
    order = {cr.name: i for i, cr in enumerate(c.criteria)}
    kind = {cr.name: cr.kind for cr in c.criteria}
    # a criterion the campaign no longer has (edited since the run) is no part of the verdict, and
    # the paired ones are evaluated afresh on every pass (`paired`): an earlier pass's are dropped
    crit = {n: r for n, r in res.get("criteria", {}).items() if n in order and kind[n] not in PAIRED_KINDS}
    crit.update(paired)
    res["criteria"] = dict(sorted(crit.items(), key=lambda kv: order.get(kv[0], 1 << 30)))
    res["criteria_kinds"] = {cr.name: cr.kind for cr in c.criteria if cr.name in res["criteria"]}
    res["failed"] = [n for n, r in res["criteria"].items() if r["status"] == FAIL]
    res["verdict"] = "fail" if res["failed"] else "pass"
    res.pop("paired_pending", None)
    res["seen"] = seen(res) if (res.get("fault") or {}).get("start_step") is not None else None
    return res


def apply_paired(c, results: list[dict], out_dir: Path | None = None) -> list[dict]:
    """Evaluate every result's paired criteria against its baseline result (in place); rewrite
    the result files in out_dir. Returns the results."""
    from hil.campaign.worker import run_paths, write_result

    by_id = {r["run"]["run_id"]: r for r in results}
    loader = _Loader(c)
    # baselines first, so their recordings are loaded once and stay cached for their partners
    for res in sorted(results, key=lambda r: (r["run"]["scenario"], r["run"]["seed"])):
        if res.get("verdict") == "error":
            continue
        bid = baseline_id(c, res["run"])
        finalize(c, res, evaluate_pair(c, res, by_id.get(bid), loader))
        if out_dir is not None:
            write_result(run_paths(out_dir, res["run"]["run_id"])[1], res)
    return results
