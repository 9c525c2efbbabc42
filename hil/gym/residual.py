"""Residual actions on the scenario's baseline: what a policy outputs is a bounded correction
to the command of the baseline controller ([safety.fallback], the SoftPLC's PID block).

    action = clip(baseline(y_meas, u_applied) + scale * span * clip(correction, -1, 1), lo, hi)

- `baseline` is one `hil.safety.fallback.FallbackController` per instance, executed exactly as
  `hil.gym.train_example.baseline_actions_fn` executes it for the baseline's own evaluation:
  on the measured outputs (NaN where Bad: the loop holds) and the applied inputs the bus
  carried, `dt` = 0 at an episode's first decision (the output at the current error) and
  loop.step_s after.
- `track` (default False): after each step the baseline tracks the action decided
  (`FallbackController.track`, bumpless, as the HIL safety wrapper's baseline tracks what
  acted): the PID continues from the action, so a correction moves its integral and the
  command is "the last action + the PID's increment + the correction". This is what gives a
  memoryless policy authority over the steady state: with `track=False` the PID's integral
  cancels any correction that is a function of the observation at steady state (e = 0 is
  its only equilibrium), so the policy can only reshape transients; here it can hold the
  true pH off the biased sensor's setpoint, or trade DO against agitation power.
  Tracking integrates the exploration noise into the PID (a random walk of the actuator):
  PPO diverged with it in every trial (docs/guides/train-then-prove.md), hence the default.
- `correction` in [-1, 1] per action (the policy's output space), `scale` the largest
  correction as a fraction of each input's span (the physical bounds hi - lo of the spec).
- `lo, hi`: the physical bounds narrowed to [safety.projection].box.
- `fallback` (default: the scenario's [safety.fallback]): the controller the residual rides on,
  a `FallbackSection`. `open_loops(section, inputs)` opens the named loops (each input held at
  its loop's bias, a `fixed` value): on this scenario the pH loop follows a biased electrode
  (the per-episode `[gaps.randomize.sensors.ph]` bias) and so holds the true pH off 5.0 in
  most episodes; the PID DO loop with the base flow held at its bias scores -74.1 on the
  validation seeds against the full PID block's -108.5 (docs/guides/train-then-prove.md).
  What a deployed residual rides on is recorded in its `meta.json` (hil/policy/residual.py).

With a zero correction the actions are the baseline's bit for bit, so the env reproduces the
baseline's held-out return exactly (tested): a policy initialised at zero correction starts
at the baseline and has only to learn what improves on it.

`ResidualActions` composes the actions for a `HilVectorEnv` (reads its `Ymeas`, `Uapp`);
`ResidualSB3VecEnv` is the SB3 `VecEnv` (hil.gym.sb3) whose action space is the correction.
"""

from __future__ import annotations

import numpy as np


def residual_box(scenario, names: list[str], a_lo: np.ndarray, a_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Physical bounds of the actions narrowed to [safety.projection].box (plant units); also the
    ES example's action box (hil/gym/train_example.py)."""
    lo, hi = np.array(a_lo, dtype=np.float64), np.array(a_hi, dtype=np.float64)
    if scenario.safety is not None:
        for j, n in enumerate(names):
            if n in scenario.safety.projection.box:
                b_lo, b_hi = scenario.safety.projection.box[n]
                lo[j], hi[j] = max(lo[j], b_lo), min(hi[j], b_hi)
    return lo, hi


def open_loops(section, inputs):
    """`section` (a FallbackSection) with the loops of `inputs` removed and each such input
    held at its loop's bias (clipped to the loop's output range), as a `fixed` value."""
    inputs = list(inputs or ())
    loops = {lp.input: lp for lp in section.loops}
    unknown = [n for n in inputs if n not in loops]
    if unknown:
        raise ValueError(f"open_loops: {', '.join(unknown)} has no [[safety.fallback.loops]] loop "
                         f"(loops: {', '.join(loops) or 'none'})")
    fixed = dict(section.fixed)
    for n in inputs:
        lp = loops[n]
        lo = -np.inf if lp.out_min is None else lp.out_min
        hi = np.inf if lp.out_max is None else lp.out_max
        fixed[n] = float(min(max(lp.bias, lo), hi))
    return section.model_copy(update={"loops": [lp for lp in section.loops if lp.input not in inputs],
                                      "fixed": fixed})


class ResidualActions:
    """Baseline + bounded correction for every instance of a HilVectorEnv (module docstring)."""

    def __init__(self, venv, scale: float | np.ndarray = 0.1, track: bool = False, fallback=None):
        sc = venv.model.scenario
        if fallback is None and sc.safety is None:
            raise ValueError(f"scenario {sc.name!r}: residual actions need a baseline controller "
                             "([safety.fallback]), and it has no [safety] section")
        n_a = len(venv.action_names)
        scale = np.asarray(scale, dtype=np.float64)
        if scale.ndim > 1 or scale.size not in (1, n_a):
            raise ValueError(f"scale: one value or one per action ({n_a}: {', '.join(venv.action_names)}), "
                             f"got shape {scale.shape}")
        scale = np.broadcast_to(scale.reshape(-1), (n_a,)).copy()
        if not (np.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError(f"scale: the largest correction as a fraction of each input's span must be > 0 "
                             f"and finite, got {scale.tolist()}")
        self.venv = venv
        self.names = list(venv.action_names)
        m = venv.model
        self.lo, self.hi = residual_box(sc, self.names, m.a_lo, m.a_hi)
        self.step_s = float(m.step_s)
        self.amplitude = scale * (m.a_hi - m.a_lo)  # plant units of a correction of 1
        self.scale = scale
        self.track = bool(track)
        self.fallback = sc.safety.fallback if fallback is None else fallback
        self.ctrls: list = [None] * venv.num_envs
        self.first = np.ones(venv.num_envs, dtype=bool)
        self.reset_rows(np.arange(venv.num_envs))

    def reset_rows(self, rows) -> None:
        """Fresh baseline controllers for these instances (a new episode starts there)."""
        from hil.safety.fallback import FallbackController

        for i in np.asarray(rows, dtype=np.intp).reshape(-1):
            self.ctrls[i] = FallbackController(self.fallback, self.venv.model.spec, self.names)
            self.first[i] = True

    def baseline(self) -> np.ndarray:
        """Advance every instance's baseline on the venv's current observation; its commands
        (N, a), plant units. Call once per step, before the step."""
        v = self.venv
        out = np.empty((v.num_envs, len(self.names)))
        for i, c in enumerate(self.ctrls):
            out[i] = c.update(v.Ymeas[i], v.Uapp[i], 0.0 if self.first[i] else self.step_s)
        self.first[:] = False
        return out

    def actions(self, correction: np.ndarray) -> np.ndarray:
        """Actions (N, a) for corrections (N, a) in [-1, 1] (clipped there; non-finite: 0)."""
        corr = np.asarray(correction, dtype=np.float64).reshape(self.venv.num_envs, len(self.names))
        corr = np.clip(np.nan_to_num(corr, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
        a = np.clip(self.baseline() + self.amplitude * corr, self.lo, self.hi)
        if self.track:
            v = self.venv
            for i, c in enumerate(self.ctrls):
                c.track(a[i], v.Ymeas[i], v.Uapp[i])
        return a


def residual_act_fn(venv, scale, correction_fn, track: bool = False, fallback=None):
    """act_fn(obs) -> actions for `rollout_returns`/`heldout_evaluation`: the baseline of
    `venv` plus `correction_fn(obs)` (N, a) in [-1, 1]. The controllers start fresh (the
    evaluation resets every instance once, at its start)."""
    res = ResidualActions(venv, scale, track, fallback)

    def act(obs):
        return res.actions(correction_fn(obs))
    act.residual = res
    return act


def make_residual_sb3_vec(path, num_envs: int, *, scale: float | np.ndarray = 0.1, track: bool = False,
                          fallback=None, parallel: bool | None = None, overrides: dict | None = None, **kwargs):
    """`hil.gym.make_vec(...)` as an SB3 VecEnv whose actions are corrections in [-1, 1] to the
    scenario's baseline (same arguments as hil.gym.sb3.make_sb3_vec, plus `scale`, `track`,
    `fallback`)."""
    from hil.gym import make_vec
    from hil.gym.sb3 import HilSB3VecEnv
    from gymnasium import spaces

    class ResidualSB3VecEnv(HilSB3VecEnv):
        """HilSB3VecEnv with the correction as its action (see hil.gym.residual)."""

        def __init__(self, venv, scale, track, fallback):
            super().__init__(venv)
            self.residual = ResidualActions(venv, scale, track, fallback)
            a = len(venv.action_names)
            self.action_space = spaces.Box(-1.0, 1.0, shape=(a,), dtype=np.float32)

        def reset(self):
            obs = super().reset()
            self.residual.reset_rows(np.arange(self.num_envs))
            return obs

        def step_async(self, actions):
            super().step_async(self.residual.actions(actions))

        def step_wait(self):
            obs, reward, dones, infos = super().step_wait()
            if dones.any():
                self.residual.reset_rows(np.flatnonzero(dones))
            return obs, reward, dones, infos

    return ResidualSB3VecEnv(make_vec(path, num_envs, parallel=parallel, overrides=overrides, **kwargs), scale, track,
                             fallback)
