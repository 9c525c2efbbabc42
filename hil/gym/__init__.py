"""Gymnasium environments over a hil scenario: train on the plant, gaps, randomization and
safety wrapper that the HIL run uses (needs the `gym` extra: pip install 'hil[gym]').

    import hil.gym
    env = hil.gym.make("configs/bioreactor_gym.toml", episode_s=1800.0)       # gymnasium.Env
    env = hil.gym.make("configs/bioreactor_gym.toml", safety=True)            # + safety wrapper
    venv = hil.gym.make_vec("configs/bioreactor_gym.toml", num_envs=1024)     # one prange call

Overrides: a [gym] key (episode_s, reward, observation, limits, terminal_reward,
state_bounds, bad_observation, bad_substitute) by name, or a scenario section as a dict
(loop={"seed": 3}, gaps={"enabled": False}), merged into the file before validation
(ConfigError naming the key if invalid or unknown). `safety=` is the wrapper flag (a bool);
the [safety] section itself goes in `overrides={"safety": {...}}`.

Importing this package does not import gymnasium; `make` and `make_vec` do.
"""

from __future__ import annotations

SECTION_KEYS = ("episode_s", "reward", "observation", "limits", "terminal_reward", "state_bounds", "bad_observation",
                "bad_substitute")


def load(path, overrides: dict | None = None):
    """The scenario at `path` with `overrides` (see the module docstring) merged in. An override
    that is neither a [gym] key nor a scenario section is a ConfigError naming it."""
    from hil.scenario.config import SCENARIO_SECTIONS, load_scenario
    from hil.errors import ConfigError

    nested: dict = {}
    for key, value in (overrides or {}).items():
        if key in SECTION_KEYS:
            nested.setdefault("gym", {})[key] = value
        elif key in SCENARIO_SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(key, f"a scenario section override is a dict of its keys, not "
                                       f"{type(value).__name__} {value!r}")
            nested[key] = value
        else:
            raise ConfigError(key, f"not a [gym] key ({', '.join(SECTION_KEYS)}) nor a scenario section "
                                   f"({', '.join(SCENARIO_SECTIONS)})")
    return load_scenario(path, nested)


def _wrap_flag(safety) -> bool:
    if not isinstance(safety, bool):
        raise TypeError(f"safety= is True or False (wrap the env in hil.gym.SafetyWrapper), not "
                        f"{type(safety).__name__}; to change the scenario's [safety] section pass "
                        f"overrides={{'safety': {{...}}}}")
    return safety


def make(path, *, safety: bool = False, overrides: dict | None = None, **kwargs):
    """A gymnasium.Env (hil.gym.env.HilEnv) over the scenario at `path`; safety=True wraps it
    in hil.gym.SafetyWrapper (the scenario's [safety] projection and fallback). Scenario
    overrides come as keyword arguments (a [gym] key, or a section other than `safety` as a
    dict) or in `overrides` (any section, [safety] included)."""
    from hil.gym.env import HilEnv

    wrap = _wrap_flag(safety)
    env = HilEnv(load(path, {**kwargs, **(overrides or {})}), scenario_path=str(path))
    if wrap:
        from hil.gym.safety import SafetyWrapper

        env = SafetyWrapper(env)
    return env


def make_vec(path, num_envs: int, *, parallel: bool | None = None, fused: bool | None = None,
             overrides: dict | None = None, **kwargs):
    """A gymnasium.vector.VectorEnv (hil.gym.vector.HilVectorEnv) of `num_envs` instances;
    parallel: spread them over the cores (default: from 16 instances on); fused: the whole
    step in one compiled call (default where the plant allows; False: the numpy reference
    path). Overrides as make()."""
    from hil.gym.vector import HilVectorEnv

    return HilVectorEnv(load(path, {**kwargs, **(overrides or {})}), num_envs, scenario_path=str(path),
                        parallel=parallel, fused=fused)


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
