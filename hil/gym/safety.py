"""`SafetyWrapper`: the scenario's safety wrapper (hil/safety/core.py) in the training loop.

Each step, the wrapped policy's action is a proposal; the same `SafetyCore` that the safety
process runs in HIL decides what acts, from the observation the bus would carry (the
measured outputs and applied inputs of the previous step): bounded projection (box, rate
from the applied value, linear state-dependent limits such as the shear limit), the monitor's
rules (alarm, forced fallback, rollback), and the fallback to the baseline controller
([safety.fallback]) when the policy is silent (a non-finite action), the gate holds it, or a
monitor rule forces it. The env then steps with the decided action.

Modes: training runs the core in `mode` (default "full": the policy acts inside the
envelope; "limited" adds the tighter band around the baseline) with auto-promotion off. The
confidence gate's checks need the policy's training statistics and ensemble members, which
a policy being trained does not have yet: they are off unless `stats=(mean, cov)` is given
(then the Mahalanobis check is on, as configured in [safety.confidence]).

info["safety"] per step: `source` ("policy" or "baseline:<why>"), `proposed`, `action`
(what acted), `projected` (bool), `fallback` (bool), `events` (the core's log records of
this step: clips with their reasons, fallback enter/exit, alarms, rollbacks).
info["interventions"]: the episode's counts so far: `projected` (steps whose action was
clipped), `fallback` (steps the baseline acted), `alarms`, `rollbacks`.
"""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np

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
        self.episode_interventions = self._zero()
        info["interventions"] = dict(self.episode_interventions)
        return obs, info

    def step(self, action):
        base = self.env.unwrapped
        core = self.core
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        k, step_s = base.k, base.model.step_s
        # the observation the bus carried for this decision: after step k - 1 (t = k * step_s)
        y, u = base.y_meas.copy(), base.u_app.copy()
        proposal = None
        if np.isfinite(a).all():
            proposal = SimpleNamespace(payload={"a": a, "members": None, "version": "gym"})
        c0 = dict(core.c)
        self._events.clear()
        decision = core.decide(k - 1, k * step_s, y, u, proposal, silent_reason="non-finite action")
        c = core.c
        projected = c["clipped_decisions"] > c0["clipped_decisions"]
        fallback = decision.source != "policy"
        ei = self.episode_interventions
        ei["projected"] += int(projected)
        ei["fallback"] += int(fallback)
        ei["alarms"] += c["alarms"] - c0["alarms"]
        ei["rollbacks"] += c["rollbacks"] - c0["rollbacks"]
        events = [e for e in self._events if e.get("event") != "decision" or "clips" in e]
        obs, reward, terminated, truncated, info = self.env.step(decision.action)
        info["safety"] = {"source": decision.source, "proposed": a, "action": decision.action.copy(),
                          "projected": projected, "fallback": fallback, "events": events}
        info["interventions"] = dict(ei)
        return obs, reward, terminated, truncated, info
