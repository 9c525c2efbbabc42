"""Typed description of a plant: named states, inputs, outputs and parameters.

Every quantity carries a unit, a nominal value and physical bounds. The bounds seed the
safety envelope (inputs), the clipping of commands (inputs), the validity check of the
state (states) and the ranges of domain randomization (parameters).

Names are resolved to integer indices once, at configure time (`PlantSpec.index`); the
per-step path only ever sees float64 arrays ordered as the tuples below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Quantity:
    """One named scalar of a plant.

    name: identifier used in configs and tag maps (`glucose`, `feed_rate`).
    unit: unit string as shown to users (`g/L`, `L/h`, `K`).
    nominal: nominal value, in `unit`.
    low, high: physical bounds, in `unit` (low <= nominal <= high).
    description: one line for humans.
    """

    name: str
    unit: str
    nominal: float
    low: float
    high: float
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"quantity name {self.name!r} is not an identifier")
        if not (self.low <= self.high):
            raise ValueError(f"{self.name}: bounds inverted ({self.low} > {self.high})")
        if not (self.low <= self.nominal <= self.high):
            raise ValueError(
                f"{self.name}: nominal {self.nominal} outside bounds [{self.low}, {self.high}]"
            )


def _names(items: tuple[Quantity, ...]) -> tuple[str, ...]:
    return tuple(q.name for q in items)


@dataclass(frozen=True)
class PlantSpec:
    """States, inputs, outputs and parameters of a plant, in kernel array order."""

    name: str
    states: tuple[Quantity, ...]
    inputs: tuple[Quantity, ...]
    outputs: tuple[Quantity, ...]
    params: tuple[Quantity, ...]
    description: str = ""
    _index: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for kind in ("states", "inputs", "outputs", "params"):
            names = _names(getattr(self, kind))
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"{self.name}.{kind}: duplicate names {sorted(dup)}")
            self._index[kind] = {n: i for i, n in enumerate(names)}

    # ---- name resolution (configure time only) ----
    def index(self, kind: str, name: str) -> int:
        """Index of `name` in the `kind` array ('states', 'inputs', 'outputs', 'params')."""
        try:
            return self._index[kind][name]
        except KeyError:
            known = ", ".join(self._index[kind])
            raise KeyError(f"{self.name} has no {kind[:-1]} {name!r} (known: {known})") from None

    def names(self, kind: str) -> tuple[str, ...]:
        return _names(getattr(self, kind))

    def quantity(self, kind: str, name: str) -> Quantity:
        return getattr(self, kind)[self.index(kind, name)]

    # ---- arrays (float64, kernel order) ----
    def nominal(self, kind: str) -> np.ndarray:
        return np.array([q.nominal for q in getattr(self, kind)], dtype=np.float64)

    def lows(self, kind: str) -> np.ndarray:
        return np.array([q.low for q in getattr(self, kind)], dtype=np.float64)

    def highs(self, kind: str) -> np.ndarray:
        return np.array([q.high for q in getattr(self, kind)], dtype=np.float64)

    @property
    def n_states(self) -> int:
        return len(self.states)

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    @property
    def n_outputs(self) -> int:
        return len(self.outputs)

    @property
    def n_params(self) -> int:
        return len(self.params)
