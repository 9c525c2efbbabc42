"""hil.gym: what a Bad measured output (a "bad" sensor dropout, NaN on the bus) becomes in the
observation ([gym].bad_observation), the env's `info` beside gymnasium's wrappers, and make()'s
arguments validated."""

import math

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

import hil.gym  # noqa: E402
from hil.errors import ConfigError  # noqa: E402
from tests.hil.gym.helpers import CONFIG  # noqa: E402

# pH reads NaN for 20 of every ~50 s: a dropout in "bad" mode, often enough to see in 600 s
BAD_PH = {"sensors": {"ph": {"dropout_rate_per_s": 0.02, "dropout_duration_s": 20.0, "dropout_mode": "bad"}}}


def _episode(env, n=600, seed=3):
    obs, info = env.reset(seed=seed)
    a = np.clip(np.array([0.0005, 25.0])[:: 1 if env.action_names[0] == "base_flow" else -1],
                env.action_space.low, env.action_space.high)
    out = [(obs, info)]
    for _ in range(n):
        obs, _, term, trunc, info = env.step(a)
        out.append((obs, info))
        if term or trunc:
            break
    return out


def _ph_feature(env):
    return env.feature_names.index("ph")


def test_default_holds_the_last_good_value_and_info_says_which_output_was_bad():
    env = hil.gym.make(CONFIG, episode_s=600.0, gaps=BAD_PH)
    rows = _episode(env)
    j = _ph_feature(env)
    i_ph = list(env.model.spec.names("outputs")).index("ph")
    bad = np.array([info["bad_outputs"][i_ph] for _, info in rows])
    assert bad.sum() >= 20 and (~bad).sum() >= 20  # dropouts happened, and good readings too
    obs = np.array([o for o, _ in rows])
    assert np.isfinite(obs).all()  # no NaN reaches the learner
    # while Bad, the observation is the last good reading
    for k in np.flatnonzero(bad):
        if k > 0:
            assert obs[k, j] == obs[k - 1, j]
    # the raw measured values really were NaN there (the env's own measured outputs)
    raw = hil.gym.make(CONFIG, episode_s=600.0, gaps=BAD_PH, bad_observation="nan")
    raw_obs = np.array([o for o, _ in _episode(raw)])
    assert np.isnan(raw_obs[bad, j]).all() and np.isfinite(raw_obs[~bad, j]).all()
    assert np.array_equal(raw_obs[~bad, j], obs[~bad, j])


def test_substitute_puts_the_configured_value_while_bad():
    env = hil.gym.make(CONFIG, episode_s=600.0, gaps=BAD_PH, bad_observation="substitute",
                       bad_substitute={"ph": 99.0})
    rows = _episode(env)
    j = _ph_feature(env)
    i_ph = list(env.model.spec.names("outputs")).index("ph")
    bad = np.array([info["bad_outputs"][i_ph] for _, info in rows])
    obs = np.array([o for o, _ in rows])
    assert bad.any() and (obs[bad, j] == 99.0).all() and (obs[~bad, j] != 99.0).all()


def test_vector_env_instance_equals_the_single_env_with_bad_outputs():
    venv = hil.gym.make_vec(CONFIG, 2, episode_s=600.0, gaps=BAD_PH, parallel=False)
    env = hil.gym.make(CONFIG, episode_s=600.0, gaps=BAD_PH)
    single = _episode(env, n=300, seed=5)
    obs, info = venv.reset(seed=5)
    a = np.clip(np.array([0.0005, 25.0])[:: 1 if env.action_names[0] == "base_flow" else -1],
                env.action_space.low, env.action_space.high)
    got = [obs[0].copy()]
    bads = [info["bad_outputs"][0].copy()]
    for _ in range(300):
        obs, _, _, _, info = venv.step(np.tile(a, (2, 1)))
        got.append(obs[0].copy())
        bads.append(info["bad_outputs"][0].copy())
    assert np.array_equal(np.array(got), np.array([o for o, _ in single]))
    assert np.array_equal(np.array(bads), np.array([i["bad_outputs"] for _, i in single]))
    assert np.array(bads).any()


def test_record_episode_statistics_wraps_the_env():
    from gymnasium.wrappers import RecordEpisodeStatistics

    env = RecordEpisodeStatistics(hil.gym.make(CONFIG, episode_s=60.0))
    _, info = env.reset(seed=1)
    assert "episode" not in info and info["episode_index"] == 0
    done, steps = False, 0
    while not done:
        _, _, term, trunc, info = env.step(env.action_space.sample() * 0 + env.action_space.low)
        done, steps = term or trunc, steps + 1
    assert info["episode"]["l"] == steps  # the wrapper's own statistics


def test_make_refuses_a_safety_dict_and_unknown_overrides_by_name():
    with pytest.raises(TypeError, match="overrides=.*safety"):
        hil.gym.make(CONFIG, safety={"mode": "shadow"})
    with pytest.raises(ConfigError) as err:
        hil.gym.make(CONFIG, episode_seconds=60.0)
    assert "episode_seconds" in str(err.value)
    with pytest.raises(ConfigError) as err:
        hil.gym.make(CONFIG, loop=3)
    assert "loop" in str(err.value)
    with pytest.raises(ConfigError) as err:
        hil.gym.make(CONFIG, bad_observation="zero")
    assert "gym.bad_observation" in str(err.value)
    with pytest.raises(ConfigError) as err:
        hil.gym.make(CONFIG, bad_substitute={"ph": 7.0})  # without bad_observation = "substitute"
    assert "gym.bad_substitute" in str(err.value)
    # the [safety] section is overridden through overrides= (and the wrapper flag stays a bool)
    env = hil.gym.make(CONFIG, safety=True, overrides={"safety": {"mode": "shadow"}}, episode_s=60.0)
    assert env.unwrapped.model.scenario.safety.mode == "shadow"
    assert math.isfinite(env.reset(seed=0)[0].sum())


def test_the_spaces_order_is_in_the_metadata():
    env = hil.gym.make(CONFIG, episode_s=60.0)
    venv = hil.gym.make_vec(CONFIG, 2, episode_s=60.0, parallel=False)
    for e in (env, venv):
        assert e.metadata["action_names"] == e.action_names and len(e.action_names) == e.action_space.shape[-1]
        assert e.metadata["observation_names"] == e.feature_names
    assert venv.metadata["autoreset_mode"] is not None  # gymnasium's own key kept
