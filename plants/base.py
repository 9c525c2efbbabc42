"""The plant interface: a plant module's contract and the `Plant` instance around it.

A plant is a module in `plants/` that defines:

    SPEC: PlantSpec                      # states, inputs, outputs, params (units, bounds)
    DEFAULT_SUBSTEPS: int                # RK4 sub-steps per step at the nominal step
    MAX_SUBSTEP: float                   # longest stable sub-step, plant time unit
                                         # (math.inf for an exact step)
    TIME_UNIT_S: float                   # optional: seconds per plant time unit (default 1)
    derivatives(t, x, u, p, dxdt)        # @njit(cache=True, nogil=True), writes dxdt
    outputs(x, u, p, y)                  # @njit(cache=True, nogil=True), writes y
    step(t, x, u, p, dt, n_sub, work)    # @njit: advance x in place by dt, return t + dt
    run_batch(t, X, U, P, dt, n_sub, n)  # @njit(parallel): N instances, n steps each

State lives outside the plant (Drake style): `Plant` only holds arrays, so a snapshot is
a copy of (t, x, p) and rollback, replay and shadow forks are `set_state` of a snapshot.
Plants import nothing from `hil` or `adapters`.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from plants.spec import PlantSpec

REQUIRED = ("SPEC", "DEFAULT_SUBSTEPS", "MAX_SUBSTEP", "derivatives", "outputs", "step", "run_batch")


def load_plant_module(name: str) -> ModuleType:
    """Import `plants.<name>` and check it fulfils the plant contract."""
    if not name.isidentifier():
        raise ValueError(f"plant name {name!r} is not an identifier")
    try:
        module = importlib.import_module(f"plants.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"plants.{name}":
            raise ValueError(f"unknown plant {name!r} (no module plants/{name}.py)") from None
        raise
    missing = [attr for attr in REQUIRED if not hasattr(module, attr)]
    if missing:
        raise ValueError(f"plants/{name}.py is not a plant: missing {', '.join(missing)}"
                         + (" (its longest stable sub-step in plant time units, math.inf for an exact step)"
                            if "MAX_SUBSTEP" in missing else ""))
    if not float(module.MAX_SUBSTEP) > 0:
        raise ValueError(f"plants/{name}.py: MAX_SUBSTEP = {module.MAX_SUBSTEP} is not a positive duration")
    return module


class SubstepTooLong(ValueError):
    """Explicit sub-steps that make each sub-step longer than the plant's MAX_SUBSTEP."""

    def __init__(self, plant: str, dt: float, substeps: int, max_substep: float, unit_s: float):
        self.plant, self.dt, self.substeps, self.max_substep = plant, dt, substeps, max_substep
        self.needed = substeps_needed(dt, max_substep)
        super().__init__(
            f"{substeps} sub-step(s) of a {dt * unit_s:g} s step are {dt * unit_s / substeps:g} s each, longer "
            f"than {plant}'s maximum stable sub-step of {max_substep * unit_s:g} s: use at least "
            f"{self.needed} sub-steps, or leave the count out to have it derived")


def substeps_needed(dt: float, max_substep: float) -> int:
    """Fewest sub-steps that keep each one <= max_substep (same time unit as dt)."""
    return max(1, math.ceil(dt / max_substep * (1.0 - 1e-12)))


def substeps_for(module: ModuleType, dt: float, substeps: int | None = None) -> int:
    """Sub-steps per step of `dt` (plant time unit) for a plant module.

    Explicit `substeps` are checked against the module's MAX_SUBSTEP (SubstepTooLong if a
    sub-step would be longer); None derives max(DEFAULT_SUBSTEPS, ceil(dt / MAX_SUBSTEP)).
    """
    max_sub = float(module.MAX_SUBSTEP)
    if substeps is not None:
        if dt / substeps > max_sub * (1.0 + 1e-12):
            raise SubstepTooLong(module.SPEC.name, dt, substeps, max_sub, float(getattr(module, "TIME_UNIT_S", 1.0)))
        return int(substeps)
    return max(int(module.DEFAULT_SUBSTEPS), substeps_needed(dt, max_sub))


@dataclass(frozen=True)
class PlantSnapshot:
    """The whole plant state at one instant: time (plant time unit), states, parameters."""

    t: float
    x: np.ndarray
    p: np.ndarray


class Plant:
    """One plant instance: the module's kernels plus its state, input and parameter arrays.

    `x`, `u`, `p`, `y` are float64 arrays in the spec's order; the loop writes `u`, calls
    `step(dt)` and reads `y`. Nothing here allocates per step.
    """

    def __init__(self, module: ModuleType, substeps: int | None = None, dt: float | None = None):
        """dt: the step the loop will take (plant time unit); given, the sub-step count is
        derived from (or checked against) the module's MAX_SUBSTEP (see `substeps_for`)."""
        self.module = module
        self.spec: PlantSpec = module.SPEC
        if dt is not None:
            self.substeps = substeps_for(module, dt, substeps)
        else:
            self.substeps = int(substeps or module.DEFAULT_SUBSTEPS)
        self.t = 0.0
        self.x = self.spec.nominal("states")
        self.u = self.spec.nominal("inputs")
        self.p = self.spec.nominal("params")
        self.y = np.zeros(self.spec.n_outputs)
        self._work = np.zeros((5, self.spec.n_states))
        self._step = module.step
        self._outputs = module.outputs

    @classmethod
    def from_name(cls, name: str, substeps: int | None = None, dt: float | None = None) -> "Plant":
        return cls(load_plant_module(name), substeps, dt)

    def step(self, dt: float) -> None:
        """Advance the state by dt (plant time unit) with the current inputs held."""
        self.t = self._step(self.t, self.x, self.u, self.p, dt, self.substeps, self._work)

    def compute_outputs(self) -> np.ndarray:
        """Recompute and return `y` (true, noise-free outputs) from the current state."""
        self._outputs(self.x, self.u, self.p, self.y)
        return self.y

    def first_non_finite_state(self) -> str | None:
        """Name of the first state that is NaN or infinite, or None if all are finite."""
        bad = np.flatnonzero(~np.isfinite(self.x))
        return self.spec.states[bad[0]].name if bad.size else None

    def snapshot(self) -> PlantSnapshot:
        return PlantSnapshot(self.t, self.x.copy(), self.p.copy())

    def restore(self, snap: PlantSnapshot) -> None:
        self.t = snap.t
        self.x[:] = snap.x
        self.p[:] = snap.p

    # Aliases matching FMI's vocabulary.
    get_state = snapshot
    set_state = restore
