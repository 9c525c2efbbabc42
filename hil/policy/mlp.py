"""A feed-forward network in numpy: the stored form of an imported policy (kind "mlp").

What a trained actor computes, with the trainer's input normalization and action mapping
folded in, for one feature vector x (plant units, the version's `features` order):

    z = clip((x - obs_mean) / sqrt(obs_var + obs_eps), -obs_clip, obs_clip)   (if normalized)
    h = act_i(h @ W_i + b_i)  for each layer i (h starts at z; act: identity, tanh, relu, elu,
                              leaky_relu, sigmoid; the last layer is usually identity)
    a = low + (tanh(h) + 1) / 2 * (high - low)     if squash (SAC, TD3: actions in [-1, 1])
    a = clip(h, low, high)                         otherwise (PPO / A2C Gaussian mean, as
                                                   SB3's predict clips it)

`policy.npz` holds W0, b0, W1, b1, ... (W_i of shape (n_in, n_out)), `acts` (names),
`obs_mean`, `obs_var`, `obs_eps`, `obs_clip` (absent: no normalization), `low`, `high`,
`squash` (0/1). float64 throughout: the same arithmetic as the trainer's float32 network to
within float32 rounding (about 1e-6 relative).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ACTIVATIONS = {
    "identity": lambda h: h,
    "tanh": np.tanh,
    "relu": lambda h: np.maximum(h, 0.0),
    "elu": lambda h: np.where(h > 0, h, np.expm1(np.minimum(h, 0.0))),
    "leaky_relu": lambda h: np.where(h > 0, h, 0.01 * h),
    "sigmoid": lambda h: 1.0 / (1.0 + np.exp(-h)),
}


class MLPPolicy:
    """The network of the module docstring."""

    def __init__(self, weights: list[np.ndarray], biases: list[np.ndarray], acts: list[str], *,
                 low: np.ndarray, high: np.ndarray, squash: bool, obs_mean=None, obs_var=None,
                 obs_eps: float = 1e-8, obs_clip: float = np.inf):
        if not (len(weights) == len(biases) == len(acts)) or not weights:
            raise ValueError("an mlp needs as many weight matrices, bias vectors and activations (>= 1)")
        for i, (W, b, a) in enumerate(zip(weights, biases, acts)):
            if W.ndim != 2 or b.shape != (W.shape[1],):
                raise ValueError(f"layer {i}: W {W.shape} and b {b.shape} do not fit")
            if i and W.shape[0] != weights[i - 1].shape[1]:
                raise ValueError(f"layer {i}: {W.shape[0]} inputs after a layer of {weights[i - 1].shape[1]}")
            if a not in ACTIVATIONS:
                raise ValueError(f"layer {i}: unknown activation {a!r} (known: {', '.join(ACTIVATIONS)})")
        self.W = [np.asarray(W, dtype=np.float64) for W in weights]
        self.b = [np.asarray(b, dtype=np.float64) for b in biases]
        self.acts = list(acts)
        self.low, self.high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
        if self.low.shape != (self.W[-1].shape[1],) or self.high.shape != self.low.shape:
            raise ValueError(f"low/high must have one value per action ({self.W[-1].shape[1]})")
        self.squash = bool(squash)
        self.normalized = obs_mean is not None
        n_in = self.W[0].shape[0]
        self.obs_mean = np.zeros(n_in) if obs_mean is None else np.asarray(obs_mean, dtype=np.float64)
        self.obs_std = np.ones(n_in) if obs_var is None else np.sqrt(np.asarray(obs_var, dtype=np.float64) + obs_eps)
        self.obs_eps, self.obs_clip = float(obs_eps), float(obs_clip)

    @property
    def n_features(self) -> int:
        return self.W[0].shape[0]

    @property
    def n_actions(self) -> int:
        return self.W[-1].shape[1]

    def act(self, x: np.ndarray) -> np.ndarray:
        """The action (plant units) for features x (plant units), or a batch (N, n_features)."""
        h = np.asarray(x, dtype=np.float64)
        if self.normalized:
            h = np.clip((h - self.obs_mean) / self.obs_std, -self.obs_clip, self.obs_clip)
        for W, b, a in zip(self.W, self.b, self.acts):
            h = ACTIVATIONS[a](h @ W + b)
        if self.squash:
            return self.low + (np.tanh(h) + 1.0) * 0.5 * (self.high - self.low)
        return np.clip(h, self.low, self.high)

    def save(self, path: str | Path) -> None:
        arrays = {f"W{i}": W for i, W in enumerate(self.W)} | {f"b{i}": b for i, b in enumerate(self.b)}
        arrays.update(acts=np.array(self.acts), low=self.low, high=self.high, squash=np.array(int(self.squash)))
        if self.normalized:
            arrays.update(obs_mean=self.obs_mean, obs_var=self.obs_std ** 2 - self.obs_eps,
                          obs_eps=np.array(self.obs_eps), obs_clip=np.array(self.obs_clip))
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "MLPPolicy":
        with np.load(path, allow_pickle=False) as z:
            n = sum(1 for k in z.files if k.startswith("W"))
            norm = "obs_mean" in z.files
            return cls([z[f"W{i}"] for i in range(n)], [z[f"b{i}"] for i in range(n)], [str(a) for a in z["acts"]],
                       low=z["low"], high=z["high"], squash=bool(int(z["squash"])),
                       obs_mean=z["obs_mean"] if norm else None, obs_var=z["obs_var"] if norm else None,
                       obs_eps=float(z["obs_eps"]) if norm else 1e-8,
                       obs_clip=float(z["obs_clip"]) if norm else np.inf)
