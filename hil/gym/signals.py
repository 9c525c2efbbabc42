"""Per-step evaluation shared by the single and the vector env: features, reward, termination.

Arrays are (n,) for the single env and (N, n) for the vector env; every function works on
both (the last axis is the signal axis).
"""

from __future__ import annotations

import numpy as np


class Features:
    """Observation features over (measured outputs, applied inputs), as hil/policy/features.py
    builds them (a `d.` feature is the change since the previous observation, 0 on the first)."""

    def __init__(self, model, shape: tuple[int, ...] = ()):
        self.index, self.delta = model.feature_index, model.feature_delta
        self.dpos = np.flatnonzero(self.delta)
        self.n_y = model.n_y
        self.obs = np.zeros(shape + (model.n_y + model.n_u,))
        self.prev = np.zeros(shape + (self.dpos.size,))
        self.first = np.ones(shape, dtype=bool)

    def build(self, y_meas, u_app, out) -> None:
        """Features of the next observation into out (..., n_features)."""
        self.obs[..., : self.n_y] = y_meas
        self.obs[..., self.n_y:] = u_app
        np.take(self.obs, self.index, axis=-1, out=out)
        if self.dpos.size:
            cur = out[..., self.dpos].copy()
            d = cur - self.prev
            if self.first.ndim:
                d[self.first] = 0.0
            elif self.first:
                d[...] = 0.0
            out[..., self.dpos] = d
            self.prev[...] = cur
        if self.first.ndim:
            self.first[:] = False
        else:
            self.first = np.zeros((), dtype=bool)


def limits_violated(model, x, y):
    """True where a [gym].limits signal (true value) is outside its interval, or not finite."""
    bad = np.zeros(x.shape[:-1], dtype=bool)
    for block, i, lo, hi in model.limits:
        v = (y if block == "y" else x)[..., i]
        bad |= ~((v >= lo) & (v <= hi))
    return bad


def limit_names(model, x, y) -> list[str]:
    """Names of the violated [gym].limits (single instance), for info."""
    out = []
    for (block, i, lo, hi), name in zip(model.limits, model.gym.limits):
        v = (y if block == "y" else x)[i]
        if not (lo <= v <= hi):
            out.append(name)
    return out
