"""The input normalization and action mapping recorded beside an imported graph (ONNX) that
does not fold them in itself, applied around it by the loader:

    z = clip((x - obs_mean) / sqrt(obs_var + obs_eps), -obs_clip, obs_clip)   (if recorded;
                                    x: features in plant units, the version's `features` order)
    h = graph(z)
    a = h                                         action_map "none": the graph gives plant units
    a = clip(h, low, high)                        "clip": SB3's PPO / A2C Gaussian mean
    a = low + (clip(h, -1, 1) + 1) / 2 * (high - low)   "squash": a tanh-squashed output in
                                                  [-1, 1] (SAC, TD3), rescaled to the bounds

`low`, `high`: the inputs' physical bounds (plant units, the version's `actions` order), as
SB3's action space. Stored as `io.npz` (arrays only, no pickle).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ACTION_MAPS = ("none", "clip", "squash")


class IOMap:
    def __init__(self, low, high, action_map: str = "none", obs_mean=None, obs_var=None, obs_eps: float = 1e-8,
                 obs_clip: float = np.inf):
        if action_map not in ACTION_MAPS:
            raise ValueError(f"action_map: {action_map!r} is not one of {', '.join(ACTION_MAPS)}")
        self.low, self.high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
        self.action_map = action_map
        self.normalized = obs_mean is not None
        self.obs_mean = None if obs_mean is None else np.asarray(obs_mean, dtype=np.float64)
        self.obs_var = None if obs_var is None else np.asarray(obs_var, dtype=np.float64)
        self.obs_eps, self.obs_clip = float(obs_eps), float(obs_clip)
        self._std = None if obs_var is None else np.sqrt(self.obs_var + self.obs_eps)

    @property
    def identity(self) -> bool:
        return not self.normalized and self.action_map == "none"

    def obs(self, x: np.ndarray) -> np.ndarray:
        if not self.normalized:
            return x
        return np.clip((x - self.obs_mean) / self._std, -self.obs_clip, self.obs_clip)

    def action(self, h: np.ndarray) -> np.ndarray:
        if self.action_map == "clip":
            return np.clip(h, self.low, self.high)
        if self.action_map == "squash":
            return self.low + (np.clip(h, -1.0, 1.0) + 1.0) * 0.5 * (self.high - self.low)
        return h

    def save(self, path: str | Path) -> None:
        arrays = {"low": self.low, "high": self.high, "action_map": np.array(self.action_map)}
        if self.normalized:
            arrays.update(obs_mean=self.obs_mean, obs_var=self.obs_var, obs_eps=np.array(self.obs_eps),
                          obs_clip=np.array(self.obs_clip))
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "IOMap":
        with np.load(path, allow_pickle=False) as z:
            norm = "obs_mean" in z.files
            return cls(z["low"], z["high"], str(z["action_map"]), obs_mean=z["obs_mean"] if norm else None,
                       obs_var=z["obs_var"] if norm else None, obs_eps=float(z["obs_eps"]) if norm else 1e-8,
                       obs_clip=float(z["obs_clip"]) if norm else np.inf)

    @classmethod
    def from_vecnormalize(cls, vecnorm, low, high, action_map: str) -> "IOMap":
        """With the observation statistics of an SB3 VecNormalize (if it normalizes observations)."""
        if vecnorm is None or not getattr(vecnorm, "norm_obs", False):
            return cls(low, high, action_map)
        rms = vecnorm.obs_rms
        return cls(low, high, action_map, obs_mean=rms.mean, obs_var=rms.var, obs_eps=vecnorm.epsilon,
                   obs_clip=vecnorm.clip_obs)
