"""Gymnasium environments over a hil scenario: train on the plant, gaps, randomization and
safety wrapper that the HIL run uses (needs the `gym` extra: pip install 'hil[gym]').

    import hil.gym
    env = hil.gym.make("configs/bioreactor_gym.toml", episode_s=1800.0)       # gymnasium.Env
    env = hil.gym.make("configs/bioreactor_gym.toml", safety=True)            # + safety wrapper
    venv = hil.gym.make_vec("configs/bioreactor_gym.toml", num_envs=1024)     # one prange call

Overrides: a [gym] key (episode_s, reward, observation, limits, terminal_reward,
state_bounds) by name, or a whole scenario section as a dict (loop={"seed": 3},
gaps={"enabled": False}), merged into the file before validation (ConfigError if invalid).

Importing this package does not import gymnasium; `make` and `make_vec` do.
"""

from __future__ import annotations

SECTION_KEYS = ("episode_s", "reward", "observation", "limits", "terminal_reward", "state_bounds")


def load(path, overrides: dict | None = None):
    """The scenario at `path` with `overrides` (see the module docstring) merged in."""
    from hil.config import load_scenario

    nested: dict = {}
    for key, value in (overrides or {}).items():
        if key in SECTION_KEYS:
            nested.setdefault("gym", {})[key] = value
        else:
            nested[key] = value
    return load_scenario(path, nested)


def make(path, *, safety: bool = False, **overrides):
    """A gymnasium.Env (hil.gym.env.HilEnv) over the scenario at `path`; safety=True wraps it
    in hil.gym.safety.SafetyWrapper (the scenario's [safety] projection and fallback)."""
    from hil.gym.env import HilEnv

    env = HilEnv(load(path, overrides), scenario_path=str(path))
    if safety:
        from hil.gym.safety import SafetyWrapper

        env = SafetyWrapper(env)
    return env


def make_vec(path, num_envs: int, *, parallel: bool | None = None, **overrides):
    """A gymnasium.vector.VectorEnv (hil.gym.vector.HilVectorEnv) of `num_envs` instances;
    parallel: spread them over the cores (default: from 16 instances on)."""
    from hil.gym.vector import HilVectorEnv

    return HilVectorEnv(load(path, overrides), num_envs, scenario_path=str(path), parallel=parallel)


ENV_ID = "hil/Scenario-v0"


def _entry(path, **kwargs):
    return make(path, **kwargs)


def register() -> str:
    """Register hil's env with gymnasium's registry, so that tools that build envs by id work:
    gymnasium.make("hil/Scenario-v0", path="configs/bioreactor_gym.toml", episode_s=600.0).
    Returns the id. (The episode length is [gym].episode_s: no TimeLimit wrapper is added.)"""
    import gymnasium

    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point="hil.gym:_entry", disable_env_checker=False)
    return ENV_ID


__all__ = ["make", "make_vec", "load", "register", "ENV_ID"]
