"""The dashboard's panels for one run: the plant's default panels (plants/panels.py) plus
the signals the operator chose, resolved against the spec, with setpoints and limits.

A panel's series read from the process image: `y` = the outputs as served (after the
sensor gaps, what a PLC reads), `u` = the inputs as applied to the plant. Setpoints come
from the scenario's controllers ([softplc] loops, [safety.fallback] loops: measurement ->
setpoint); limit lines from the panel's band, else the [safety.monitor] rules on the signal
(`dissolved_oxygen < 20` -> a limit at 20); the spec's physical bounds are given per series.
All values in the signals' plant units (the spec's `unit`).
"""

from __future__ import annotations

import math

from plants.panels import Panel


class UnknownSignal(ValueError):
    """A chosen or declared signal that is neither an output, an input nor an array group of them."""


def _resolve(spec, name: str) -> list[tuple[str, str, int]]:
    """(source, element name, index) for an output/input name or an array group of either."""
    for kind, source in (("outputs", "y"), ("inputs", "u")):
        group = next((g for g in spec.groups if g.kind == kind and g.name == name), None)
        if group is not None:
            names = spec.names(kind)
            return [(source, names[i], i) for i in range(group.start, group.start + group.size)]
        try:
            return [(source, name, spec.index(kind, name))]
        except (KeyError, ValueError, IndexError):
            continue
    raise UnknownSignal(f"{name!r} is not an output, an input or an array group of the plant "
                        f"{spec.name!r} (see `hil` reference: signals of each plant)")


def _setpoints(scenario) -> dict[str, float]:
    out: dict[str, float] = {}
    for section in (getattr(scenario, "softplc", None), getattr(getattr(scenario, "safety", None), "fallback", None)):
        for lp in getattr(section, "loops", None) or ():
            if getattr(lp, "measurement", None) and getattr(lp, "setpoint", None) is not None:
                out.setdefault(lp.measurement, float(lp.setpoint))
    return out


def _monitor_limits(scenario) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    mon = getattr(getattr(scenario, "safety", None), "monitor", None)
    for rule in getattr(mon, "rules", None) or ():
        limit = getattr(rule, "limit", None)
        if limit is None or not getattr(rule, "signal", None):
            continue
        out.setdefault(rule.signal, []).append({"value": float(limit), "label": f"{rule.name}: {rule.signal} "
                                                f"{rule.op} {float(limit):g} -> {rule.action}"})
    return out


def build_layout(scenario, spec, panels: tuple, chosen: list[str] | tuple = ()) -> list[dict]:
    """JSON-ready panels: title, kind, series [{name, source, index, unit, low, high}],
    setpoints [{name, value}], limits [{value, label}], band [low, high] or None."""
    panels = tuple(panels)
    if chosen:
        panels = panels + (Panel("Chosen signals", tuple(chosen)),)
    if not panels:  # a plant without declared panels: its first outputs
        panels = (Panel("Outputs", tuple(spec.names("outputs")[:4])),)
    sp, mon = _setpoints(scenario), _monitor_limits(scenario)
    out = []
    for panel in panels:
        series = []
        for name in panel.signals:
            for source, element, idx in _resolve(spec, name):
                q = (spec.outputs if source == "y" else spec.inputs)[idx]
                # an unbounded signal (the arm's end-effector position) has no bound to draw: null
                series.append({"name": element, "source": source, "index": idx, "unit": q.unit,
                               "low": float(q.low) if math.isfinite(q.low) else None,
                               "high": float(q.high) if math.isfinite(q.high) else None})
        names = {s["name"] for s in series}
        limits = [] if panel.band else [lim for n in names for lim in mon.get(n, [])]
        out.append({"title": panel.title, "kind": panel.kind, "series": series,
                    "setpoints": [{"name": n, "value": v} for n, v in sp.items() if n in names],
                    "limits": limits, "band": list(panel.band) if panel.band else None})
    return out
