"""`hil policy import`: a Stable-Baselines3 model (its .zip) as a versioned hil policy (kind "mlp").

What is written into `<out>/vN/` (hil/policy/store.py):
- `policy.npz`: the actor's deterministic path as hil/policy/mlp.py layers, with the
  VecNormalize observation statistics (if given) and the action mapping folded in: PPO / A2C
  the Gaussian mean clipped to the action bounds, SAC the tanh-squashed mean, TD3 / DDPG the
  tanh output, both rescaled to the bounds, exactly as SB3's `predict(deterministic=True)`;
- `meta.json`: kind "mlp", the features and actions of the scenario's gym env (its
  observation and action order), the source file and its sha256, the algorithm, and
  `known_good` (false unless asked: an imported network is a candidate);
- `stats.npz`: mean and covariance of the features the imported policy meets in a rollout of
  the scenario's gym env (the Mahalanobis gate's training statistics).

Checked before anything is written: the model's observation and action sizes against the env's,
its action bounds against the scenario's inputs, every layer a supported one. A network type
this cannot express (CNN, recurrent, dict observations) is refused with its name.
"""

from __future__ import annotations

import hashlib
import pickle
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from hil.policy.mlp import MLPPolicy
from hil.policy.store import PolicyStore

ALGOS = ("PPO", "A2C", "SAC", "TD3", "DDPG")
_ACT = {"Tanh": "tanh", "ReLU": "relu", "ELU": "elu", "Sigmoid": "sigmoid", "Identity": "identity"}


class ImportRefused(ValueError):
    """The model cannot be imported (the reason names what and why)."""


def _layers(modules) -> tuple[list, list, list]:
    """(weights (n_in, n_out), biases, activations) of a sequence of torch modules."""
    import torch.nn as nn

    Ws, bs, acts = [], [], []
    for mod in modules:
        if isinstance(mod, nn.Sequential):
            W2, b2, a2 = _layers(list(mod))
            Ws += W2
            bs += b2
            acts += a2
        elif isinstance(mod, nn.Linear):
            Ws.append(mod.weight.detach().cpu().double().numpy().T.copy())
            b = mod.bias.detach().cpu().double().numpy().copy() if mod.bias is not None else np.zeros(mod.out_features)
            bs.append(b)
            acts.append("identity")
        elif type(mod).__name__ == "LeakyReLU" and abs(mod.negative_slope - 0.01) < 1e-12:
            acts[-1] = "leaky_relu"
        elif type(mod).__name__ in _ACT:
            if not Ws:
                raise ImportRefused(f"activation {type(mod).__name__} before any linear layer")
            if _ACT[type(mod).__name__] != "identity":
                acts[-1] = _ACT[type(mod).__name__]
        elif type(mod).__name__ == "Flatten":
            continue
        else:
            raise ImportRefused(f"layer {type(mod).__name__} is not supported (Linear and elementwise activations)")
    return Ws, bs, acts


def _actor(model) -> tuple[list, list, list, bool]:
    """Layers of the deterministic actor and whether its output is tanh-squashed."""
    import torch.nn as nn

    pol = model.policy
    name = type(model).__name__
    extractor = getattr(pol, "features_extractor", None) or getattr(getattr(pol, "actor", None), "features_extractor",
                                                                    None)
    if extractor is not None and type(extractor).__name__ != "FlattenExtractor":
        raise ImportRefused(f"features extractor {type(extractor).__name__} is not supported (MlpPolicy only)")
    if name in ("PPO", "A2C"):
        if getattr(pol, "squash_output", False):
            raise ImportRefused("a squashed (gSDE) on-policy actor is not supported")
        Ws, bs, acts = _layers([pol.mlp_extractor.policy_net, pol.action_net])
        return Ws, bs, acts, False
    if name == "SAC":
        Ws, bs, acts = _layers([pol.actor.latent_pi, pol.actor.mu])
        return Ws, bs, acts, True
    if name in ("TD3", "DDPG"):
        mods = list(pol.actor.mu)
        if not mods or not isinstance(mods[-1], nn.Tanh):
            raise ImportRefused(f"{name} actor without a final Tanh")
        Ws, bs, acts = _layers(mods[:-1])
        return Ws, bs, acts, True
    raise ImportRefused(f"algorithm {name} is not supported ({', '.join(ALGOS)})")


def load_sb3(path: str | Path, algo: str = "auto"):
    """The SB3 model in `path` (a .zip saved by `model.save`), on the CPU."""
    import stable_baselines3 as sb3

    names = ALGOS if algo == "auto" else (algo.upper(),)
    errors = []
    for n in names:
        cls = getattr(sb3, n, None)
        if cls is None:
            raise ImportRefused(f"unknown algorithm {algo!r} ({', '.join(ALGOS)})")
        try:
            return cls.load(str(path), device="cpu")
        except Exception as exc:  # noqa: BLE001 - the next class may be the right one
            errors.append(f"{n}: {type(exc).__name__}")
    raise ImportRefused(f"{path} is not a model of {', '.join(names)} ({'; '.join(errors)})")


def mlp_from_sb3(model, vecnormalize=None) -> MLPPolicy:
    """The hil network computing `model.predict(normalize(x), deterministic=True)`."""
    from gymnasium import spaces

    if not isinstance(model.observation_space, spaces.Box) or not isinstance(model.action_space, spaces.Box):
        raise ImportRefused("only Box observation and action spaces are supported")
    Ws, bs, acts, squash = _actor(model)
    norm = {}
    if vecnormalize is not None and getattr(vecnormalize, "norm_obs", False):
        rms = vecnormalize.obs_rms
        norm = dict(obs_mean=np.asarray(rms.mean, dtype=np.float64), obs_var=np.asarray(rms.var, dtype=np.float64),
                    obs_eps=float(vecnormalize.epsilon), obs_clip=float(vecnormalize.clip_obs))
    return MLPPolicy(Ws, bs, acts, low=model.action_space.low, high=model.action_space.high, squash=squash, **norm)


def import_sb3(model_path: str | Path, scenario, out: str | Path, *, vecnormalize_path: str | Path | None = None,
               algo: str = "auto", version: str | None = None, rollout_steps: int = 2000, seed: int = 0,
               known_good: bool = False, notes: str = "") -> Path:
    """Import the SB3 model at `model_path` for `scenario` (a validated Scenario with [gym])
    into the policy directory `out`; returns the version directory. Raises ImportRefused."""
    from hil.gym.env import HilEnv

    model = load_sb3(model_path, algo)
    vecnorm = None
    if vecnormalize_path is not None:
        with open(vecnormalize_path, "rb") as f:
            vecnorm = pickle.load(f)
        if not hasattr(vecnorm, "obs_rms"):
            raise ImportRefused(f"{vecnormalize_path} is not a saved VecNormalize")
    env = HilEnv(scenario)
    n_f, n_a = len(env.feature_names), len(env.action_names)
    if model.observation_space.shape != (n_f,):
        raise ImportRefused(f"the model observes {model.observation_space.shape}, the scenario's env gives {n_f} "
                            f"features ({', '.join(env.feature_names)})")
    if model.action_space.shape != (n_a,):
        raise ImportRefused(f"the model acts on {model.action_space.shape}, the scenario has {n_a} bus inputs "
                            f"({', '.join(env.action_names)})")
    if not (np.allclose(model.action_space.low, env.action_space.low)
            and np.allclose(model.action_space.high, env.action_space.high)):
        raise ImportRefused(f"the model's action bounds {model.action_space.low}..{model.action_space.high} are "
                            f"not the scenario's {env.action_space.low}..{env.action_space.high} "
                            f"({', '.join(env.action_names)})")
    net = mlp_from_sb3(model, vecnorm)
    # the features the imported policy meets in the scenario: the Mahalanobis gate's statistics
    feats = []
    obs, _ = env.reset(seed=seed)
    for _ in range(int(rollout_steps)):
        feats.append(obs)
        obs, _, term, trunc, _ = env.step(net.act(obs))
        if term or trunc:
            obs, _ = env.reset()
    X = np.asarray(feats)
    store = PolicyStore(out)
    version = version or store.next_version()
    digest = hashlib.sha256(Path(model_path).read_bytes()).hexdigest()
    vdir = store.write_meta(version, {
        "plant": scenario.plant.model, "kind": "mlp", "file": "policy.npz", "stats": "stats.npz",
        "features": list(env.feature_names), "actions": list(env.action_names), "known_good": bool(known_good),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "notes": notes,
        "training": {"source": str(model_path), "sha256": digest, "algorithm": type(model).__name__,
                     "vecnormalize": str(vecnormalize_path) if vecnormalize_path else None,
                     "layers": [f"{W.shape[0]}x{W.shape[1]} {a}" for W, a in zip(net.W, net.acts)],
                     "squash": net.squash, "stats_rollout_steps": int(rollout_steps), "stats_seed": int(seed)}})
    net.save(vdir / "policy.npz")
    np.savez(vdir / "stats.npz", mean=X.mean(axis=0), cov=np.cov(X, rowvar=False).reshape(n_f, n_f))
    return vdir
