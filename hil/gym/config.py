"""The `[gym]` section of a scenario: what a Gymnasium env over it rewards, observes and stops on.

    [gym]
    episode_s = 3600.0                 # simulated s per episode: then `truncated`
    reward = "-((y.dissolved_oxygen - 40) / 10)**2 - 100 * u.feed_rate"   # hil/gym/expr.py
    observation = ["dissolved_oxygen", "ph", "d.dissolved_oxygen", "u.agitation_power"]
                                       # features (hil/policy/features.py); default: the bus
                                       # observation, every measured output then every applied input
    limits = { dissolved_oxygen = [5.0, 150.0] }   # true output or state outside: `terminated`
    terminal_reward = -100.0           # added on the step that terminates
    state_bounds = true                # a state outside its physical bounds terminates too
    bad_observation = "hold"           # what a Bad (dropped-out, NaN) measured output becomes in the
                                       # observation: "hold" its last good value, "substitute"
                                       # ([gym].bad_substitute, the others held) or "nan" (the bus's
                                       # raw convention; a learner's statistics will see NaN)
    bad_substitute = { ph = 7.0 }      # plant units, with bad_observation = "substitute"

Validated like every section (ConfigError with the key path): unknown keys, names that are no
signal of the plant, an expression outside the grammar, empty or inverted limits.
Importing this module does not import gymnasium (scenarios validate without the extra).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from hil.scenario.config import StrictModel
from hil.errors import ConfigError


class GymSection(StrictModel):
    episode_s: float = Field(default=3600.0, gt=0, description="simulated s per episode (then truncated)")
    reward: str = Field(default="0", min_length=1, max_length=4000, description="KPI expression (hil/gym/expr.py)")
    observation: list[str] | None = Field(default=None, description="feature names; default the bus observation")
    limits: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="true output/state name -> [low, high] in plant units; outside: terminated")
    terminal_reward: float = Field(default=0.0, description="reward added on the terminating step")
    state_bounds: bool = Field(default=True, description="a state outside its spec bounds terminates the episode")
    bad_observation: Literal["hold", "substitute", "nan"] = Field(
        default="hold", description="a Bad (NaN) measured output in the observation: hold its last good value, "
                                    "a bad_substitute value, or NaN")
    bad_substitute: dict[str, float] = Field(
        default_factory=dict, description="measured output -> value (plant units) with bad_observation = 'substitute'")

    @field_validator("episode_s", "terminal_reward")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"{v} is not finite")
        return v

    def validate_against(self, spec, scenario) -> list[tuple[str, str]]:
        from hil.bus.config import bus_input_names
        from hil.gym.expr import Expression
        from hil.safety.config import signal_index
        from hil.policy.features import split_feature

        problems: list[tuple[str, str]] = []
        try:
            Expression(self.reward, spec)
        except ConfigError as exc:
            problems += exc.problems if getattr(exc, "problems", None) else [("gym.reward", str(exc))]
        for i, name in enumerate(self.observation or ()):
            try:
                signal_index(spec, split_feature(name)[1])
            except KeyError as exc:
                problems.append((f"gym.observation[{i}]", str(exc.args[0])))
        if self.observation is not None and not self.observation:
            problems.append(("gym.observation", "an empty observation: leave the key out for the bus observation"))
        for name, (lo, hi) in self.limits.items():
            key = f"gym.limits.{name}"
            if name not in spec.names("outputs") and name not in spec.names("states"):
                problems.append((key, f"{spec.name} has no output or state {name!r}"))
            if not (lo <= hi) or math.isnan(lo) or math.isnan(hi):
                problems.append((key, f"[{lo}, {hi}] is not an interval (low <= high)"))
        for name in self.bad_substitute:
            if name not in spec.names("outputs"):
                problems.append((f"gym.bad_substitute.{name}", f"{spec.name} has no output {name!r}"))
        if self.bad_substitute and self.bad_observation != "substitute":
            problems.append(("gym.bad_substitute", f"given, but bad_observation = {self.bad_observation!r} "
                                                   "(set it to 'substitute')"))
        if not bus_input_names(scenario, spec):
            problems.append(("gym", "no input has driver = 'bus': the env's action is the bus-driven inputs"))
        steps = self.episode_s / scenario.loop.step_s
        if abs(steps - round(steps)) > 1e-9 * max(1.0, steps):
            problems.append(("gym.episode_s", f"{self.episode_s} s is not a whole number of loop.step_s "
                                              f"({scenario.loop.step_s} s)"))
        return problems
