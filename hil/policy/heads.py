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
see. The members sent with each proposal are the heads centred on the network's own action,

    member_k(x) = net(x) + head_k(x) - mean_j head_j(x)           (plant units)

so the proposal (the network's action, unchanged) is their mean: the consistency check holds by
construction, and the disagreement check reads the heads' spread, a bootstrap estimate of how
well the buffer pins the network's behaviour down at x.

Stored as `heads.npz` (MLPEnsemble's format) beside the network; meta.json's "uncertainty"
records K, the buffer and the in-buffer scores (`scores_on_buffer`) from which an operator sets
[safety.confidence] disagreement_enter.
"""

from __future__ import annotations

import numpy as np

from hil.policy.ensemble import MLPEnsemble


def fit_heads(act, X: np.ndarray, heads: int, *, hidden: int = 32, steps: int = 1500,
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


class CentredHeads:
    """act_members(x) of the module docstring, for one feature vector x (plant units)."""

    def __init__(self, act, heads: MLPEnsemble):
        self.act, self.heads = act, heads

    def act_members(self, x: np.ndarray) -> np.ndarray:
        # numpy, not the compiled kernel: the policy process is confined before it loads the
        # policy, and K small heads cost microseconds either way
        h = self.heads.act_members_numpy(np.asarray(x, dtype=np.float64))
        return np.asarray(self.act(x), dtype=np.float64) + (h - h.mean(axis=0))


def scores(heads: MLPEnsemble, X: np.ndarray, span: np.ndarray) -> dict:
    """The safety gate's disagreement of the heads on features X (N, f), as
    hil/safety/fallback.py computes it with scale = span: max over actions of the population
    std over heads / span (the centring does not change it). Percentiles over X."""
    m = heads.predict_batch(np.asarray(X, dtype=np.float64))  # (M, N, n_a)
    dis = (m.std(axis=0) / span).max(axis=1)
    return {"samples": int(dis.size), "disagreement": {"p50": float(np.percentile(dis, 50)),
                                                      "p99": float(np.percentile(dis, 99)),
                                                      "max": float(dis.max())}}
