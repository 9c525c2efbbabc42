"""Action and observation order as the scenario declares them (hil/gym/model.py), stated in the
env's metadata, in the single and the vector env: the [inputs] tables' order (not the plant
spec's), [policy].inputs first when it lists them, [gym].observation's order."""

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from hil.scenario.config import parse_scenario  # noqa: E402
from hil.gym.env import HilEnv  # noqa: E402
from hil.gym.vector import HilVectorEnv  # noqa: E402
from tests.hil.gym.helpers import raw_scenario  # noqa: E402


def _scenario(first: str, policy_inputs=None, observation=None):
    """The gym scenario with the [inputs] table `first` moved to the front."""
    data = raw_scenario()
    inputs = data["inputs"]
    data["inputs"] = {first: inputs[first], **{k: v for k, v in inputs.items() if k != first}}
    if policy_inputs is not None:
        data["policy"]["inputs"] = policy_inputs
    if observation is not None:
        data["gym"]["observation"] = observation
    data["gym"]["episode_s"] = 30.0
    return parse_scenario(data)


@pytest.mark.parametrize("first, want", [("base_flow", ["base_flow", "agitation_power"]),
                                         ("agitation_power", ["agitation_power", "base_flow"])])
def test_the_action_order_is_the_scenario_file_order(first, want):
    sc = _scenario(first)
    env = HilEnv(sc)
    assert env.action_names == want and env.metadata["action_names"] == want
    assert "file order" in env.metadata["action_order"]
    # each component reaches the input it names
    a = np.array([{"base_flow": 0.0007, "agitation_power": 33.0}[n] for n in want])
    env.reset(seed=0)
    _, _, _, _, info = env.step(a)
    spec = env.model.spec
    for n, v in zip(want, a):
        assert info["u_cmd"][spec.index("inputs", n)] == v
    venv = HilVectorEnv(sc, 2)
    assert venv.action_names == want and venv.metadata["action_names"] == want
    venv.close()


def test_the_shipped_gym_scenario_acts_in_its_file_order():
    env = HilEnv(parse_scenario(raw_scenario()))
    assert env.action_names == ["agitation_power", "base_flow"]  # configs/bioreactor_gym.toml's order


def test_policy_inputs_come_first_and_the_observation_keeps_its_declared_order():
    obs = ["ph", "u.base_flow", "dissolved_oxygen", "d.dissolved_oxygen"]
    env = HilEnv(_scenario("agitation_power", policy_inputs=["base_flow", "agitation_power"], observation=obs))
    assert env.action_names == ["base_flow", "agitation_power"]
    assert env.metadata["action_order"].startswith("[policy].inputs")
    assert env.feature_names == obs and env.metadata["observation_names"] == obs
    assert env.metadata["observation_order"] == "[gym].observation in file order"
    o, _ = env.reset(seed=0)
    o, *_ = env.step(np.array([0.0004, 20.0]))
    assert o[1] == pytest.approx(0.0004)  # u.base_flow where the scenario put it
