"""Default dashboard panels a plant declares (`hil dashboard`, hil/dashboard/).

A plant knows which of its signals an operator watches first (the bioreactor's dissolved
oxygen, glucose and pH; the grid's bus voltages and line loadings; the arm's joints and
end-effector). It says so with a tuple of `Panel`s on its model (`PlantModel.panels`, or a
`PANELS` attribute of an "ode" plant module). Panels name signals only; the dashboard
resolves the names against the spec (an array group such as `bus.vm` stands for all its
elements) and adds setpoints and limits from the scenario. Plants import nothing from hil.

kind:
    "lines"    time series of each signal (a group: one line per element, keep it small)
    "heatmap"  one row of cells per update, one cell per element of a group (colour = value),
               for wide groups such as a 118-bus voltage profile
    "bars"     the latest value of each element of a group (e.g. line loadings in %)
band: (low, high) in the signals' unit: the normal operating band drawn as limit lines
(heatmap: the colour scale's ends); None = the spec's physical bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

PANEL_KINDS = ("lines", "heatmap", "bars")


@dataclass(frozen=True)
class Panel:
    """One default dashboard panel: a title, the signals (output or input names, or array
    group names), how to draw them, and optionally the normal band (signal units)."""

    title: str
    signals: tuple[str, ...]
    kind: str = "lines"
    band: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.kind not in PANEL_KINDS:
            raise ValueError(f"panel {self.title!r}: kind {self.kind!r} is not one of {PANEL_KINDS}")
        if not self.signals:
            raise ValueError(f"panel {self.title!r}: no signals")
        if self.band is not None and not self.band[0] < self.band[1]:
            raise ValueError(f"panel {self.title!r}: band {self.band} is not (low, high) with low < high")
