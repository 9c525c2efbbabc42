"""A small ensemble of MLPs in numpy: the demo policy, and its fitting.

Each member m maps standardized features z = (x - x_mean) / x_std to a standardized output,
through one tanh hidden layer beside a linear path (so linear laws, such as a PID's, are
represented exactly and the hidden layer models what is not linear: saturation, kinetics):

    h_m = tanh(z @ W1[m] + b1[m])
    o_m = z @ W0[m] + h_m @ W2[m] + b2[m]
    a_m = base(x) + y_mean + y_std * o_m           (plant units)

`base(x)` is the feature holding the previously applied value of each action (`u.<input>`)
when the ensemble is residual (`residual_index >= 0`), else 0: a residual member predicts the
change of the action, as the velocity form of a PID does. The action is the members' mean;
their spread is the confidence signal the safety wrapper reads. Members differ by their
initial weights and their bootstrap resample of the data, so they agree where data is dense
and drift apart outside it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _members_kernel(x, x_mean, x_std, W1cat, b1cat, W2, W0cat, b2, y_mean, y_std, res_pos, res_src, z, out):
    """out[m, k] = member m's action k for one feature vector x (plant units); z: (f,) scratch.

    The one-observation path of act_members in one compiled call (no temporaries): the bus's
    policy process answers with it. Same arithmetic as predict_batch."""
    M, h, a = W2.shape
    f = x.size
    for i in range(f):
        z[i] = (x[i] - x_mean[i]) / x_std[i]
    for m in range(M):
        for k in range(a):
            s = b2[m, k]
            col = m * a + k
            for i in range(f):
                s += z[i] * W0cat[i, col]
            out[m, k] = s
        for j in range(h):
            col = m * h + j
            s = b1cat[col]
            for i in range(f):
                s += z[i] * W1cat[i, col]
            t = np.tanh(s)
            for k in range(a):
                out[m, k] += t * W2[m, j, k]
        for k in range(a):
            out[m, k] = y_mean[k] + y_std[k] * out[m, k]
        for r in range(res_pos.size):
            out[m, res_pos[r]] += x[res_src[r]]


class MLPEnsemble:
    """act(x) -> mean action; act_members(x) -> (M, n_actions). x: features (plant units)."""

    def __init__(self, *, x_mean, x_std, y_mean, y_std, W0, W1, b1, W2, b2, residual_index):
        self.x_mean = np.asarray(x_mean, dtype=np.float64)
        self.x_std = np.asarray(x_std, dtype=np.float64)
        self.y_mean = np.asarray(y_mean, dtype=np.float64)
        self.y_std = np.asarray(y_std, dtype=np.float64)
        self.W0 = np.asarray(W0, dtype=np.float64)  # (M, f, a) linear path
        self.W1 = np.asarray(W1, dtype=np.float64)  # (M, f, h)
        self.b1 = np.asarray(b1, dtype=np.float64)  # (M, h)
        self.W2 = np.asarray(W2, dtype=np.float64)  # (M, h, a)
        self.b2 = np.asarray(b2, dtype=np.float64)  # (M, a)
        self.residual_index = np.asarray(residual_index, dtype=np.int64)  # (a,), -1 = none
        M, f, h = self.W1.shape
        a = self.W2.shape[2]
        if self.b1.shape != (M, h) or self.W2.shape[:2] != (M, h) or self.b2.shape != (M, a) \
                or self.W0.shape != (M, f, a):
            raise ValueError("ensemble weight shapes do not agree")
        if self.x_mean.shape != (f,) or self.x_std.shape != (f,) or self.y_mean.shape != (a,):
            raise ValueError("ensemble scaling shapes do not agree")
        if self.residual_index.shape != (a,) or (self.residual_index >= f).any():
            raise ValueError("ensemble residual index out of range")
        self.n_members, self.n_features, self.n_hidden, self.n_actions = M, f, h, a
        self._res = self.residual_index >= 0
        self._res_idx = np.where(self._res, self.residual_index, 0)
        # one-observation fast path: members side by side in plain matrices
        self._W1cat = np.ascontiguousarray(self.W1.transpose(1, 0, 2).reshape(f, M * h))
        self._W0cat = np.ascontiguousarray(self.W0.transpose(1, 0, 2).reshape(f, M * a))
        self._b1cat = self.b1.reshape(M * h)
        self._res_pos = np.flatnonzero(self._res).astype(np.int64)
        self._res_src = self.residual_index[self._res_pos].astype(np.int64)
        self._W2c = np.ascontiguousarray(self.W2)
        self._b2c = np.ascontiguousarray(self.b2)
        self._z = np.empty(f)

    # ---- inference ----
    def act_members(self, x: np.ndarray) -> np.ndarray:
        """Each member's action for one feature vector x (f,): (M, a), plant units (a new array)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 1 or x.size != self.n_features:
            raise ValueError(f"expected {self.n_features} features, got shape {x.shape}")
        out = np.empty((self.n_members, self.n_actions))
        _members_kernel(x, self.x_mean, self.x_std, self._W1cat, self._b1cat, self._W2c, self._W0cat, self._b2c,
                        self.y_mean, self.y_std, self._res_pos, self._res_src, self._z, out)
        return out

    def act_members_numpy(self, x: np.ndarray) -> np.ndarray:
        """act_members in numpy (the reference the compiled path is tested against)."""
        z = (x - self.x_mean) / self.x_std
        h = np.tanh(z @ self._W1cat + self._b1cat).reshape(self.n_members, 1, self.n_hidden)
        o = (h @ self.W2).reshape(self.n_members, self.n_actions)
        o += (z @ self._W0cat).reshape(self.n_members, self.n_actions) + self.b2
        out = self.y_mean + self.y_std * o
        out[:, self._res_pos] += x[self._res_src]
        return out

    def act(self, x: np.ndarray) -> np.ndarray:
        return self.act_members(x).mean(axis=0)

    __call__ = act

    def predict_batch(self, X: np.ndarray) -> np.ndarray:
        """Members' actions for many feature vectors X (N, f): (M, N, a)."""
        Z = (X - self.x_mean) / self.x_std
        H = np.tanh(np.einsum("nf,mfh->mnh", Z, self.W1) + self.b1[:, None, :])
        O = np.einsum("mnh,mha->mna", H, self.W2) + np.einsum("nf,mfa->mna", Z, self.W0) + self.b2[:, None, :]
        base = np.where(self._res, X[:, self._res_idx], 0.0)
        return self.y_mean + self.y_std * O + base[None]

    # ---- storage ----
    def save(self, path: str | Path) -> None:
        np.savez(
            path, x_mean=self.x_mean, x_std=self.x_std, y_mean=self.y_mean, y_std=self.y_std,
            W0=self.W0, W1=self.W1, b1=self.b1, W2=self.W2, b2=self.b2, residual_index=self.residual_index,
        )

    @classmethod
    def load(cls, path: str | Path) -> "MLPEnsemble":
        with np.load(path) as z:
            return cls(**{k: z[k] for k in ("x_mean", "x_std", "y_mean", "y_std", "W0", "W1", "b1", "W2", "b2",
                                             "residual_index")})

    # ---- fitting ----
    @classmethod
    def fit(cls, X: np.ndarray, A: np.ndarray, *, residual_index=None, members: int = 5, hidden: int = 32,
            steps: int = 3000, batch: int = 256, lr: float = 3e-3, weight_decay: float = 1e-5,
            seed: int = 0) -> tuple["MLPEnsemble", dict]:
        """Fit by regression of actions A (N, a) on features X (N, f); all members at once.

        Each member on its own bootstrap resample: the linear path starts at the ridge least
        squares fit, then Adam on the mean squared error (standardized units) trains all
        weights from a random hidden layer. Returns the ensemble and a report (final losses).
        """
        X = np.asarray(X, dtype=np.float64)
        A = np.asarray(A, dtype=np.float64)
        N, f = X.shape
        a = A.shape[1]
        res = np.full(a, -1, dtype=np.int64) if residual_index is None else np.asarray(residual_index, np.int64)
        base = np.where(res >= 0, X[:, np.where(res >= 0, res, 0)], 0.0)
        T = A - base
        x_mean, x_std = X.mean(0), X.std(0)
        x_std = np.where(x_std > 1e-12, x_std, 1.0)
        y_mean, y_std = T.mean(0), T.std(0)
        y_std = np.where(y_std > 1e-12, y_std, 1.0)
        Z = (X - x_mean) / x_std
        Tn = (T - y_mean) / y_std
        rng = np.random.default_rng(seed)
        M = members
        boot = rng.integers(0, N, size=(M, N))  # each member's bootstrap resample
        W0 = np.empty((M, f, a))
        for m in range(M):
            Zm, Tm = Z[boot[m]], Tn[boot[m]]
            W0[m] = np.linalg.solve(Zm.T @ Zm + 1e-6 * N * np.eye(f), Zm.T @ Tm)
        W1 = rng.normal(0, 1 / np.sqrt(f), (M, f, hidden))
        b1 = rng.normal(0, 0.1, (M, hidden))
        W2 = rng.normal(0, 1 / np.sqrt(hidden), (M, hidden, a)) * 0.1
        b2 = np.zeros((M, a))
        params = [W0, W1, b1, W2, b2]
        m1 = [np.zeros_like(p) for p in params]
        m2 = [np.zeros_like(p) for p in params]
        b1c, b2c, eps = 0.9, 0.999, 1e-8
        batch = min(batch, N)
        for it in range(1, steps + 1):
            pick = boot[np.arange(M)[:, None], rng.integers(0, N, size=(M, batch))]  # (M, B)
            zb = Z[pick]  # (M, B, f)
            tb = Tn[pick]  # (M, B, a)
            pre = np.einsum("mbf,mfh->mbh", zb, W1) + b1[:, None, :]
            h = np.tanh(pre)
            o = np.einsum("mbh,mha->mba", h, W2) + np.einsum("mbf,mfa->mba", zb, W0) + b2[:, None, :]
            err = (o - tb) * (2.0 / (batch * a))
            gW0 = np.einsum("mbf,mba->mfa", zb, err)
            gW2 = np.einsum("mbh,mba->mha", h, err) + weight_decay * W2
            gb2 = err.sum(1)
            dh = np.einsum("mba,mha->mbh", err, W2) * (1 - h * h)
            gW1 = np.einsum("mbf,mbh->mfh", zb, dh) + weight_decay * W1
            gb1 = dh.sum(1)
            step_lr = lr * (0.1 ** (it / steps))  # exponential decay to lr/10
            for p, g, s1, s2 in zip(params, (gW0, gW1, gb1, gW2, gb2), m1, m2):
                s1 *= b1c
                s1 += (1 - b1c) * g
                s2 *= b2c
                s2 += (1 - b2c) * g * g
                p -= step_lr * (s1 / (1 - b1c**it)) / (np.sqrt(s2 / (1 - b2c**it)) + eps)
        ens = cls(x_mean=x_mean, x_std=x_std, y_mean=y_mean, y_std=y_std, W0=W0, W1=W1, b1=b1, W2=W2, b2=b2,
                  residual_index=res)
        pred = ens.predict_batch(X)
        mse = ((pred - A[None]) ** 2).mean(axis=(1, 2)) / (A.std(0) ** 2 + 1e-30).mean()
        report = {"members": M, "hidden": hidden, "steps": steps, "samples": N,
                  "normalized_mse_per_member": [float(v) for v in mse]}
        return ens, report
