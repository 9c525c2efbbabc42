"""Per-step evaluation shared by the single and the vector env: features, reward, termination.

Arrays are (n,) for the single env and (N, n) for the vector env; every function works on
both (the last axis is the signal axis).
"""

from __future__ import annotations

import numpy as np


class Features:
    """Observation features over (measured outputs, applied inputs), as hil/policy/features.py
    builds them (a `d.` feature is the change since the previous observation, 0 on the first).

    A Bad measured output (NaN: a sensor dropout in "bad" mode, as on the bus) is replaced
    before the features are taken, by [gym].bad_observation: "hold" its last good value (the
    output's spec nominal before any good one), "substitute" the [gym].bad_substitute value
    (outputs without one are held), or "nan" (kept). `bad` holds which outputs were Bad in the
    last observation (spec order), for `info["bad_outputs"]`."""

    def __init__(self, model, shape: tuple[int, ...] = ()):
        self.index, self.delta = model.feature_index, model.feature_delta
        self.dpos = np.flatnonzero(self.delta)
        self.n_y = model.n_y
        self.obs = np.zeros(shape + (model.n_y + model.n_u,))
        self.prev = np.zeros(shape + (self.dpos.size,))
        self.first = np.ones(shape, dtype=bool)
        g = model.gym
        self.mode = getattr(g, "bad_observation", "hold")
        self.nominal_y = model.spec.nominal("outputs")
        self.good = np.broadcast_to(self.nominal_y, shape + (self.n_y,)).copy()  # last good measured outputs
        self.bad = np.zeros(shape + (self.n_y,), dtype=bool)
        names = list(model.spec.names("outputs"))
        self.sub_index = np.array([names.index(n) for n in getattr(g, "bad_substitute", {})], dtype=np.intp)
        self.sub_value = np.array(list(getattr(g, "bad_substitute", {}).values()), dtype=np.float64)

    def forget(self, rows=None) -> None:
        """A new episode (all, or the given rows of a vector env): last good values back to nominal."""
        if rows is None:
            self.good[...] = self.nominal_y
            self.first = np.ones(self.first.shape, dtype=bool)
        else:
            self.good[rows] = self.nominal_y
            self.first[rows] = True

    def _clean(self, y_meas) -> np.ndarray:
        """The measured outputs with Bad ones replaced (see the class docstring)."""
        np.isnan(y_meas, out=self.bad)
        if self.mode == "nan" or not self.bad.any():
            if self.mode != "nan":
                np.copyto(self.good, y_meas)
            return y_meas
        y = np.where(self.bad, self.good, y_meas)
        np.copyto(self.good, y)
        if self.mode == "substitute" and self.sub_index.size:
            sub = y[..., self.sub_index]
            np.copyto(sub, self.sub_value, where=self.bad[..., self.sub_index])
            y[..., self.sub_index] = sub
        return y

    def build(self, y_meas, u_app, out) -> None:
        """Features of the next observation into out (..., n_features)."""
        self.obs[..., : self.n_y] = self._clean(y_meas)
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
