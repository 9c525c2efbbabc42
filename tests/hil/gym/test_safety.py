"""hil.gym.SafetyWrapper: the scenario's projection and fallback in the training loop, enforced by
the loop's compiled shield (hil/loop/shield.py) under the safety core as supervisor."""

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
    # step 0: nothing published yet, the supervisor has not spoken: the fallback acts (as in the loop)
    obs, r, term, trunc, info = env.step(_act(env, 80.0, 0.0003))
    assert info["safety"]["source"] == "fallback:supervisor_silent" and info["safety"]["supervisor"] is None
    for k in range(20):
        prev_applied = base.u_app[i_ag]
        obs, r, term, trunc, info = env.step(_act(env, 80.0, 0.0003))  # 80 W: box ok, rate and shear not
        # the command the loop received is inside the rate limit (2 W/s from the applied value)
        # and the shear limit (0.6 W per litre of broth)
        assert info["u_cmd"][i_ag] <= prev_applied + 2.0 + 1e-9
        assert info["u_cmd"][i_ag] <= 0.6 * info["x"][i_vol] + 1e-9
        assert info["safety"]["projected"] and info["safety"]["source"] == "projected"
        assert info["safety"]["supervisor"] == "policy" and info["safety"]["code"] == 1
        assert any(e.get("clips") for e in info["safety"]["events"])  # the supervisor's record of the clip
        np.testing.assert_array_equal(info["u_cmd"][env.unwrapped.model.action_index], info["safety"]["action"])
    assert info["interventions"]["projected"] == 20 and info["interventions"]["fallback"] == 1
    env.reset()
    env.step(_act(env, 13.5, 0.0003))
    _, _, _, _, info = env.step(_act(env, 13.5, 0.0003))  # inside every limit
    assert info["interventions"]["projected"] == 0 and not info["safety"]["projected"]
    assert info["safety"]["source"] == "policy"


def test_a_silent_policy_gets_the_baseline_and_each_fallback_step_is_counted():
    env = hil.gym.make(CONFIG, safety=True, episode_s=40.0)
    env.reset(seed=3)
    env.step(_act(env, np.nan, np.nan))  # step 0: the supervisor has not spoken
    for _ in range(5):
        _, _, _, _, info = env.step(_act(env, np.nan, np.nan))
        assert info["safety"]["source"] == "fallback:mode" and info["safety"]["supervisor"] == "baseline:silent"
        assert np.isfinite(info["u_cmd"]).all()
        np.testing.assert_array_equal(info["u_cmd"][env.unwrapped.model.action_index], info["safety"]["action"])
    assert info["interventions"]["fallback"] == 6


def test_the_fallback_that_acts_is_the_shields_compiled_pid():
    """A silent policy: the action is the shield's PID loop (FB_PID, the scenario's
    [[safety.fallback.loops]]), not a hold: it moves the agitation with the dissolved oxygen's
    error, and each step's action is the projection of the PID's output."""
    from hil.loop.shield import FB_PID, PS_ACTION

    env = hil.gym.make(CONFIG, safety=True, episode_s=60.0)
    env.reset(seed=4)
    wrapper = env
    while not hasattr(wrapper, "shield"):
        wrapper = wrapper.env
    sh = wrapper.shield
    assert (sh.fb_kind == FB_PID).all()
    ag = env.unwrapped.action_names.index("agitation_power")
    seen = set()
    for _ in range(30):
        _, _, _, _, info = env.step(_act(env, np.nan, np.nan))
        seen.add(round(float(info["safety"]["action"][ag]), 9))
        # tracked: the PID's output after the step is what was decided (bumpless)
        np.testing.assert_array_equal(sh.pid_state[:, PS_ACTION], info["safety"]["action"])
    assert len(seen) > 5, seen  # a hold would keep one value


def test_without_the_wrapper_the_same_action_reaches_the_plant_unprojected():
    env = hil.gym.make(CONFIG, episode_s=40.0)
    env.reset(seed=3)
    i_ag = env.unwrapped.model.spec.index("inputs", "agitation_power")
    _, _, _, _, info = env.step(_act(env, 80.0, 0.0003))
    assert info["u_cmd"][i_ag] == 80.0
