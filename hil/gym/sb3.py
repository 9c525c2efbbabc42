"""Stable-Baselines3 `VecEnv` over hil's vector env (needs the `rl` extra: stable-baselines3 and
torch).

    from hil.gym.sb3 import make_sb3_vec
    venv = make_sb3_vec("configs/bioreactor_gym.toml", 16, episode_s=1800.0)
    model = stable_baselines3.PPO("MlpPolicy", venv).learn(200_000)

SB3's contract differs from gymnasium's vector API in three ways that this adapter bridges:
- reset: `reset()` returns only the observations; seeds go through `seed(s)` first (instance i
  gets s + i, as `HilVectorEnv.reset(seed=s)`).
- autoreset: SB3 resets a finished instance inside the same `step` and returns the NEW
  episode's first observation, with the last one in `infos[i]["terminal_observation"]`;
  hil's vector env resets on the next step (gymnasium's NEXT_STEP mode). The adapter resets
  the finished rows right away with `reset(options={"reset_mask": done})`, so no step is
  spent on a reset and every instance's trajectory stays bit for bit the single env's.
- infos: a list of one dict per instance; `TimeLimit.truncated` is True when an episode ended
  by [gym].episode_s rather than by a safety stop (SB3's bootstrapping of the value there).
  Each info carries `seed`, `episode_index`, `t_s`, `clipped` and `bad_outputs` of its instance.

Rewards are float32 and dones bool arrays, as SB3 expects. Observations stay float64 (SB3
casts in its buffers). `env_method`, `get_attr` and `set_attr` reach the one HilVectorEnv
(every instance shares it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv

from hil.gym.vector import HilVectorEnv


class HilSB3VecEnv(VecEnv):
    """SB3 VecEnv over a `HilVectorEnv` (see the module docstring)."""

    def __init__(self, venv: HilVectorEnv):
        self.venv = venv
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        self._actions: np.ndarray | None = None
        self._seed: int | None = None

    # ---- SB3 API ----
    def reset(self) -> np.ndarray:
        obs, _ = self.venv.reset(seed=self._seed)
        self._seed = None
        return obs

    def seed(self, seed: int | None = None):
        self._seed = None if seed is None else int(seed)
        return [None if seed is None else int(seed) + i for i in range(self.num_envs)]

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions, dtype=np.float64).reshape(self.num_envs, -1)

    def step_wait(self):
        if self._actions is None:
            raise RuntimeError("step_wait() without step_async()")
        obs, reward, terminated, truncated, info = self.venv.step(self._actions)
        self._actions = None
        dones = terminated | truncated
        infos: list[dict[str, Any]] = [
            {"seed": int(info["seed"][i]), "episode_index": int(info["episode_index"][i]), "t_s": float(info["t_s"][i]),
             "clipped": int(info["clipped"][i]), "bad_outputs": info["bad_outputs"][i].copy(),
             "TimeLimit.truncated": bool(truncated[i] and not terminated[i])}
            for i in range(self.num_envs)]
        if dones.any():
            rows = np.flatnonzero(dones)
            for i in rows:
                infos[i]["terminal_observation"] = obs[i].copy()
            new_obs, _ = self.venv.reset(options={"reset_mask": dones})
            obs[rows] = new_obs[rows]
        return obs, reward.astype(np.float32), dones, infos

    def close(self) -> None:
        self.venv.close()

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        return [getattr(self.venv, attr_name) for _ in self._indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        setattr(self.venv, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        out = getattr(self.venv, method_name)(*method_args, **method_kwargs)
        return [out for _ in self._indices(indices)]

    def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
        return [False for _ in self._indices(indices)]

    def _indices(self, indices) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        if isinstance(indices, int):
            return [indices]
        return list(indices)


def make_sb3_vec(path, num_envs: int, *, parallel: bool | None = None, overrides: dict | None = None,
                 **kwargs) -> HilSB3VecEnv:
    """`hil.gym.make_vec(...)` as an SB3 VecEnv (same arguments)."""
    from hil.gym import make_vec

    return HilSB3VecEnv(make_vec(path, num_envs, parallel=parallel, overrides=overrides, **kwargs))
