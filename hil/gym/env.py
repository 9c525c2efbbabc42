"""`HilEnv`: a gymnasium.Env over a scenario, stepping exactly as `hil run --lockstep` does.

Per step (hil/runtime.py's loop, minus the wire): the commanded inputs are the scenario's
(fixed values, profiles; PLC-driven inputs hold their initial command, as in a lockstep run
that no PLC writes to) with the action written into the bus-driven inputs, clipped to the
physical bounds (a non-finite action component holds the applied value), through the
actuation gaps, one plant step, the sensor gaps. The observation is what the policy sees on
the bus: features over (measured outputs, applied inputs) in [gym].observation order (default
the bus observation: every measured output, then every applied input). A Bad (dropped-out)
measured output, NaN on the bus, is held at its last good value by default ([gym].bad_observation:
"hold", "substitute" or "nan"); `info["bad_outputs"]` says which outputs were Bad (spec order).

Episodes: `reset(seed=s)` starts episode 0 of seed s (same parameter draws, gap streams and
trajectory as `hil run --lockstep` with loop.seed = s, given the same commands); `reset()`
starts the next episode of the same seed; the first reset without a seed uses loop.seed.

`terminated`: a safety stop (a state not finite, outside its physical bounds with
[gym].state_bounds, or a [gym].limits signal outside its interval). `truncated`: the episode
reached [gym].episode_s. `info`: the true state `x`, true outputs `y`, the command `u_cmd`,
the applied inputs `u_applied` and `action_applied` (after clip and actuator gaps), the loop's
clips of this step (`clipped`), the episode's draws (`randomized`, on reset), `seed` and
`episode_index` (on reset; not `episode`, which gymnasium's RecordEpisodeStatistics writes), `t_s`, and,
with hil.gym.SafetyWrapper, every intervention.
"""

from __future__ import annotations

import numpy as np
import gymnasium as gym
from gymnasium import spaces

from hil.gym.model import ScenarioModel
from hil.gym.signals import Features, limit_names, limits_violated
from hil.loop.step import LoopStep
from hil.recorder import columns_for


class HilEnv(gym.Env):
    """One scenario instance. Action: the bus-driven inputs (plant units, in the scenario's declared
    order: [policy].inputs, then the [inputs] tables' order; `metadata` names both orders; bounded
    by their physical bounds). Observation: float64 features (see the module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, scenario, *, scenario_path: str | None = None):
        self.model = m = ScenarioModel(scenario)
        self.scenario_path = scenario_path
        self.action_names = m.action_names
        self.feature_names = m.feature_names
        # the order of the action and observation vectors, for tools that read env metadata
        self.metadata = {**type(self).metadata, "action_names": list(m.action_names),
                         "observation_names": list(m.feature_names),
                         "action_order": m.action_order, "observation_order": m.observation_order}
        self.action_space = spaces.Box(m.a_lo.copy(), m.a_hi.copy(), dtype=np.float64)
        n_f = len(m.feature_names)
        self.observation_space = spaces.Box(-np.inf, np.inf, (n_f,), dtype=np.float64)
        self._seed = m.seed
        self._episode = -1
        self.gaps = m.gaps(self._seed)
        # the loop's compiled step (hil/loop/step.py) over this instance's arrays
        self.plant = m.new_plant()
        self.loop = LoopStep(self.plant, self.gaps, m.correction, step_s=m.step_s, x_tol=m.x_tol,
                             n_columns=len(columns_for(m.spec)))
        self.x, self.p, self.u_app, self.y = self.plant.x, self.plant.p, self.plant.u, self.plant.y
        self.u_cmd, self.u_clip, self.y_meas = self.loop.u_cmd, self.loop.u_clip, self.loop.y_meas
        self.counts = self.loop.counts
        self.u_prev = m.u0.copy()
        self.features = Features(m)
        self.obs = np.zeros(n_f)
        self.k = 0
        self.drawn: dict = {}

    @property
    def hooks(self):
        """Per-step hooks as Runtime.hooks (pre, actuate, sense: e.g. a campaign FaultStage over
        `self.plant`); None: the step runs fused."""
        return self.loop.hooks

    @hooks.setter
    def hooks(self, hooks) -> None:
        self.loop.hooks = hooks

    @property
    def row(self) -> np.ndarray:
        """The last step's recording row (hil/recorder.py columns_for; wall_ns and late_us 0)."""
        return self.loop.row

    @property
    def seed_episode(self) -> tuple[int, int]:
        """(seed, episode) of the current episode."""
        return self._seed, self._episode

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        m = self.model
        if seed is not None:
            self._seed, self._episode = int(seed), 0
        else:
            self._episode += 1
        self.plant.restore(m.snapshot0)
        self.drawn = m.begin_episode(self.gaps, self._seed, self._episode, self.p)
        self.u_cmd[:] = m.u0
        self.u_app[:] = m.u0
        self.k = 0
        self.counts[:] = 0
        self.loop.x_out[:] = 0
        self.loop.corr[4][:] = 0.0  # the residual model's event state: an episode starts fresh
        # the loop's initial publish (hil/runtime.py _publish_initial): sense at t = 0
        self.loop.sync_in()
        self.loop.publish_initial()
        self.features = Features(m)
        self.features.build(self.y_meas, self.u_app, self.obs)
        info = {"x": self.x.copy(), "y": self.y.copy(), "u_applied": self.u_app.copy(), "t_s": 0.0,
                "seed": self._seed, "episode_index": self._episode, "randomized": dict(self.drawn),
                "bad_outputs": self.features.bad.copy()}
        return self.obs.copy(), info

    def step(self, action):
        m = self.model
        t = self.k * m.step_s
        if self.hooks is not None:
            self.hooks.pre(self.k, t)
        for prof in m.profiles:
            v = float(prof.value_at(t))
            if v == v:
                self.u_cmd[prof.index] = v
        self.u_cmd[m.action_index] = np.asarray(action, dtype=np.float64).reshape(-1)
        self.u_prev[:] = self.u_app
        c0 = int(self.counts[0] + self.counts[1])
        status = self.loop.step(self.k)  # the loop's compiled step: clip .. sensor gaps, the row
        self.k += 1
        finite = status >= 0
        out = (self.x < m.x_lo - m.x_tol) | (self.x > m.x_hi + m.x_tol)
        self.features.build(self.y_meas, self.u_app, self.obs)
        t_end = self.k * m.step_s
        sig = {"x": self.x, "y": self.y, "meas": self.y_meas, "u": self.u_app, "cmd": self.u_clip,
               "du": self.u_app - self.u_prev, "t_s": t_end}
        stops = []
        if not finite:
            stops.append("diverged")
        if m.gym.state_bounds and finite and out.any():
            stops += [f"state {m.spec.states[i].name} outside its bounds" for i in np.flatnonzero(out)]
        if finite and m.limits and bool(limits_violated(m, self.x, self.y)):
            stops += [f"limit {n}" for n in limit_names(m, self.x, self.y)]
        terminated = bool(stops)
        reward = float(m.reward(sig)) if finite else 0.0
        if terminated:
            reward += m.gym.terminal_reward
        truncated = (not terminated) and self.k >= m.max_steps
        info = {"x": self.x.copy(), "y": self.y.copy(), "u_cmd": self.u_cmd.copy(),
                "u_applied": self.u_app.copy(), "action_applied": self.u_app[m.action_index].copy(),
                "clipped": int(self.counts[0] + self.counts[1]) - c0, "t_s": t_end, "stop": stops,
                "bad_outputs": self.features.bad.copy()}
        return self.obs.copy(), reward, terminated, truncated, info
