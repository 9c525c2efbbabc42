"""Bootstrapped heads: a confidence signal for a single imported network.

A single network gives the safety wrapper's disagreement and consistency checks nothing to
compute (one member), so they fail closed on every step and the policy can never be promoted.
`hil policy import --heads K` fits K small heads beside it (the members of
hil/policy/ensemble.py: a linear path and one tanh hidden layer), each on its own bootstrap
resample of the import's rollout buffer, by behaviour cloning of the network: inputs the
features X (plant units) the network met in the scenario's env, targets its actions net(X)
(plant units). Where the buffer is dense the heads agree with each other and with the network;
away from it their fits differ, so their spread (the disagreement check: max over actions of
std over heads / the input's scale) grows where the network acts on states the import did not
see. The network's own action stays the proposal; the heads are its members, so the
consistency check asks that the network lies inside its heads' hull (widened by the tolerance):
a network and its distillation that part ways are not trusted either.

Stored as `heads.npz` (MLPEnsemble's format) beside the network; meta.json's "uncertainty"
records K, the buffer and the in-buffer scores (`scores_on_buffer`) from which an operator sets
[safety.confidence] disagreement_enter / consistency_tolerance.
"""

from __future__ import annotations

import numpy as np

from hil.policy.ensemble import MLPEnsemble


def fit_heads(act, X: np.ndarray, heads: int, *, hidden: int = 32, steps: int = 3000,
              seed: int = 0) -> tuple[MLPEnsemble, dict]:
    """K heads imitating `act` (features (N, f) -> actions (N, a), plant units) on X, each on a
    bootstrap resample of X. Returns (heads, the fit's report)."""
    if heads < 2:
        raise ValueError(f"heads: {heads} (at least 2 give a spread)")
    X = np.asarray(X, dtype=np.float64)
    A = np.asarray(act(X), dtype=np.float64)
    if X.ndim != 2 or A.ndim != 2 or A.shape[0] != X.shape[0]:
        raise ValueError(f"features {X.shape} and actions {A.shape} do not pair up")
    if X.shape[0] < 10 * X.shape[1]:
        raise ValueError(f"a buffer of {X.shape[0]} samples is too small for heads over {X.shape[1]} features "
                         f"(at least {10 * X.shape[1]}: raise the rollout steps)")
    ens, report = MLPEnsemble.fit(X, A, members=int(heads), hidden=hidden, steps=steps, seed=seed)
    return ens, report


def scores(act, heads: MLPEnsemble, X: np.ndarray, span: np.ndarray) -> dict:
    """The safety gate's member scores of (network, heads) on X (N, f), as
    hil/safety/fallback.py computes them with scale = span: disagreement = max over actions
    of the population std over heads / span; inconsistency = max over actions of how far the
    network's action lies outside the heads' [min, max], / span. Percentiles over X."""
    X = np.asarray(X, dtype=np.float64)
    a = np.asarray(act(X), dtype=np.float64)  # (N, n_a)
    m = heads.predict_batch(X)  # (M, N, n_a)
    dis = (m.std(axis=0) / span).max(axis=1)
    outside = np.maximum(0.0, np.maximum(m.min(axis=0) - a, a - m.max(axis=0))) / span
    inc = outside.max(axis=1)

    def pct(v):
        return {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)), "max": float(v.max())}

    return {"samples": int(X.shape[0]), "disagreement": pct(dis), "inconsistency": pct(inc),
            "fraction_outside_1pct": float(np.mean(inc > 0.01))}
