"""The scenario as arrays, for the envs: a thin layer over the plant contract and the gaps.

Everything the single env and the vector env need from a scenario is resolved here once
(names -> indices), so that `env.py` and `vector.py` never touch the plant module or the
scenario models directly; when the plant contract grows (plants/spec.py, plants/base.py),
only this file follows.

An episode is (seed, episode): the same draws and gap streams as `hil run --lockstep` with
`loop.seed = seed` for episode 0 (hil/runtime.py builds its GapPipeline with the scenario's
seed, resets it for episode 0 and draws episode 0's parameters), and the next episodes of
the same seed after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hil.bus.config import declared_bus_input_names
from hil.errors import ConfigError
from hil.gaps.pipeline import GapPipeline
from hil.gym.config import GymSection
from hil.gym.expr import Expression
from hil.loop.plant import load_correction, scenario_plant
from plants.base import Plant


@dataclass
class Profile:
    """A profile-driven input: value of the last point with t_point <= t (as hil/runtime.py)."""

    index: int
    times: np.ndarray
    values: np.ndarray

    def value_at(self, t_s):
        """Command at simulated time(s) t_s; NaN before the first point (keep the previous)."""
        k = np.searchsorted(self.times, t_s, side="right") - 1
        return np.where(k >= 0, self.values[np.maximum(k, 0)], np.nan)


class ScenarioModel:
    """A validated Scenario resolved to kernels, index arrays and initial arrays."""

    def __init__(self, scenario):
        sc = self.scenario = scenario
        self.gym: GymSection = sc.gym if sc.gym is not None else GymSection()
        # the plant as hil run builds it (hil/loop/plant.py): overrides, sub-steps, residual model
        self.plant0 = plant0 = scenario_plant(sc)
        self.plant_model = module = plant0.model
        self.spec = spec = plant0.spec
        self.correction = load_correction(sc.plant.residual_model, spec)
        self.step_s = float(sc.loop.step_s)
        self.time_unit_s = float(module.time_unit_s)
        self.dt_plant = self.step_s / self.time_unit_s
        self.substeps = plant0.substeps
        self.plant_step, self.plant_outputs = module.step, module.outputs
        self.n_x, self.n_u, self.n_y = spec.n_states, spec.n_inputs, spec.n_outputs
        self.snapshot0 = plant0.snapshot()
        self.p0 = plant0.p.copy()
        self.x0 = plant0.x.copy()
        # initial commands: nominal, then each input's configured value
        self.u0 = spec.nominal("inputs")
        self.profiles: list[Profile] = []
        for name, inp in sc.inputs.items():
            i = spec.index("inputs", name)
            if inp.value is not None:
                self.u0[i] = inp.value
            if inp.driver == "profile":
                pts = list(inp.profile)
                self.profiles.append(Profile(i, np.array([p[0] for p in pts], float),
                                             np.array([p[1] for p in pts], float)))
        self.action_names = declared_bus_input_names(sc, spec)  # the scenario's order, not the spec's
        self.action_order = ("[policy].inputs, then the [inputs] tables in file order"
                             if sc.policy is not None and sc.policy.inputs else "the [inputs] tables in file order")
        if not self.action_names:
            raise ConfigError("inputs", f"scenario {sc.name!r} has no input with driver = 'bus': an env's action "
                                        "is the bus-driven inputs (the policy's)")
        self.action_index = np.array([spec.index("inputs", n) for n in self.action_names], dtype=np.intp)
        self.u_lo, self.u_hi = spec.lows("inputs"), spec.highs("inputs")
        self.x_lo, self.x_hi = spec.lows("states"), spec.highs("states")
        self.x_tol = 1e-9 * (self.x_hi - self.x_lo)  # hil/loop/health.py StateBounds
        self.a_lo, self.a_hi = self.u_lo[self.action_index], self.u_hi[self.action_index]
        g = self.gym
        self.max_steps = int(round(g.episode_s / self.step_s))
        self.reward = Expression(g.reward, spec)
        # termination limits on true signals: (block, index, lo, hi)
        self.limits = []
        for name, (lo, hi) in g.limits.items():
            if name in spec.names("outputs"):
                self.limits.append(("y", spec.index("outputs", name), lo, hi))
            else:
                self.limits.append(("x", spec.index("states", name), lo, hi))
        # observation: feature names over (measured outputs, applied inputs)
        self.feature_names = list(g.observation) if g.observation else (
            list(spec.names("outputs")) + [f"u.{n}" for n in spec.names("inputs")])
        self.observation_order = ("[gym].observation in file order" if g.observation else
                                  "the bus observation: every measured output, then every applied input "
                                  f"(the {spec.name} spec's order)")
        from hil.policy.features import split_feature
        from hil.safety.config import signal_index

        idx, delta, lo, hi = [], [], [], []
        for name in self.feature_names:
            is_delta, sig = split_feature(name)
            kind, i = signal_index(spec, sig)
            idx.append(i if kind == "y" else self.n_y + i)
            delta.append(is_delta)
            lo.append(-math.inf)
            hi.append(math.inf)
        self.feature_index = np.array(idx, dtype=np.intp)
        self.feature_delta = np.array(delta, dtype=bool)

    def new_plant(self) -> Plant:
        """A fresh Plant instance in the scenario's initial state (its own arrays and work)."""
        plant = Plant(self.plant_model, self.scenario.plant.substeps, dt=self.dt_plant)
        plant.restore(self.snapshot0)
        plant.u[:] = self.u0
        return plant

    @property
    def seed(self) -> int:
        return int(self.scenario.loop.seed)

    def gaps(self, seed: int) -> GapPipeline:
        """A gap pipeline for this scenario (identity without [gaps]); plant draws relative to p0."""
        return GapPipeline.build(self.scenario.gaps, self.spec, self.step_s, seed, base_params=self.p0.copy())

    @staticmethod
    def reseed(gaps: GapPipeline, seed: int) -> None:
        """Point a pipeline at another seed (its draws and streams; the layout is unchanged)."""
        gaps.seed = int(seed)
        gaps.plant_randomizer.seed = int(seed)

    def begin_episode(self, gaps: GapPipeline, seed: int, episode: int, p: np.ndarray) -> dict:
        """Reset the gaps for (seed, episode) and draw its parameters into p, in hil/runtime.py's
        order (reset, then randomize). Returns the draws ({"plant.<param>": v, "gaps....": v})."""
        self.reseed(gaps, seed)
        p[:] = self.p0
        gaps.reset(episode)
        return gaps.randomize(p, episode)
