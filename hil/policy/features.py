"""Observation features: named signals resolved once to indices into (y_meas, u_applied).

A feature name is
- an output name (`dissolved_oxygen`, or `y.dissolved_oxygen`), plant units;
- an applied input (`u.agitation_power`), plant units;
- `d.<output or u.input>`: its change since the previous observation (0 on the first one), e.g.
  `d.dissolved_oxygen`. These make the map stateful: feed it every observation, in order.
"""

from __future__ import annotations

import numpy as np


def split_feature(name: str) -> tuple[bool, str]:
    """(is a delta, signal name)."""
    return (True, name[2:]) if name.startswith("d.") else (False, name)


class FeatureMap:
    """Builds the feature vector of an observation without string lookups per step."""

    def __init__(self, spec, names: list[str]):
        from hil.safety.config import signal_index

        self.names = list(names)
        n_out = spec.n_outputs
        idx, delta = [], []
        for name in self.names:
            is_delta, sig = split_feature(name)
            kind, i = signal_index(spec, sig)  # KeyError names the unknown signal
            idx.append(i if kind == "y" else n_out + i)
            delta.append(is_delta)
        self._index = np.array(idx, dtype=np.intp)
        self._delta = np.array(delta, dtype=bool)
        self._any_delta = bool(self._delta.any())
        self._dpos = np.flatnonzero(self._delta)
        self._n_out = n_out
        self._obs = np.zeros(n_out + spec.n_inputs)
        self._prev: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.names)

    def reset(self) -> None:
        self._prev = None

    def build(self, y: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Features of the next observation (a new array)."""
        self._obs[: self._n_out] = y
        self._obs[self._n_out :] = u
        vals = self._obs[self._index]
        if self._any_delta:
            cur = vals[self._dpos]
            vals[self._dpos] = 0.0 if self._prev is None else cur - self._prev
            self._prev = cur
        return vals
