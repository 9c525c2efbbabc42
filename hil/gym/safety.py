"""`SafetyWrapper`: the scenario's safety in the training loop, enforced by the loop's compiled shield.

The same two parts as a run with [safety] placement = "loop" (hil/loop/shield_bus.py), in one
process and without the wire, so lockstep, real time, gym and campaigns enforce the same thing:

- the supervisor: the `SafetyCore` the safety process runs (hil/safety/core.py), on the
  observation the bus would carry (the measured outputs and applied inputs after step k - 1):
  the monitor's rules (alarm, forced fallback, rollback), the confidence gate, the rollout mode,
  a silent policy (a non-finite action). Its decision is what the safety process would sign
  and send the loop: whether the policy may act (its source is "policy"), the mode, and the
  limited-mode band;
- the shield: the loop's compiled `Shield` (hil/loop/shield.py `shield_kernel`, the very kernel
  the loop's step calls), on the wrapped policy's action as the proposal for observation k - 1:
  the projection on the envelope (box, rate from the applied value, the linear and plant
  limits, the supervisor's band on the policy), or the fallback law ([safety.fallback]: PID,
  joint PD, fixed, hold) when the supervisor does not allow the policy, the action is not
  finite, or a limit cannot be computed. What it writes is the action the env steps with.

As in the loop, no observation has been published before step 0, so the supervisor has not
spoken there: step 0 of each episode is the fallback's ("fallback:supervisor_silent"). The
policy proposes every step (the gym's action each step: `hil run --lockstep` with [policy]
rate_hz at the loop's rate gives the same applied actions and sources, step for step:
tests/integration/test_gym_shield_lockstep.py).

Modes: training runs the core in `mode` (default "full": the policy acts inside the
envelope; "limited" adds the tighter band around the baseline) with auto-promotion off. The
confidence gate's checks need the policy's training statistics and ensemble members, which
a policy being trained does not have yet: they are off unless `stats=(mean, cov)` is given
(then the Mahalanobis check is on, as configured in [safety.confidence]).

info["safety"] per step: `source`, the shield's (hil/loop/shield_bus.py SOURCE_NAMES, the
recording's `shield.source` by name: "policy", "projected", "fallback:late", "fallback:mode",
"fallback:bad_proposal", "fallback:unknown_limits", "fallback:supervisor_silent"), `code`
(its number, as recorded), `supervisor` (the supervisor's decision: "policy" or
"baseline:<why>", e.g. "baseline:silent"; None before it spoke), `mode`, `proposed`, `action`
(what acted), `projected` (bool: the policy's action moved by the envelope), `fallback`
(bool), `events` (the supervisor's log records of this step: clips with their reasons,
fallback enter/exit, alarms, rollbacks).
info["interventions"]: the episode's counts so far: `projected`, `fallback`, `alarms`, `rollbacks`.
"""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np

from hil.loop.shield import FALLBACK_MODE, POLICY, PROJECTED, Shield
from hil.loop.shield_bus import FALLBACK_SILENT, SOURCE_NAMES
from hil.safety.core import SafetyCore


class SafetyWrapper(gym.Wrapper):
    def __init__(self, env, *, mode: str = "full", stats: tuple[np.ndarray, np.ndarray] | None = None):
        super().__init__(env)
        base = env.unwrapped
        sc = base.model.scenario
        if sc.safety is None:
            raise ValueError(f"scenario {sc.name!r} has no [safety] section to wrap the env with")
        sec = sc.safety
        conf = sec.confidence if stats is not None else sec.confidence.model_copy(
            update={"mahalanobis": False, "disagreement": False, "consistency": False})
        rollout = sec.rollout.model_copy(update={"auto_promote": False})
        self._scenario = sc.model_copy(update={"safety": sec.model_copy(
            update={"mode": mode, "confidence": conf, "rollout": rollout})})
        self._stats = stats
        self._names = base.action_names
        self.core: SafetyCore | None = None
        self._events: list[dict] = []
        self.episode_interventions = self._zero()
        model = base.model
        pol = sc.policy
        max_age = pol.max_age_steps(model.step_s) if pol is not None else 0
        self.shield = Shield(self._scenario, model.spec, self._names, plant=sc.plant.load(), max_age_steps=max_age)
        n = len(self._names)
        self._out = np.zeros(n)
        self._open = (np.full(n, -np.inf), np.full(n, np.inf))
        self.last_code = FALLBACK_SILENT

    @staticmethod
    def _zero() -> dict:
        return {"projected": 0, "fallback": 0, "alarms": 0, "rollbacks": 0}

    def _new_core(self) -> SafetyCore:
        base = self.env.unwrapped
        core = SafetyCore(self._scenario, base.model.spec, self._names, store=None, version="gym",
                          log=self._events.append)
        if self._stats is not None:
            from hil.policy.features import FeatureMap

            core.features = FeatureMap(base.model.spec, base.feature_names)
            core.gate.set_stats(self._stats)
        return core

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._events.clear()
        self.core = self._new_core()
        self._events.clear()
        self.shield.reset()
        self.episode_interventions = self._zero()
        info["interventions"] = dict(self.episode_interventions)
        return obs, info

    def step(self, action):
        base = self.env.unwrapped
        core, sh = self.core, self.shield
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        k, step_s = base.k, base.model.step_s
        # the observation the bus carried for this decision: after step k - 1 (t = k * step_s)
        y, u = base.y_meas, base.u_app
        c0 = dict(core.c)
        self._events.clear()
        if k == 0:  # nothing published yet: the supervisor has not spoken (the loop's step 0 too)
            allow, why, mode = False, None, core.rollout.mode
        else:  # the supervisor: what the safety process would send the loop for observation k - 1
            proposal = None
            if np.isfinite(a).all():
                proposal = SimpleNamespace(payload={"a": a, "members": None, "version": "gym"})
            d = core.decide(k - 1, k * step_s, y.copy(), u.copy(), proposal, silent_reason="non-finite action")
            allow, why, mode = d.source == "policy", d.source, d.mode
            lo, hi = core.band
            sh.band_lo[:] = self._open[0] if lo is None else lo
            sh.band_hi[:] = self._open[1] if hi is None else hi
        # the shield: the loop's compiled kernel on this proposal, the applied values and the outputs
        code = sh.step(k - 1, a, k - 1, y, u, u[sh.act_u], step_s, self._out, allow)
        if code == FALLBACK_MODE and why is None:
            code = FALLBACK_SILENT
        self.last_code = code
        action_out = self._out.copy()
        c = core.c
        projected = code == PROJECTED
        fallback = code not in (POLICY, PROJECTED)
        ei = self.episode_interventions
        ei["projected"] += int(projected)
        ei["fallback"] += int(fallback)
        ei["alarms"] += c["alarms"] - c0["alarms"]
        ei["rollbacks"] += c["rollbacks"] - c0["rollbacks"]
        events = [e for e in self._events if e.get("event") != "decision" or "clips" in e]
        obs, reward, terminated, truncated, info = self.env.step(action_out)
        info["safety"] = {"source": SOURCE_NAMES[code], "code": code, "supervisor": why, "mode": mode,
                          "proposed": a, "action": action_out, "projected": projected, "fallback": fallback,
                          "events": events}
        info["interventions"] = dict(ei)
        return obs, reward, terminated, truncated, info
