"""A residual policy in HIL: the imported network's correction added to a PID block's command,
computed in the policy process exactly as the gym env computes it (hil/gym/residual.py).

    action = clip(baseline(y_meas, u_applied, dt) + amplitude * clip(net(x), -1, 1), low, high)

`meta.json` of such a version carries everything that arithmetic needs (`residual`):

- `scale` (per action, fraction of each input's span) and `amplitude` (plant units of a
  correction of 1: scale x (the spec's physical high - low));
- `low`, `high`: the physical bounds narrowed to [safety.projection].box, as trained;
- `track`: whether the PID tracks the decided action after each decision;
- `fallback`: the PID block the residual rides on, a `[safety.fallback]` section as a dict
  (the scenario's own, or one with loops opened: hil.gym.residual.open_loops), so the version
  keeps the controller it was trained with even if the scenario's baseline is retuned later;
- `step_s`: the loop step it was trained at (the PID's dt per decision).

The controller is stateful. In the policy process (hil/policy/runner.py) `observe(y, u, step)`
runs it once per observation on the bus's measured outputs (NaN where Bad: the PID holds) and
applied inputs, dt = (step - the last observed step) x step_s (0 on the first: the output at
the current error, as the gym env's first decision); `act(x)` is then a pure function of the
features for that observation (the bootstrapped heads may call it again). Used without
`observe` (the import's rollout, `hil policy check`), `act(x)` advances the controller itself
on the features (the loops' measurements must be features, checked at import), one step_s per call.
"""

from __future__ import annotations

import numpy as np


class ResidualPolicy:
    def __init__(self, net_act, meta_residual: dict, spec, features: list[str], actions: list[str]):
        from hil.policy.features import split_feature
        from hil.safety.config import FallbackSection, signal_index
        from hil.safety.fallback import FallbackController

        r = meta_residual
        n_a = len(actions)
        self.net_act = net_act
        self.section = FallbackSection.model_validate(r["fallback"])
        self.spec, self.actions = spec, list(actions)
        self.amplitude = np.asarray(r["amplitude"], dtype=np.float64).reshape(-1)
        self.low = np.asarray(r["low"], dtype=np.float64).reshape(-1)
        self.high = np.asarray(r["high"], dtype=np.float64).reshape(-1)
        for key, v in (("amplitude", self.amplitude), ("low", self.low), ("high", self.high)):
            if v.shape != (n_a,):
                raise ValueError(f"residual.{key}: {v.size} values for {n_a} actions ({', '.join(actions)})")
        self.track = bool(r.get("track", False))
        self.step_s = float(r["step_s"])
        self.FallbackController = FallbackController
        # features -> (y, u) for the feature-only path: the plain (non-delta) features
        self._from_features = []
        for j, name in enumerate(features):
            is_delta, sig = split_feature(name)
            if not is_delta:
                kind, i = signal_index(spec, sig)
                self._from_features.append((j, kind, i))
        self.reset()

    def reset(self) -> None:
        """A fresh controller (a new episode or run)."""
        self.ctrl = self.FallbackController(self.section, self.spec, self.actions)
        self.last_step: int | None = None
        self.base: np.ndarray | None = None
        self.y = self.u = None
        self.external = False

    def observe(self, y: np.ndarray, u: np.ndarray, step: int) -> None:
        """Run the PID block on this observation (measured outputs, applied inputs, loop step)."""
        self.external = True
        dt = 0.0 if self.last_step is None else (int(step) - self.last_step) * self.step_s
        self.last_step = int(step)
        self.y, self.u = np.asarray(y, dtype=np.float64), np.asarray(u, dtype=np.float64)
        self.base = self.ctrl.update(self.y, self.u, dt)

    def _observe_features(self, x: np.ndarray) -> None:
        y = np.full(self.spec.n_outputs, np.nan)
        u = np.full(self.spec.n_inputs, np.nan)
        for j, kind, i in self._from_features:
            (y if kind == "y" else u)[i] = x[j]
        dt = 0.0 if self.last_step is None else self.step_s
        self.last_step = 0 if self.last_step is None else self.last_step + 1
        self.y, self.u = y, u
        self.base = self.ctrl.update(y, u, dt)

    def act(self, x: np.ndarray) -> np.ndarray:
        """The action (plant units, the version's action order) for features x."""
        x = np.asarray(x, dtype=np.float64)
        if not self.external:
            self._observe_features(x)
        corr = np.asarray(self.net_act(x), dtype=np.float64).reshape(-1)
        corr = np.clip(np.nan_to_num(corr, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
        a = np.clip(self.base + self.amplitude * corr, self.low, self.high)
        if self.track:
            self.ctrl.track(a, self.y, self.u)  # idempotent: a second call at this observation changes nothing
        return a


def residual_meta(scenario, env, scale, track: bool, fallback) -> dict:
    """meta.json's `residual` for the scenario's gym env `env` (its action order), a correction
    `scale` (one or one per action), riding on `fallback` (a FallbackSection)."""
    from hil.gym.residual import residual_box

    m = env.model
    n_a = len(env.action_names)
    scale = np.broadcast_to(np.asarray(scale, dtype=np.float64).reshape(-1), (n_a,)).copy()
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        raise ValueError(f"residual scale: > 0 and finite per action, got {scale.tolist()}")
    lo, hi = residual_box(scenario, list(env.action_names), m.a_lo, m.a_hi)
    return {"scale": scale.tolist(), "amplitude": (scale * (m.a_hi - m.a_lo)).tolist(), "low": lo.tolist(),
            "high": hi.tolist(), "track": bool(track), "fallback": fallback.model_dump(), "step_s": float(m.step_s),
            "formula": "clip(fallback(y_meas, u_applied) + amplitude * clip(net(x), -1, 1), low, high)"}


def check_measurements_are_features(section, features: list[str], spec) -> None:
    """The feature-only path needs each loop's measurement (and each held input) as a plain feature."""
    from hil.safety.config import signal_index

    have = set()
    for name in features:
        if not name.startswith("d."):
            have.add(signal_index(spec, name))
    need = [(lp.measurement, signal_index(spec, lp.measurement)) for lp in section.loops]
    need += [(f"u.{n}", ("u", spec.index("inputs", n))) for n in section.hold]
    missing = [n for n, key in need if key not in have]
    if missing:
        raise ValueError(f"a residual's PID reads {', '.join(missing)}, which the policy's features "
                         f"({', '.join(features)}) do not carry")
