"""hil.gym.SafetyWrapper: the scenario's projection and fallback in the training loop."""

import numpy as np
import pytest

pytest.importorskip("gymnasium")

import hil.gym  # noqa: E402
from tests.hil.gym.helpers import CONFIG  # noqa: E402


def _act(env, agitation, base):
    vals = {"agitation_power": agitation, "base_flow": base}
    return np.array([vals[n] for n in env.unwrapped.action_names])


def test_projection_limits_what_the_plant_gets_and_interventions_are_counted_per_episode():
    env = hil.gym.make(CONFIG, safety=True, episode_s=40.0)
    base = env.unwrapped
    i_ag = base.model.spec.index("inputs", "agitation_power")
    i_vol = base.model.spec.index("states", "volume")
    obs, info = env.reset(seed=3)
    assert info["interventions"] == {"projected": 0, "fallback": 0, "alarms": 0, "rollbacks": 0}
    for k in range(20):
        prev_applied = base.u_app[i_ag]
        obs, r, term, trunc, info = env.step(_act(env, 80.0, 0.0003))  # 80 W: box ok, rate and shear not
        # the command the loop received is inside the rate limit (2 W/s from the applied value)
        # and the shear limit (0.6 W per litre of broth)
        assert info["u_cmd"][i_ag] <= prev_applied + 2.0 + 1e-9
        assert info["u_cmd"][i_ag] <= 0.6 * info["x"][i_vol] + 1e-9
        assert info["safety"]["projected"] and info["safety"]["source"] == "policy"
        assert any(e.get("clips") for e in info["safety"]["events"])
    assert info["interventions"]["projected"] == 20 and info["interventions"]["fallback"] == 0
    env.reset()
    _, _, _, _, info = env.step(_act(env, 13.5, 0.0003))  # inside every limit
    assert info["interventions"]["projected"] == 0 and not info["safety"]["projected"]


def test_a_silent_policy_gets_the_baseline_and_each_fallback_step_is_counted():
    env = hil.gym.make(CONFIG, safety=True, episode_s=40.0)
    env.reset(seed=3)
    for _ in range(5):
        _, _, _, _, info = env.step(_act(env, np.nan, np.nan))
        assert info["safety"]["source"] == "baseline:silent"
        assert np.isfinite(info["u_cmd"]).all()
        np.testing.assert_array_equal(info["u_cmd"][env.unwrapped.model.action_index], info["safety"]["action"])
    assert info["interventions"]["fallback"] == 5


def test_without_the_wrapper_the_same_action_reaches_the_plant_unprojected():
    env = hil.gym.make(CONFIG, episode_s=40.0)
    env.reset(seed=3)
    i_ag = env.unwrapped.model.spec.index("inputs", "agitation_power")
    _, _, _, _, info = env.step(_act(env, 80.0, 0.0003))
    assert info["u_cmd"][i_ag] == 80.0
