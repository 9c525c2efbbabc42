"""A residual dynamics model: a learned, linear-in-features correction of the state
derivative, applied after every plant step (in sysid simulations, lockstep and real time).

    phi = [1, (x - lo_x) / scale_x, (u - lo_u) / scale_u, (e - lo_e) / scale_e]   (dimensionless)
    x[idx[r]] += dt * sum_f W[r, f] * phi_f        for each corrected state r

dt in the plant time unit, W[r, :] in state units per plant time unit. Besides the plant's
states x and inputs u, a model may carry E extra features e, each read from one "source"
signal s (a plant input, or in a fit a logged extra column, see below):

    value  e = s                                       (a logged dosing command, say)
    since  e = time since the last rising edge of s    (plant time unit)
    trace  e = exp(-rate * time since that edge)       (rate = 1 / tau, per plant time unit)

A rising edge is s > 0 after s <= 0 (an event: an antifoam dose, a pump switching on); the
start of a run counts as one (the trace is 1 and the time since 0 at step 0). The edge is
detected on the step's applied input, the feature read at the step's start and the time
advanced by dt after the correction: in a log replay and in the loop alike.

Sources: an index j < n_inputs is the plant input j (the loop has it: u_app); j >= n_inputs
is column j - n_inputs of extra rows the sysid simulator appends to u from the logged extra
columns (`ResidualModel.extra_columns`). The loop has no such signal, so a model that reads
one is for diagnosis only: `save` refuses it, naming the feature.

Kernel arrays (`arrays()`: what `correct_stage` in hil/loop/step.py and the sysid simulator
pass; shapes fixed by R rows, nx states, nu inputs, E extra features):

    W           (R, 1 + nx + nu + E)
    feat_lo     (nx + nu + E,)          centre of every feature
    feat_scale  (nx + nu + 2E,)         scale of every feature (> 0), then each extra
                                        feature's rate (1 / plant time unit; 0 unless trace)
    idx         (R + 2E,) int64         corrected state per row, then each extra feature's
                                        source index, then its kind (0 value, 1 since, 2 trace)
    incr        (R + 2E,)               per-instance buffer: the row increments, then per
                                        extra feature (time since its last edge, its source
                                        at the previous step). Zeros = a run's start.

`apply_correction` is a Numba kernel that allocates nothing (the increments are computed
from x as it was on entry, then applied). Fitted by hil/calibration/residual_fit.py.
Saved as .npz (arrays + state/feature names + the plant name); `ResidualModel.load`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numba import njit

VALUE, SINCE, TRACE = 0, 1, 2
KINDS = {"e": VALUE, "since": SINCE, "trace": TRACE}


@njit(cache=True, nogil=True)
def apply_correction(x, u, dt, W, feat_lo, feat_scale, idx, incr):
    """x[idx[r]] += dt * W[r] . phi(x, u, event state) for every row r (module docstring).

    Every increment is computed from x as it was on entry (into incr[:R]), then all are
    applied: the result does not depend on the order of the rows. u may be longer than the
    plant's inputs (the sysid simulator appends logged extra columns)."""
    nx = x.size
    nr = W.shape[0]
    ne = (idx.size - nr) // 2
    nu = W.shape[1] - 1 - nx - ne
    f0 = nx + nu
    for e in range(ne):  # rising edges of the event sources reset their time
        if idx[nr + ne + e] != 0:
            s = u[idx[nr + e]]
            if s > 0.0 and not incr[nr + 2 * e + 1] > 0.0:
                incr[nr + 2 * e] = 0.0
            incr[nr + 2 * e + 1] = s
    for r in range(nr):
        acc = W[r, 0]
        for i in range(nx):
            acc += W[r, 1 + i] * (x[i] - feat_lo[i]) / feat_scale[i]
        for j in range(nu):
            acc += W[r, 1 + nx + j] * (u[j] - feat_lo[nx + j]) / feat_scale[nx + j]
        for e in range(ne):
            kind = idx[nr + ne + e]
            if kind == 0:
                v = u[idx[nr + e]]
            elif kind == 1:
                v = incr[nr + 2 * e]
            else:
                v = math.exp(-feat_scale[f0 + ne + e] * incr[nr + 2 * e])
            acc += W[r, 1 + f0 + e] * (v - feat_lo[f0 + e]) / feat_scale[f0 + e]
        incr[r] = acc * dt
    for r in range(nr):
        x[idx[r]] += incr[r]
    for e in range(ne):
        if idx[nr + ne + e] != 0:
            incr[nr + 2 * e] += dt


MAX_ROWS = 8
"""Corrected states per model (a residual model corrects the few states the data calls for)."""


@dataclass(frozen=True)
class ExtraFeature:
    """One extra feature: `kind` (value / since / trace) of `source`, a plant input or a logged
    extra column; tau_s the trace's time constant (s)."""

    name: str                  # as written: e.<src> | since.<src> | trace.<src>:<tau_s>
    kind: int
    source: str
    tau_s: float = 0.0


def parse_extra(name: str) -> ExtraFeature:
    """`e.<source>`, `since.<source>` or `trace.<source>:<tau_s>` -> ExtraFeature (ValueError
    naming the feature otherwise)."""
    kind, _, rest = name.partition(".")
    if kind not in KINDS or not rest:
        raise ValueError(f"feature {name!r}: expected x.<state>, u.<input>, e.<column>, since.<column> "
                         "or trace.<column>:<tau_s>")
    if kind == "trace":
        src, _, tau = rest.rpartition(":")
        try:
            tau_s = float(tau)
        except ValueError:
            tau_s = math.nan
        if not src or not (math.isfinite(tau_s) and tau_s > 0):
            raise ValueError(f"feature {name!r}: a trace needs its time constant in s > 0: trace.<column>:<tau_s>")
        return ExtraFeature(name, TRACE, src, tau_s)
    if ":" in rest:
        raise ValueError(f"feature {name!r}: only a trace takes a time constant")
    return ExtraFeature(name, KINDS[kind], rest)


def is_extra(name: str) -> bool:
    return name.partition(".")[0] in KINDS


def event_series(values: np.ndarray, t_s: np.ndarray, kind: int, tau_s: float = 0.0) -> np.ndarray:
    """What the kernel reads for one extra feature at each sample of a log (NumPy, for the
    fit's feature scaling and the findings): the value, the time since the last rising
    edge (s), or the trace exp(-t_since / tau_s). NaN values count as 0 (no event)."""
    v = np.nan_to_num(np.asarray(values, float), nan=0.0)
    if kind == VALUE:
        return v
    since = np.empty(v.size)
    last, prev = t_s[0], 0.0
    for k in range(v.size):
        if v[k] > 0.0 and not prev > 0.0:
            last = t_s[k]
        prev = v[k]
        since[k] = t_s[k] - last
    return since if kind == SINCE else np.exp(-since / tau_s)


@dataclass
class ResidualModel:
    """The correction's arrays and the names they refer to (see module docstring)."""

    plant: str
    states: list[str]          # corrected states, one row of W each
    features: list[str]        # names of the free features (others have W = 0)
    W: np.ndarray              # (n_rows, 1 + n_states + n_inputs + E)
    feat_lo: np.ndarray        # (n_states + n_inputs + E,)
    feat_scale: np.ndarray     # (n_states + n_inputs + 2E,): scales, then the extra features' rates
    idx: np.ndarray            # (n_rows + 2E,) int64: state indices, then sources and kinds
    extra_columns: list[str] = field(default_factory=list)  # logged extra columns read (sources >= n_inputs)

    @property
    def n_rows(self) -> int:
        return self.W.shape[0]

    @property
    def n_extra(self) -> int:
        return (self.idx.size - self.n_rows) // 2

    @classmethod
    def zeros(cls, spec, states, features, feat_lo, feat_scale, time_unit_s: float = 1.0) -> "ResidualModel":
        """A model with W = 0. feat_lo / feat_scale: the centres and scales of the plant's
        states and inputs and then of the extra features among `features` (in their order)."""
        if not 1 <= len(states) <= MAX_ROWS:
            raise ValueError(f"a residual model corrects 1..{MAX_ROWS} states, not {len(states)}")
        extras = [parse_extra(f) for f in features if is_extra(f)]
        ins = spec.names("inputs")
        cols: list[str] = []
        src, rate = [], []
        for ef in extras:
            if ef.kind == VALUE and ef.source in ins:
                raise ValueError(f"feature {ef.name!r}: {ef.source!r} is an input of {spec.name}: use u.{ef.source}")
            if ef.source in ins:
                src.append(ins.index(ef.source))
            else:
                if ef.source not in cols:
                    cols.append(ef.source)
                src.append(spec.n_inputs + cols.index(ef.source))
            rate.append(time_unit_s / ef.tau_s if ef.kind == TRACE else 0.0)
        nf = spec.n_states + spec.n_inputs + len(extras)
        feat_lo, feat_scale = np.asarray(feat_lo, float), np.asarray(feat_scale, float)
        if feat_lo.shape != (nf,) or feat_scale.shape != (nf,):
            raise ValueError(f"feature centres and scales: {nf} each expected (states, inputs, extra features), "
                             f"got {feat_lo.size} and {feat_scale.size}")
        idx = np.array([spec.index("states", s) for s in states] + src + [ef.kind for ef in extras], dtype=np.int64)
        W = np.zeros((len(states), 1 + nf))
        m = cls(spec.name, list(states), list(features), W, feat_lo, np.concatenate([feat_scale, rate]), idx, cols)
        m.feature_columns(spec)  # every name checked
        return m

    def feature_columns(self, spec) -> list[int]:
        """Columns of W that are free: the bias and the named features."""
        cols = [0]
        base = 1 + spec.n_states + spec.n_inputs
        e = 0
        for f in self.features:
            kind, _, name = f.partition(".")
            if kind == "x":
                cols.append(1 + spec.index("states", name))
            elif kind == "u":
                cols.append(1 + spec.n_states + spec.index("inputs", name))
            elif kind in KINDS:
                cols.append(base + e)
                e += 1
            else:
                raise ValueError(f"feature {f!r}: expected x.<state>, u.<input>, e.<column>, since.<column> "
                                 "or trace.<column>:<tau_s>")
        return cols

    def loop_blockers(self) -> list[str]:
        """Features the loop cannot feed (read from a logged extra column, not a plant input),
        each with the reason; empty when the loop can apply the model as fitted."""
        out = []
        for f in self.features:
            if is_extra(f):
                ef = parse_extra(f)
                if ef.source in self.extra_columns:
                    out.append(f"feature {f!r} reads the logged column {ef.source!r}, which is no input of "
                               f"{self.plant}: the loop has no such signal")
        return out

    def arrays(self):
        """The kernel's arguments after (x, u, dt): W, feat_lo, feat_scale, idx and a fresh
        per-instance buffer (increments and event state)."""
        return self.W, self.feat_lo, self.feat_scale, self.idx, np.zeros(self.idx.size)

    def save(self, path: str | Path) -> None:
        """Write the model for the loop; ValueError (naming the feature) if the loop could not
        feed one of its features: a model applied without a feature it was fitted with is
        another model."""
        blockers = self.loop_blockers()
        if blockers:
            raise ValueError(f"{path}: not written: " + "; ".join(blockers)
                             + ". Fit the model without it (it may still name the effect), or log the "
                               "event as an input of the plant")
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
            ne = sum(is_extra(f) for f in m.features)
            nr = len(m.states)
            nf = spec.n_states + spec.n_inputs + ne
            if m.W.shape != (nr, 1 + nf):
                raise ValueError(f"{path}: W is {m.W.shape}, the plant and the model's features need {(nr, 1 + nf)}")
            if m.feat_lo.shape != (nf,) or m.feat_scale.shape != (nf + ne,) or m.idx.shape != (nr + 2 * ne,):
                raise ValueError(f"{path}: feat_lo, feat_scale or idx do not match {nr} rows and {ne} extra features")
            if not np.all(m.feat_scale[:nf] > 0):
                raise ValueError(f"{path}: feature scales must be > 0")
            for s, i in zip(m.states, m.idx[:nr]):
                if spec.index("states", s) != i:
                    raise ValueError(f"{path}: state {s!r} is not at index {i} of {spec.name}")
            for e, f in enumerate(x for x in m.features if is_extra(x)):
                ef = parse_extra(f)
                if ef.source not in spec.names("inputs"):
                    raise ValueError(f"{path}: feature {f!r}: {ef.source!r} is no input of {spec.name}")
                if m.idx[nr + e] != spec.index("inputs", ef.source) or m.idx[nr + ne + e] != ef.kind:
                    raise ValueError(f"{path}: feature {f!r} does not match its stored source and kind")
        return m
