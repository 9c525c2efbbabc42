"""Helpers of the gap tests: a small plant spec (a tank) and drivers of a pipeline."""

from __future__ import annotations

import numpy as np

from hil.gaps import GapPipeline, GapsSection
from plants.spec import PlantSpec, Quantity

TANK = PlantSpec(
    name="tank",
    states=(Quantity("level", "m", 1.0, 0.0, 10.0),),
    inputs=(Quantity("inflow", "m3/s", 0.1, 0.0, 1.0), Quantity("valve", "%", 50.0, 0.0, 100.0),
            Quantity("heater", "kW", 0.0, -5.0, 5.0)),
    outputs=(Quantity("level", "m", 1.0, 0.0, 10.0), Quantity("temp", "K", 300.0, 250.0, 400.0),
             Quantity("flow", "m3/s", 0.1, 0.0, 1.0)),
    params=(Quantity("area", "m2", 1.0, 0.5, 2.0), Quantity("k_out", "m2.5/s", 0.2, 0.1, 0.3)),
)


def build(gaps: dict | None, step_s: float = 0.1, seed: int = 7, spec: PlantSpec = TANK):
    section = None if gaps is None else GapsSection.model_validate(gaps)
    return GapPipeline.build(section, spec, step_s, seed)


def run_sense(g, y_true_fn, n: int, step_s: float, n_out: int = 3) -> np.ndarray:
    """(n, n_out) measured outputs of sense(t_k) for t_k = k * step_s, k = 0..n-1."""
    out = np.zeros((n, n_out))
    y, ym = np.zeros(n_out), np.zeros(n_out)
    for k in range(n):
        y[:] = y_true_fn(k * step_s)
        g.sense(k * step_s, y, ym)
        out[k] = ym
    return out


def run_actuate(g, u_fn, n: int, step_s: float, n_in: int = 3) -> np.ndarray:
    out = np.zeros((n, n_in))
    u, ua = np.zeros(n_in), np.zeros(n_in)
    for k in range(n):
        u[:] = u_fn(k * step_s)
        g.actuate(k * step_s, u, ua)
        out[k] = ua
    return out
