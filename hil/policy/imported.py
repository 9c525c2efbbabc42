"""What every `hil policy import` does once the source is readable: check it against the
scenario, roll it out, fit its heads, write the version.

The source (an SB3 zip, a TorchScript or an ONNX file) is reduced by its importer to a
function `act(x) -> action` on one feature vector (plant units, the env's observation order,
to action in plant units, the env's action order) and the files of the version. Here:

1. its observation and action sizes are checked against the scenario's gym env (hil/gym/env.py:
   the features and bus-driven inputs in the scenario's declared order), and its actions on the
   rollout are checked to be finite and inside the inputs' physical bounds (a graph whose action
   scaling is neither folded in nor recorded fails here, with the input named);
2. a rollout of `rollout_steps` env steps with the imported policy acting gives the features
   it meets: their mean and covariance are `stats.npz` (the Mahalanobis gate's statistics);
3. with `heads >= 2`, K bootstrapped heads are fitted on that buffer (hil/policy/heads.py) and
   written as `heads.npz`: the members whose spread the disagreement check reads;
4. `meta.json` (hil/policy/store.py) records the features, actions, source, its sha256, the
   heads' in-buffer scores and `known_good` (false unless asked: an import is a candidate).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from hil.policy.store import PolicyStore


class ImportRefused(ValueError):
    """The model cannot be imported (the reason names what and why)."""


def scenario_env(scenario):
    """The scenario's gym env (its features and actions are what the policy must fit)."""
    from hil.gym.env import HilEnv

    if scenario.gym is None:
        raise ImportRefused(f"scenario {scenario.name!r} has no [gym] section: features and actions come from its env")
    return HilEnv(scenario)


def check_sizes(env, n_obs: int | None, n_act: int | None, what: str = "the model") -> None:
    n_f, n_a = len(env.feature_names), len(env.action_names)
    if n_obs is not None and n_obs != n_f:
        raise ImportRefused(f"{what} observes ({n_obs},), the scenario's env gives {n_f} features "
                            f"({', '.join(env.feature_names)})")
    if n_act is not None and n_act != n_a:
        raise ImportRefused(f"{what} acts on ({n_act},), the scenario has {n_a} bus inputs "
                            f"({', '.join(env.action_names)})")


def rollout(env, act: Callable[[np.ndarray], np.ndarray], steps: int, seed: int,
            reset: Callable[[], None] | None = None, actions: list | None = None) -> np.ndarray:
    """Features (steps, n_f) the policy meets in the env with itself acting (its actions appended
    to `actions` if given; `reset()` called at every episode start, for a stateful policy).
    Raises ImportRefused when an action is not finite or leaves the inputs' physical bounds."""
    low, high = env.action_space.low, env.action_space.high
    tol = 1e-6 * (high - low)  # float32 graphs: rounding at the bounds
    feats = []
    obs, _ = env.reset(seed=seed)
    if reset is not None:
        reset()
    for k in range(int(steps)):
        feats.append(obs)
        a = np.asarray(act(obs), dtype=np.float64).reshape(-1)
        if actions is not None:
            actions.append(a.copy())
        if a.shape != low.shape:
            raise ImportRefused(f"the policy returned {a.shape[0]} action values, the scenario has {low.size} "
                                f"({', '.join(env.action_names)})")
        bad = ~np.isfinite(a) | (a < low - tol) | (a > high + tol)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ImportRefused(f"at rollout step {k} the policy's {env.action_names[i]} = {a[i]:.6g} is not "
                                f"inside its bounds [{low[i]:g}, {high[i]:g}]: fold the action scaling into the "
                                "graph or record it (--action-map clip|squash)")
        obs, _, term, trunc, _ = env.step(np.clip(a, low, high))
        if term or trunc:
            obs, _ = env.reset()
            if reset is not None:
                reset()
    return np.asarray(feats)


def write_version(scenario, env, out: str | Path, *, kind: str, files: Callable[[Path], dict],
                  act: Callable[[np.ndarray], np.ndarray], source: str | Path, training: dict,
                  rollout_steps: int = 2000, seed: int = 0, heads: int = 5, version: str | None = None,
                  known_good: bool = False, notes: str = "", reset: Callable[[], None] | None = None,
                  extra_meta: dict | None = None) -> Path:
    """Roll out, fit heads, write `<out>/<version>/` (see the module docstring). `files(vdir)`
    writes the policy's own files into vdir and returns the meta keys naming them. A stateful
    policy (a residual: hil/policy/residual.py) gives `reset`; its heads are fitted on the
    actions it took in the rollout (calling it again on the buffer would advance its state)."""
    A_roll: list = []
    X = rollout(env, act, rollout_steps, seed, reset, A_roll)
    n_f = X.shape[1]
    uncertainty = None
    head_model = None
    if heads:
        from hil.policy.heads import fit_heads, scores

        def act_batch(Xb):
            if reset is not None:  # stateful: what it did at those features
                return np.asarray(A_roll)
            return np.array([act(x) for x in Xb])

        try:
            head_model, fit = fit_heads(act_batch, X, heads, seed=seed)
        except ValueError as exc:
            raise ImportRefused(f"heads: {exc}") from None
        span = env.action_space.high - env.action_space.low
        uncertainty = {"kind": "bootstrap_heads", "file": "heads.npz", "heads": int(heads),
                       "buffer": {"source": "rollout of the imported policy", "steps": int(rollout_steps),
                                  "seed": int(seed)},
                       "members": "centred on the network's action", "fit": fit,
                       "scores_on_buffer": scores(head_model, X, span)}
    store = PolicyStore(out)
    version = version or store.next_version()
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()
    vdir = store.path(version)
    vdir.mkdir(parents=True, exist_ok=True)
    meta = {"plant": scenario.plant.model, "kind": kind, "stats": "stats.npz",
            "features": list(env.feature_names), "actions": list(env.action_names), "known_good": bool(known_good),
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "notes": notes,
            "uncertainty": uncertainty,
            "training": {"source": str(source), "sha256": digest, **training,
                         "stats_rollout_steps": int(rollout_steps), "stats_seed": int(seed)}}
    meta.update(files(vdir))
    meta.update(extra_meta or {})
    np.savez(vdir / "stats.npz", mean=X.mean(axis=0), cov=np.cov(X, rowvar=False).reshape(n_f, n_f))
    if head_model is not None:
        head_model.save(vdir / "heads.npz")
    store.write_meta(version, meta)  # last: a version without meta.json is not listed
    return vdir
