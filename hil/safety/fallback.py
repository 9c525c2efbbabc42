"""The fallback controller and the confidence gate that hands control to it.

FallbackController: the baseline, hand-written controller operations trust: PID loops
(hil.control.pid.PID, the SoftPLC's block) and fixed values, one per action input. It runs on
every observation, whoever acts, and stays bumpless in two ways:
- `track(decided)`: after each decision, each PID's integral is set so that its output at the
  current error equals the decided action (the policy's, or its own after projection);
- `follow(applied)`: when the actuator carries a value the wrapper did not decide (the loop's
  watchdog fallback after a hang, an actuator gap, another writer), the output is set to that
  applied value at the error of the PID's last execution, so the baseline continues from where
  the actuator really is, not from where the wrapper last wanted it.
A loop whose measurement is Bad (NaN, or Bad quality) does not execute: with `on_bad = "hold"`
its output stays where the actuator is and its integral is frozen at the last good measurement
(no windup on a frozen value; the derivative restarts at the next good sample); with
`on_bad = "safe"` its output goes to the loop's `safe_output` (the projection ramps it at the
rate limit). Fixed values are unaffected.

Joint PD ([[safety.fallback.joint_pd]], for an arm's torque inputs): tau = kp (q_ref - q) -
kd dq (+ g(q) from the plant's `gravity_hook` when the drive does not add it). q_ref is latched
from the measured position whenever the decided action was not the PD's own (the policy
acted), so when the baseline takes over the arm is held where it is (no jump back to an old
reference); a Bad q or dq makes the PD output zero torque on top of the drive's gravity
compensation (the arm coasts on friction rather than acting on a NaN). `hold` inputs stay at
their applied value (a gripper keeps its grasp).

ConfidenceGate: scores each observation by
- the Mahalanobis distance of the policy's features from its training data (mean, covariance
  stored with the policy version),
- the ensemble's disagreement: max over actions of std(members) / scale (default scale: the
  input's span), and
- the proposal's inconsistency with its members: max over actions of the distance of the
  proposed action outside the members' hull [min, max], / scale (0 inside),
and holds the fallback with hysteresis: it enters as soon as a score exceeds its `*_enter`
threshold; it leaves only after `min_dwell_s` (simulated) in fallback AND `min_dwell_s` with
every score below its `*_exit` threshold. Every check fails closed: a score that cannot be
computed (no training statistics, a Bad feature, fewer than 2 members for the disagreement,
no members for the consistency) counts as exceeding its threshold, unless the operator
disabled that check ([safety.confidence] mahalanobis / disagreement / consistency = false).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from hil.control.pid import pid_from_config
from hil.safety.config import signal_index, signal_span

CHECKS = ("mahalanobis", "disagreement", "consistency")


class JointPdLaw:
    """One [[safety.fallback.joint_pd]] block: positions in the action vector, output indices."""

    def __init__(self, cfg, spec, names: list[str], plant=None):
        elems = spec.expand("inputs", cfg.inputs)
        self.pos = np.array([names.index(e) for e in elems], dtype=np.intp)
        self.iq = spec.indices("outputs", cfg.position)
        self.idq = spec.indices("outputs", cfg.velocity)
        n = len(elems)
        self.kp = np.broadcast_to(np.asarray(cfg.kp, dtype=float), (n,)).copy()
        self.kd = np.broadcast_to(np.asarray(cfg.kd, dtype=float), (n,)).copy()
        self.lo = np.array([spec.quantity("inputs", e).low for e in elems])
        self.hi = np.array([spec.quantity("inputs", e).high for e in elems])
        self.gravity = None
        if cfg.gravity:
            from hil.safety.projection import plant_module

            hook = getattr(plant_module(plant), "gravity_hook", None)
            if hook is None:
                raise ValueError("safety.fallback.joint_pd.gravity: the plant provides no gravity_hook")
            self.gravity = hook(plant)
        self.q_ref = np.full(n, np.nan)

    def update(self, y: np.ndarray, action: np.ndarray) -> None:
        q, dq = y[self.iq], y[self.idq]
        if not (np.isfinite(q).all() and np.isfinite(dq).all()):
            action[self.pos] = 0.0
            return
        if not np.isfinite(self.q_ref).all():
            self.q_ref[:] = q
        tau = self.kp * (self.q_ref - q) - self.kd * dq
        if self.gravity is not None:
            tau += self.gravity(y)
        action[self.pos] = np.clip(tau, self.lo, self.hi)

    def relatch(self, y: np.ndarray) -> None:
        """Someone else acted: the reference follows the measured position."""
        q = y[self.iq]
        if np.isfinite(q).all():
            self.q_ref[:] = q


class FallbackController:
    def __init__(self, section, spec, action_names: list[str], plant=None):
        self.names = list(action_names)
        self.action = np.zeros(len(self.names))
        self.pds = [JointPdLaw(cfg, spec, self.names, plant) for cfg in getattr(section, "joint_pd", ())]
        self.holds = np.array([spec.index("inputs", n) for n in getattr(section, "hold", ())], dtype=np.intp)
        self.hold_pos = np.array([self.names.index(n) for n in getattr(section, "hold", ())], dtype=np.intp)
        self.loops = []  # (position, PID, setpoint, kind, index, span, safe output or None)
        for loop in section.loops:
            pid = pid_from_config(loop, spec.quantity("inputs", loop.input))
            kind, idx = signal_index(spec, loop.measurement)
            safe = section.safe_output[loop.input] if section.loop_on_bad(loop) == "safe" else None
            self.loops.append((self.names.index(loop.input), pid, loop.setpoint, kind, idx,
                               signal_span(spec, loop.measurement), safe))
            self.action[self.names.index(loop.input)] = pid._clip(loop.bias)
        self.fixed = [(self.names.index(n), v) for n, v in section.fixed.items()]
        for pos, v in self.fixed:
            self.action[pos] = v
        self.last_e = [math.nan] * len(self.loops)  # error at each loop's last good measurement
        self.bad = [False] * len(self.loops)  # the loop's measurement was Bad in the last update

    @staticmethod
    def _meas(kind: str, idx: int, y: np.ndarray, u: np.ndarray) -> float:
        return float(u[idx] if kind == "u" else y[idx])

    def update(self, y: np.ndarray, u: np.ndarray, dt_s: float) -> np.ndarray:
        """Baseline action for this observation (plant units); dt_s: sim s since the last one
        (<= 0 on the first: the output at the current error, nothing integrated). y may hold
        NaN for Bad outputs."""
        for li, (pos, pid, sp, kind, idx, _, safe) in enumerate(self.loops):
            m = self._meas(kind, idx, y, u)
            if not math.isfinite(m):
                if not self.bad[li]:
                    pid.hold()
                    self.bad[li] = True
                if safe is not None:
                    self.action[pos] = safe
                continue  # "hold": the output stays where the actuator is (see follow/track)
            self.bad[li] = False
            self.action[pos] = pid.update(sp, m, dt_s) if dt_s > 0 else pid.evaluate(sp, m)
            self.last_e[li] = pid.error(sp, m)
        for pos, v in self.fixed:
            self.action[pos] = v
        for pd in self.pds:
            pd.update(y, self.action)
        if self.holds.size:
            self.action[self.hold_pos] = u[self.holds]
        return self.action.copy()

    def track(self, applied: np.ndarray, y: np.ndarray, u: np.ndarray) -> None:
        """Bumpless transfer: make each PID's output at the current error (the last good one if
        the measurement is Bad) equal what was decided or applied. A joint PD whose output was
        not what was decided re-latches its reference to the measured position."""
        for pd in self.pds:
            if not np.allclose(applied[pd.pos], self.action[pd.pos], rtol=0.0, atol=1e-9):
                pd.relatch(y)
                self.action[pd.pos] = applied[pd.pos]
        for li, (pos, pid, sp, kind, idx, _, _) in enumerate(self.loops):
            if abs(applied[pos] - self.action[pos]) > 1e-12 * (1.0 + abs(applied[pos])):
                m = self._meas(kind, idx, y, u)
                pid.track(applied[pos], pid.error(sp, m) if math.isfinite(m) else self.last_e[li])
                self.action[pos] = applied[pos]

    def follow(self, applied: np.ndarray, which: np.ndarray, y: np.ndarray, u: np.ndarray) -> None:
        """The actuators `which` (bool per action) carry values the wrapper did not decide: set
        each PID's output at the error of its last execution (before the first one: at the
        current measurement) to the applied value, before this observation's update."""
        for li, (pos, pid, sp, kind, idx, _, _) in enumerate(self.loops):
            if which[pos]:
                e = self.last_e[li]
                if not math.isfinite(e):
                    e = pid.error(sp, self._meas(kind, idx, y, u))
                pid.track(applied[pos], e)
                self.action[pos] = applied[pos]

    def tracking_sq(self, y: np.ndarray, u: np.ndarray) -> float:
        """Mean over loops of ((measurement - setpoint) / span)^2; 0 without loops; NaN when a
        loop's measurement is Bad (the KPI cannot be computed)."""
        if not self.loops:
            return 0.0
        s = 0.0
        for _, _, sp, kind, idx, span, _ in self.loops:
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


@njit(cache=True, nogil=True)
def _max_outside_hull(a, members, inv_scale):
    """max over columns k of max(0, min(members[:, k]) - a[k], a[k] - max(members[:, k])) * inv_scale[k]."""
    m, n = members.shape
    best = 0.0
    for k in range(n):
        lo = members[0, k]
        hi = members[0, k]
        for i in range(1, m):
            v = members[i, k]
            if v < lo or v != v:
                lo = v
            if v > hi or v != v:
                hi = v
        d = max(lo - a[k], a[k] - hi, 0.0) * inv_scale[k]
        if lo != lo or hi != hi or a[k] != a[k]:
            return np.nan
        if d > best:
            best = d
    return best


class ConfidenceGate:
    def __init__(self, section, spec, action_names: list[str]):
        self.sec = section
        self.scale = np.array([section.scale.get(n, signal_span(spec, "u." + n)) for n in action_names])
        self._inv_scale = 1.0 / self.scale
        self._inv_scale2 = 1.0 / (self.scale * self.scale)
        self.enabled = {k: bool(getattr(section, k)) for k in CHECKS}
        # (enter, exit) per check; consistency has one tolerance (no hysteresis needed: the
        # dwell holds the fallback)
        self.thresholds = {
            "mahalanobis": (section.mahalanobis_enter, section.mahalanobis_exit),
            "disagreement": (section.disagreement_enter, section.disagreement_exit),
            "consistency": (section.consistency_tolerance, section.consistency_tolerance),
        }
        self.mean: np.ndarray | None = None
        self.precision: np.ndarray | None = None
        self.accepted: dict | None = None  # the operator's acceptance of the current version as a single network
        self.active = False
        self.reason = ""
        self._since = -math.inf  # sim time the fallback was entered
        self._calm_since: float | None = None  # sim time every score went below its exit threshold
        self.last = {k: math.nan for k in CHECKS}

    @property
    def last_mahalanobis(self) -> float:
        return self.last["mahalanobis"]

    @property
    def last_disagreement(self) -> float:
        return self.last["disagreement"]

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

    def use_version(self, version: str | None) -> dict | None:
        """The policy version now proposing: whether [safety.confidence] accepts it as a single
        network (returns the acceptance, or None)."""
        self.accepted = self.sec.acceptance(version)
        return self.accepted

    def member_scores(self, a: np.ndarray, members: np.ndarray | None) -> tuple[float | None, float | None, dict]:
        """(disagreement, inconsistency, why) of a proposal. NaN: cannot be computed (fewer than
        2 members, or none: fail closed, `why` says so); None: not applicable, which only an
        operator's acceptance of the current version as a single network makes so (and only
        for a proposal with fewer than 2 members: members sent are always checked)."""
        n_m = 0 if members is None else members.shape[0]
        if n_m < 2 and self.accepted is not None:
            return None, None, {}
        dis = self.disagreement(members)
        inc = self.inconsistency(a, members)
        why = {}
        if math.isnan(dis) or math.isnan(inc):
            why["disagreement"] = f"{n_m} member(s), at least 2 needed (a single network: import it with --heads K, " \
                                  "or an operator accepts it in [safety.confidence] single_network)"
            why["consistency"] = "the proposal carries no members" if n_m == 0 else why["disagreement"]
        return dis, inc, why

    def mahalanobis(self, x: np.ndarray | None) -> float:
        """Distance of the features from the training data; NaN when it cannot be computed (no
        statistics, no features, a non-finite feature)."""
        if self.precision is None or x is None:
            return math.nan
        d = x - self.mean
        return math.sqrt(max(float(d @ self.precision @ d), 0.0))  # NaN propagates

    def disagreement(self, members: np.ndarray | None) -> float:
        """max over actions of std(members) / scale; NaN with fewer than 2 members."""
        if members is None or members.shape[0] < 2:
            return math.nan
        members = np.asarray(members, dtype=np.float64)
        if members.ndim != 2 or members.shape[1] != self._inv_scale2.size:
            raise ValueError(f"members of shape {members.shape}, expected (M, {self._inv_scale2.size})")
        return float(_max_scaled_std(members, self._inv_scale2))

    def inconsistency(self, a: np.ndarray, members: np.ndarray | None) -> float:
        """How far the proposed action lies outside its members' hull: max over actions of
        max(0, min(members) - a, a - max(members)) / scale. 0 inside; NaN without members."""
        if members is None or members.shape[0] < 1:
            return math.nan
        members = np.asarray(members, dtype=np.float64)
        if members.ndim != 2 or members.shape[1] != self._inv_scale.size:
            raise ValueError(f"members of shape {members.shape}, expected (M, {self._inv_scale.size})")
        return float(_max_outside_hull(np.asarray(a, dtype=np.float64), members, self._inv_scale))

    def update(self, t_s: float, mahalanobis: float, disagreement: float | None = None,
               inconsistency: float | None = None, why: dict[str, str] | None = None) -> tuple[bool, str | None]:
        """Advance to sim time t_s with this observation's scores. A score of None is not
        applicable this step (no proposal to check): it neither trips nor disturbs the calm;
        NaN cannot be computed: it trips an enabled check (fail closed), `why[check]` saying
        why. Returns (active, transition), transition a reason string when the gate just
        entered or left, else None."""
        self.last["mahalanobis"] = mahalanobis
        self.last["disagreement"] = math.nan if disagreement is None else disagreement
        self.last["consistency"] = math.nan if inconsistency is None else inconsistency
        trips = []
        calm = True
        for name, v in (("mahalanobis", mahalanobis), ("disagreement", disagreement),
                        ("consistency", inconsistency)):
            if v is None or not self.enabled[name]:
                continue
            enter, exit_ = self.thresholds[name]
            if math.isnan(v):
                trips.append(f"{name} cannot be computed ({(why or {}).get(name, 'no score')}): not confident")
                calm = False
            else:
                if v > enter:
                    trips.append(f"{_label(name)} {v:.3g} > {enter:g}")
                if v > exit_:
                    calm = False
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
        if t_s - self._since >= self.sec.min_dwell_s and t_s - self._calm_since >= self.sec.min_dwell_s:
            self.active = False
            scores = ", ".join(f"{_label(k)} {self.last[k]:.3g}" for k in CHECKS if self.enabled[k])
            return False, (f"leave fallback: scores below exit thresholds for {t_s - self._calm_since:g} s "
                           f"({scores or 'every check disabled'})")
        return True, None

    def force(self, t_s: float, reason: str) -> str | None:
        """Enter the fallback now (e.g. a monitor rule); returns the transition text if it changed."""
        self._since, self._calm_since = t_s, None
        self.reason = reason
        if self.active:
            return None
        self.active = True
        return "enter fallback: " + reason

    def checks(self) -> dict:
        """Each check: enabled, its thresholds and its last score (None: not computed)."""
        out = {}
        for k in CHECKS:
            enter, exit_ = self.thresholds[k]
            v = self.last[k]
            out[k] = {"enabled": self.enabled[k], "enter": _num(enter), "exit": _num(exit_),
                      "last": None if not math.isfinite(v) else float(v)}
        out["mahalanobis"]["statistics"] = self.precision is not None
        return out


def _label(name: str) -> str:
    return "inconsistency" if name == "consistency" else name


def _num(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None
