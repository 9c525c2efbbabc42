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
  the scenario's gym env (the Mahalanobis gate's training statistics);
- `heads.npz` (`heads` >= 2, default 5): bootstrapped heads fitted on that rollout, the
  disagreement signal of a single network (hil/policy/heads.py, hil/policy/imported.py).

A residual model (trained with hil.gym.residual: its actions are corrections in [-1, 1] to a PID
block's command) is imported with `residual={"scale": ..., "track": ..., "open_loops": [...]}`:
the network is stored as is (its output the correction) and `meta.json` records the residual
(hil/policy/residual.py), which the loader wraps around it.

Checked before anything is written: the model's observation and action sizes against the env's,
its action bounds against the scenario's inputs, every layer a supported one. A network type
this cannot express (CNN, recurrent, dict observations) is refused with its name.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from hil.policy.imported import ImportRefused, check_sizes, scenario_env, write_version
from hil.policy.mlp import MLPPolicy

__all__ = ["ImportRefused", "import_sb3", "load_sb3", "mlp_from_sb3"]

ALGOS = ("PPO", "A2C", "SAC", "TD3", "DDPG")
_ACT = {"Tanh": "tanh", "ReLU": "relu", "ELU": "elu", "Sigmoid": "sigmoid", "Identity": "identity"}


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
               heads: int = 5, known_good: bool = False, notes: str = "", residual: dict | None = None) -> Path:
    """Import the SB3 model at `model_path` for `scenario` (a validated Scenario with [gym])
    into the policy directory `out`; returns the version directory. Raises ImportRefused.
    `residual`: {"scale", "track", "open_loops"} of a residual model (module docstring)."""
    model = load_sb3(model_path, algo)
    vecnorm = None
    if vecnormalize_path is not None:
        with open(vecnormalize_path, "rb") as f:
            vecnorm = pickle.load(f)
        if not hasattr(vecnorm, "obs_rms"):
            raise ImportRefused(f"{vecnormalize_path} is not a saved VecNormalize")
    env = scenario_env(scenario)
    check_sizes(env, model.observation_space.shape[0] if len(model.observation_space.shape) == 1 else -1,
                model.action_space.shape[0] if len(model.action_space.shape) == 1 else -1)
    if residual is not None:
        if not (np.allclose(model.action_space.low, -1.0) and np.allclose(model.action_space.high, 1.0)):
            raise ImportRefused(f"a residual model acts in [-1, 1] (a correction), this one in "
                                f"{model.action_space.low}..{model.action_space.high}")
    elif not (np.allclose(model.action_space.low, env.action_space.low)
              and np.allclose(model.action_space.high, env.action_space.high)):
        hint = (" (a residual model: give its scale, hil policy import --residual-scale)"
                if np.allclose(model.action_space.low, -1.0) and np.allclose(model.action_space.high, 1.0) else "")
        raise ImportRefused(f"the model's action bounds {model.action_space.low}..{model.action_space.high} are "
                            f"not the scenario's {env.action_space.low}..{env.action_space.high} "
                            f"({', '.join(env.action_names)}){hint}")
    net = mlp_from_sb3(model, vecnorm)
    act, reset, extra = net.act, None, None
    if residual is not None:
        from hil.gym.residual import open_loops
        from hil.policy.residual import ResidualPolicy, check_measurements_are_features, residual_meta

        if scenario.safety is None:
            raise ImportRefused(f"scenario {scenario.name!r} has no [safety.fallback]: no PID block to ride on")
        try:
            section = open_loops(scenario.safety.fallback, residual.get("open_loops") or ())
            check_measurements_are_features(section, list(env.feature_names), env.model.spec)
            rmeta = residual_meta(scenario, env, residual["scale"], bool(residual.get("track", False)), section)
        except ValueError as exc:
            raise ImportRefused(f"residual: {exc}") from None
        res = ResidualPolicy(net.act, rmeta, env.model.spec, list(env.feature_names), list(env.action_names))
        act, reset, extra = res.act, res.reset, {"residual": rmeta}

    def files(vdir: Path) -> dict:
        net.save(vdir / "policy.npz")
        return {"file": "policy.npz"}

    training = {"algorithm": type(model).__name__,
                "vecnormalize": str(vecnormalize_path) if vecnormalize_path else None,
                "layers": [f"{W.shape[0]}x{W.shape[1]} {a}" for W, a in zip(net.W, net.acts)], "squash": net.squash}
    return write_version(scenario, env, out, kind="mlp", files=files, act=act, source=model_path,
                         training=training, rollout_steps=rollout_steps, seed=seed, heads=heads, version=version,
                         known_good=known_good, notes=notes, reset=reset, extra_meta=extra)
