"""A residual dynamics model: a learned, linear-in-features correction of the state
derivative, applied after every plant step (in sysid simulations, lockstep and real time).

    phi(x, u) = [1, (x - lo_x) / scale_x, (u - lo_u) / scale_u]       (dimensionless)
    x[idx[r]] += dt * sum_f W[r, f] * phi_f        for each corrected state r

dt in the plant time unit, W[r, :] in state units per plant time unit. The model is four
arrays (W, feat_lo, feat_scale, idx) and `apply_correction` is a Numba kernel that allocates
nothing (one pass per row into a preallocated increment buffer; the corrected rows are few). Fitted by
`fit_residual` in hil/calibration/sysid.py: the same trajectory least squares as the
parameters, over the W entries of the chosen features, ridge-regularized.

Saved as .npz (arrays + state/feature names + the plant name); `ResidualModel.load`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def apply_correction(x, u, dt, W, feat_lo, feat_scale, idx, incr):
    """x[idx[r]] += dt * W[r] . phi(x, u) for every row r.

    Every increment is computed from x as it was on entry (into `incr`, a preallocated
    buffer of idx.size), then all are applied: the result does not depend on the order of
    the rows.
    """
    nx = x.size
    nu = u.size
    for r in range(idx.size):
        acc = W[r, 0]
        for i in range(nx):
            acc += W[r, 1 + i] * (x[i] - feat_lo[i]) / feat_scale[i]
        for j in range(nu):
            acc += W[r, 1 + nx + j] * (u[j] - feat_lo[nx + j]) / feat_scale[nx + j]
        incr[r] = acc * dt
    for r in range(idx.size):
        x[idx[r]] += incr[r]


MAX_ROWS = 8
"""Corrected states per model (a residual model corrects the few states the data calls for)."""


@dataclass
class ResidualModel:
    """The correction's arrays and the names they refer to (see module docstring)."""

    plant: str
    states: list[str]          # corrected states, one row of W each
    features: list[str]        # "x.<state>" / "u.<input>" names used (others have W = 0)
    W: np.ndarray              # (n_rows, 1 + n_states + n_inputs)
    feat_lo: np.ndarray        # (n_states + n_inputs,)
    feat_scale: np.ndarray     # (n_states + n_inputs,), > 0
    idx: np.ndarray            # (n_rows,) int64 state indices

    @classmethod
    def zeros(cls, spec, states, features, feat_lo, feat_scale) -> "ResidualModel":
        if not 1 <= len(states) <= MAX_ROWS:
            raise ValueError(f"a residual model corrects 1..{MAX_ROWS} states, not {len(states)}")
        idx = np.array([spec.index("states", s) for s in states], dtype=np.int64)
        W = np.zeros((len(states), 1 + spec.n_states + spec.n_inputs))
        return cls(spec.name, list(states), list(features), W,
                   np.asarray(feat_lo, float), np.asarray(feat_scale, float), idx)

    def feature_columns(self, spec) -> list[int]:
        """Columns of W that are free: the bias and the named features."""
        cols = [0]
        for f in self.features:
            kind, _, name = f.partition(".")
            if kind == "x":
                cols.append(1 + spec.index("states", name))
            elif kind == "u":
                cols.append(1 + spec.n_states + spec.index("inputs", name))
            else:
                raise ValueError(f"feature {f!r}: expected x.<state> or u.<input>")
        return cols

    def arrays(self):
        """The kernel's arguments after (x, u, dt): W, feat_lo, feat_scale, idx and a fresh
        increment buffer."""
        return self.W, self.feat_lo, self.feat_scale, self.idx, np.zeros(self.idx.size)

    def save(self, path: str | Path) -> None:
        np.savez(path, W=self.W, feat_lo=self.feat_lo, feat_scale=self.feat_scale, idx=self.idx,
                 states=np.array(self.states), features=np.array(self.features),
                 plant=np.array(self.plant))

    @classmethod
    def load(cls, path: str | Path, spec=None) -> "ResidualModel":
        with np.load(path, allow_pickle=False) as z:
            m = cls(str(z["plant"]), [str(s) for s in z["states"]], [str(f) for f in z["features"]],
                    z["W"].astype(float), z["feat_lo"].astype(float), z["feat_scale"].astype(float),
                    z["idx"].astype(np.int64))
        if spec is not None:
            if m.plant != spec.name:
                raise ValueError(f"{path}: residual model of plant {m.plant!r}, not {spec.name!r}")
            if m.W.shape[1] != 1 + spec.n_states + spec.n_inputs:
                raise ValueError(f"{path}: W has {m.W.shape[1]} columns, the plant needs "
                                 f"{1 + spec.n_states + spec.n_inputs}")
            for s, i in zip(m.states, m.idx):
                if spec.index("states", s) != i:
                    raise ValueError(f"{path}: state {s!r} is not at index {i} of {spec.name}")
        return m
