"""The fallback controller and the confidence gate that hands control to it.

FallbackController: the baseline, hand-written controller operations trust: PID loops
(hil.control.pid.PID, the SoftPLC's block) and fixed values, one per action input. It runs on
every observation, whoever acts, and tracks the applied action (its integral is reset so its
next output continues from what was applied: bumpless transfer back to it at any time).

ConfidenceGate: scores each observation by
- the Mahalanobis distance of the policy's features from its training data (mean, covariance
  stored with the policy version), and
- the ensemble's disagreement: max over actions of std(members) / scale (default scale: the
  input's span),
and holds the fallback with hysteresis: it enters as soon as a score exceeds its `*_enter`
threshold; it leaves only after `min_dwell_s` (simulated) in fallback AND `min_dwell_s` with
every score below its `*_exit` threshold.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from hil.control.pid import pid_from_config
from hil.safety.config import signal_index, signal_span


class FallbackController:
    def __init__(self, section, spec, action_names: list[str]):
        self.names = list(action_names)
        self.action = np.zeros(len(self.names))
        self.loops = []  # (position, PID, setpoint, kind, index, span)
        for loop in section.loops:
            pid = pid_from_config(loop, spec.quantity("inputs", loop.input))
            kind, idx = signal_index(spec, loop.measurement)
            self.loops.append((self.names.index(loop.input), pid, loop.setpoint, kind, idx,
                               signal_span(spec, loop.measurement)))
            self.action[self.names.index(loop.input)] = pid._clip(loop.bias)
        self.fixed = [(self.names.index(n), v) for n, v in section.fixed.items()]
        for pos, v in self.fixed:
            self.action[pos] = v

    @staticmethod
    def _meas(kind: str, idx: int, y: np.ndarray, u: np.ndarray) -> float:
        return float(u[idx] if kind == "u" else y[idx])

    def update(self, y: np.ndarray, u: np.ndarray, dt_s: float) -> np.ndarray:
        """Baseline action for this observation (plant units); dt_s: sim s since the last one."""
        for pos, pid, sp, kind, idx, _ in self.loops:
            self.action[pos] = pid.update(sp, self._meas(kind, idx, y, u), dt_s)
        for pos, v in self.fixed:
            self.action[pos] = v
        return self.action.copy()

    def track(self, applied: np.ndarray, y: np.ndarray, u: np.ndarray) -> None:
        """Bumpless transfer: make each PID's output at the current error equal what was applied."""
        for pos, pid, sp, kind, idx, _ in self.loops:
            if abs(applied[pos] - self.action[pos]) > 1e-12 * (1.0 + abs(applied[pos])):
                e = sp - self._meas(kind, idx, y, u)
                if pid.reverse:
                    e = -e
                if math.isfinite(e):
                    pid.integral = min(max(applied[pos] - pid.bias - pid.kp * e, pid.out_min - pid.bias),
                                       pid.out_max - pid.bias)
                self.action[pos] = applied[pos]

    def tracking_sq(self, y: np.ndarray, u: np.ndarray) -> float:
        """Mean over loops of ((measurement - setpoint) / span)^2; 0 without loops."""
        if not self.loops:
            return 0.0
        s = 0.0
        for _, _, sp, kind, idx, span in self.loops:
            s += ((self._meas(kind, idx, y, u) - sp) / span) ** 2
        return s / len(self.loops)


@njit(cache=True, nogil=True)
def _max_scaled_std(members, inv_scale2):
    """max over columns k of sqrt(population variance of members[:, k] * inv_scale2[k])."""
    m, a = members.shape
    best = 0.0
    for k in range(a):
        mean = 0.0
        for i in range(m):
            mean += members[i, k]
        mean /= m
        ss = 0.0
        for i in range(m):
            d = members[i, k] - mean
            ss += d * d
        v = ss / m * inv_scale2[k]
        if v > best or v != v:  # NaN propagates, as in numpy's max
            best = v
    return np.sqrt(best)


class ConfidenceGate:
    def __init__(self, section, spec, action_names: list[str]):
        self.sec = section
        self.scale = np.array([section.scale.get(n, signal_span(spec, "u." + n)) for n in action_names])
        self._inv_scale2 = 1.0 / (self.scale * self.scale)
        self.mean: np.ndarray | None = None
        self.precision: np.ndarray | None = None
        self.active = False
        self.reason = ""
        self._since = -math.inf  # sim time the fallback was entered
        self._calm_since: float | None = None  # sim time every score went below its exit threshold
        self.last_mahalanobis = math.nan
        self.last_disagreement = math.nan

    def set_stats(self, stats: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Training statistics (mean, covariance) of the current policy's features, or None."""
        if stats is None:
            self.mean = self.precision = None
            return
        mean, cov = stats
        cov = np.atleast_2d(np.asarray(cov, dtype=np.float64))
        ridge = 1e-9 * max(float(np.trace(cov)) / max(cov.shape[0], 1), 1e-300)
        self.mean = np.asarray(mean, dtype=np.float64)
        self.precision = np.linalg.inv(cov + ridge * np.eye(cov.shape[0]))

    def mahalanobis(self, x: np.ndarray | None) -> float:
        if self.precision is None or x is None:
            return math.nan
        d = x - self.mean
        return math.sqrt(max(float(d @ self.precision @ d), 0.0))

    def disagreement(self, members: np.ndarray | None) -> float:
        if members is None or members.shape[0] < 2:
            return math.nan
        members = np.asarray(members, dtype=np.float64)
        if members.ndim != 2 or members.shape[1] != self._inv_scale2.size:
            raise ValueError(f"members of shape {members.shape}, expected (M, {self._inv_scale2.size})")
        return float(_max_scaled_std(members, self._inv_scale2))

    def update(self, t_s: float, mahalanobis: float, disagreement: float) -> tuple[bool, str | None]:
        """Advance to sim time t_s with this observation's scores. Returns (active, transition)
        where transition is None, or a reason string when the gate just entered or left."""
        self.last_mahalanobis, self.last_disagreement = mahalanobis, disagreement
        s = self.sec
        trips = []
        if mahalanobis > s.mahalanobis_enter:
            trips.append(f"mahalanobis {mahalanobis:.3g} > {s.mahalanobis_enter:g}")
        if disagreement > s.disagreement_enter:
            trips.append(f"disagreement {disagreement:.3g} > {s.disagreement_enter:g}")
        calm = not (mahalanobis > s.mahalanobis_exit) and not (disagreement > s.disagreement_exit)
        if not self.active:
            if trips:
                self.active, self._since, self._calm_since = True, t_s, None
                self.reason = "; ".join(trips)
                return True, "enter fallback: " + self.reason
            return False, None
        if trips:
            self.reason = "; ".join(trips)
        if not calm:
            self._calm_since = None
            return True, None
        if self._calm_since is None:
            self._calm_since = t_s
        if t_s - self._since >= s.min_dwell_s and t_s - self._calm_since >= s.min_dwell_s:
            self.active = False
            return False, (f"leave fallback: scores below exit thresholds for {t_s - self._calm_since:g} s "
                           f"(mahalanobis {mahalanobis:.3g}, disagreement {disagreement:.3g})")
        return True, None

    def force(self, t_s: float, reason: str) -> str | None:
        """Enter the fallback now (e.g. a monitor rule); returns the transition text if it changed."""
        self._since, self._calm_since = t_s, None
        self.reason = reason
        if self.active:
            return None
        self.active = True
        return "enter fallback: " + reason
