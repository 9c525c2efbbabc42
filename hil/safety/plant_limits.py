"""Plant-provided, state-dependent linear limits for the projection (`[safety.projection]
plant_limits = true`).

Some limits are linear in the action but their rows change with the state itself, not only
their right-hand side: a grid's line limits come from PTDF rows of the current topology,
which change when a line trips. `[[safety.projection.linear]]` has fixed weights, so such
a plant provides a hook instead, in its plant module:

    linear_limits(model: PlantModel) -> limits      # built once per wrapper
    limits(y, u) -> (W, b, names)                   # every decision
    limits.unknown(y, u) -> bool                    # optional: rows cannot be computed

W (m x n_inputs, over ALL the plant's inputs, spec order) and b (m) mean W @ u' <= b for the
inputs u' that will be applied; y are the measured outputs and u the applied inputs the
wrapper sees. The rows are restricted to the action inputs here: the other inputs keep their
applied values, so their part moves to b. They are projected on together with the
configured `linear` limits (same kernel, same clip reasons `linear:<row name>`).

Fail closed: rows that cannot be computed (a Bad signal they read: `unknown`) count as
unknown limits (the policy may not act, as for a `linear` limit); a hook that raises pins
every action input to its applied value for that decision (nothing moves) and says why in
the clip reason `linear:plant_limits_failed`.
"""

from __future__ import annotations

import logging

import numpy as np

from hil.safety.projection import Projector

log = logging.getLogger("hil.safety")


def plant_limits_hook(scenario):
    """The plant module's `linear_limits(model)` built for this scenario, or a ValueError
    naming the key if the plant has none."""
    from plants.base import load_plant_module

    model = scenario.plant.load()
    module = load_plant_module(scenario.plant.model)
    make = getattr(module, "linear_limits", None)
    if make is None:
        raise ValueError(f"safety.projection.plant_limits: plant {scenario.plant.model!r} provides no "
                         "linear_limits(model) hook")
    return make(model)


class PlantLimitProjector(Projector):
    """A Projector whose linear limits are the configured ones plus the plant's rows."""

    def __init__(self, section, spec, action_names: list[str], hook):
        super().__init__(section, spec, action_names)
        self.hook = hook
        self.action_index = np.array([spec.index("inputs", a) for a in self.names], dtype=np.intp)
        self.other = np.setdiff1d(np.arange(spec.n_inputs), self.action_index)
        self._fixed = (self.W, self.Wz, self.b0, self.By, self.Bu, list(self.linear_names))
        self.plant_rows = 0
        self.plant_failures = 0

    def unknown_limits(self, y: np.ndarray, u: np.ndarray) -> list[str]:
        names = super().unknown_limits(y, u)
        unknown = getattr(self.hook, "unknown", None)
        if unknown is not None and unknown(y, u):
            names = names + ["plant_limits"]
        return names

    def _plant_rows(self, y, u):
        W0, Wz0, b00, By0, Bu0, names0 = self._fixed
        n = len(self.names)
        try:
            W, b, names = self.hook(y, u)
            W = np.asarray(W, dtype=np.float64)
            b = np.asarray(b, dtype=np.float64)
            Wa = W[:, self.action_index]
            rest = W[:, self.other]
            used = rest != 0.0
            b_eff = b - np.where(used, rest * np.where(np.isfinite(u[self.other]), u[self.other], 0.0), 0.0).sum(axis=1)
            keep = np.abs(Wa).sum(axis=1) > 0.0
            Wa, b_eff, names = Wa[keep], b_eff[keep], [nm for nm, k in zip(names, keep) if k]
            if not np.isfinite(b_eff).all():
                raise ValueError("non-finite b")
        except Exception as exc:  # fail closed: nothing moves this decision
            self.plant_failures += 1
            log.warning("safety: plant limits failed (%s): action inputs held at their applied values", exc)
            held = u[self.action_index]
            Wa = np.vstack([np.eye(n), -np.eye(n)])
            b_eff = np.concatenate([held, -held])
            names = ["plant_limits_failed"] * (2 * n)
        m = Wa.shape[0]
        self.plant_rows = m
        self.W = np.vstack([W0, Wa])
        self.Wz = self.W * self.scale[None, :]
        self.b0 = np.concatenate([b00, b_eff])
        self.By = np.vstack([By0, np.zeros((m, By0.shape[1]))])
        self.Bu = np.vstack([Bu0, np.zeros((m, Bu0.shape[1]))])
        self.linear_names = names0 + list(names)
        k = self.W.shape[0]
        self.bvec = np.zeros(k)
        self.work = np.zeros((k + 6, 2 * n))

    def project(self, a, prev, dt_s, y, u, band_lo=None, band_hi=None, linear: bool = True):
        if linear:
            self._plant_rows(np.asarray(y, dtype=np.float64), np.asarray(u, dtype=np.float64))
        return super().project(a, prev, dt_s, y, u, band_lo, band_hi, linear)
