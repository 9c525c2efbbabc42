"""Entry-point policies for tests (module:attribute targets). Features: the scenario's
[policy].features; actions: base_flow, agitation_power (the bioreactor policy scenario)."""

import math

import numpy as np

NOMINAL = np.array([0.0003, 13.0])


def constant(x):
    """A callable policy: the nominal action, whatever it sees."""
    return NOMINAL.copy()


class Reversed:
    """An object policy whose actions come in the other order (agitation, base)."""

    actions = ["agitation_power", "base_flow"]

    def act(self, x):
        return np.array([13.0, 0.0003])


class Ensemble:
    """An object with act_members: three members that agree."""

    def act_members(self, x):
        return np.array([[0.0003, 12.0], [0.0003, 13.0], [0.0003, 14.0]])

    def act(self, x):
        return self.act_members(x).mean(axis=0)


def nan_after_first(x, _state={"n": 0}):
    _state["n"] += 1
    return NOMINAL.copy() if _state["n"] == 1 else np.array([math.nan, 13.0])


def wrong_shape(x):
    return np.array([0.0003, 13.0, 1.0])


def raises(x):
    raise RuntimeError("policy bug")


def nan_policy(x):
    return np.array([math.nan, math.nan])
