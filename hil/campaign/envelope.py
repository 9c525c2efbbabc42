"""The `safety_envelope` criterion: the wrapper's envelope, checked on what the loop recorded.

    [[criteria]]
    name = "wrapper_envelope"
    kind = "safety_envelope"
    on = ["cmd", "app"]               # cmd.<input>: the command before the loop's physical clip
                                      # (what the wrapper let through); app.<input>: applied
    checks = ["box", "rate", "linear"]
    tolerance = 1e-6                  # slack, fraction of each input's physical span

The envelope is the scenario's [safety.projection] AS DECLARED in the campaign (scenario file +
the scenario's `set`), never the run's own: a canary that opens the wrapper's envelope (wider
box, no rate) is still held to the declared one, so a wrapper that is off is caught.

- box: every bus-driven input within the spec bounds intersected with projection.box;
- rate: |v[i] - v[i-1]| <= rate x (time between the rows) (units per simulated s);
- linear: sum_j w_j a_j <= b0 + sum_k b_k s_k, s_k = the measured output meas.<k> of the
  previous row (what the wrapper saw when it decided) or the applied input app.<k>; plant
  families ([[safety.projection.plant]], e.g. the Panda's workspace box) are rebuilt per row
  from the plant module's SAFETY_LIMITS, as the wrapper does.

The loop clips commands to the PHYSICAL bounds only, so `app` inside the spec bounds says
nothing about the wrapper; the `cmd` column does. Rate on `app` also sees actuator faults
(a stuck actuator released jumps): leave "rate" out of `checks` for `on = ["app"]` in
campaigns with actuator faults.
"""

from __future__ import annotations

import math

import numpy as np

PASS, FAIL, NA = "pass", "fail", "n/a"


def _driven(sc, spec) -> list[str]:
    from hil.bus.config import bus_input_names

    return bus_input_names(sc, spec)


def check_safety_envelope(cr, df, sc_declared, spec, mask: np.ndarray, plant=None) -> dict:
    """{"status", "value" (worst excess, plant units), "margin", "detail"}; n/a without [safety]."""
    sec = getattr(sc_declared, "safety", None)
    if sec is None:
        return {"status": NA, "value": None, "detail": "the scenario has no [safety]"}
    names = _driven(sc_declared, spec)
    if not names:
        return {"status": NA, "value": None, "detail": "no bus-driven input"}
    proj = sec.projection
    t = df["t_s"].to_numpy()
    idx = np.flatnonzero(mask)
    problems: list[str] = []
    worst = 0.0
    span = {n: spec.quantity("inputs", n).high - spec.quantity("inputs", n).low for n in names}

    def note(what: str, excess: np.ndarray, where: np.ndarray) -> None:
        nonlocal worst
        bad = ~(excess <= 0.0)  # NaN counts as outside
        if bad.any():
            i = int(where[np.flatnonzero(bad)[0]])
            ex = float(np.nanmax(excess[bad])) if np.isfinite(excess[bad]).any() else math.inf
            worst = max(worst, ex)
            problems.append(f"{what}: {int(bad.sum())} row(s) from t = {float(t[i]):g} s (by up to {ex:.4g})")

    for src in cr.on:
        if "box" in cr.checks:
            for n in names:
                q = spec.quantity("inputs", n)
                lo, hi = q.low, q.high
                if n in proj.box:
                    lo, hi = max(lo, proj.box[n][0]), min(hi, proj.box[n][1])
                v = df[f"{src}.{n}"].to_numpy()[idx]
                tol = cr.tolerance * span[n]
                note(f"{src}.{n} outside the box [{lo:g}, {hi:g}]", np.maximum(lo - v, v - hi) - tol, idx)
        if "rate" in cr.checks and idx.size > 1:
            pairs = idx[1:][np.diff(idx) == 1]  # rows whose previous row is in the window too
            if pairs.size:
                dt = t[pairs] - t[pairs - 1]
                for n, r in proj.rate.items():
                    if n not in names:
                        continue
                    v = df[f"{src}.{n}"].to_numpy()
                    step = np.abs(v[pairs] - v[pairs - 1])
                    note(f"{src}.{n} faster than {r:g}/s", step - r * dt - cr.tolerance * span[n], pairs)
        if "linear" in cr.checks:
            prev = np.maximum(idx - 1, 0)
            for lim in proj.linear:
                lhs = np.zeros(idx.size)
                tol = 0.0
                for n, w in lim.w.items():
                    lhs += w * df[f"{src}.{n}"].to_numpy()[idx]
                    tol += abs(w) * span.get(n, 1.0) * cr.tolerance
                rhs = np.full(idx.size, float(lim.b0))
                for s, b in lim.b.items():
                    col = f"meas.{s}" if f"meas.{s}" in df.columns else f"app.{s}"
                    rhs += b * df[col].to_numpy()[prev]
                note(f"{src}: limit {lim.name} ({' + '.join(f'{w:g} {n}' for n, w in lim.w.items())} <= b(state))",
                     lhs - rhs - tol, idx)
            for pl in proj.plant:
                note_plant(pl, src, names, df, idx, spec, plant, cr.tolerance, note, problems)
    return {"status": FAIL if problems else PASS, "value": worst, "margin": -worst,
            "detail": "; ".join(problems) if problems else
            f"{', '.join(cr.on)} of {', '.join(names)} inside the declared envelope ({', '.join(cr.checks)})"}


def note_plant(pl, src, names, df, idx, spec, plant, tolerance, note, problems) -> None:
    """A plant limit family (rows rebuilt per recorded row from meas.* and app.*)."""
    from hil.safety.projection import plant_limit_family

    try:
        fam = plant_limit_family(plant, pl.kind, names, pl.options, f"safety.projection.plant.{pl.name}")
    except (ValueError, ImportError, AttributeError) as exc:
        problems.append(f"plant limit {pl.name}: cannot be built ({exc})")
        return
    y = df[[f"meas.{n}" for n in spec.names("outputs")]].to_numpy()
    u = df[[f"app.{n}" for n in spec.names("inputs")]].to_numpy()
    a = df[[f"{src}.{n}" for n in names]].to_numpy()
    W = np.zeros((fam.m, len(names)))
    b = np.zeros(fam.m)
    excess = np.empty(idx.size)
    for j, i in enumerate(idx):
        p = max(i - 1, 0)
        fam.fill(y[p], u[p], W, b)
        excess[j] = float(np.max(W @ a[i] - b)) - tolerance if fam.m else -1.0
    note(f"{src}: plant limit {pl.name}", excess, idx)
