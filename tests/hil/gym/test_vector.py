"""hil.gym.HilVectorEnv: N instances in one prange call, each bit for bit the single env."""

import numpy as np
import pytest

pytest.importorskip("gymnasium")

import hil.gym  # noqa: E402
from tests.hil.gym.helpers import CONFIG  # noqa: E402


def _policy(obs, names, k):
    """A deterministic, state-dependent action (so a wrong observation changes the actions)."""
    do = obs[..., 0]
    agit = np.clip(30.0 + 0.5 * (40.0 - do) + 3.0 * np.sin(0.05 * k), 0.0, 80.0)
    base = np.full_like(agit, 0.0003 + 0.0001 * np.cos(0.1 * k))
    cols = {"agitation_power": agit, "base_flow": base}
    return np.stack([cols[n] for n in names], axis=-1)


@pytest.mark.parametrize("parallel", [False, True])
def test_every_instance_is_the_single_env_bit_for_bit_across_autoresets(parallel):
    n_env, steps, episode_s = 3, 130, 50.0  # two autoresets inside the run
    venv = hil.gym.make_vec(CONFIG, n_env, episode_s=episode_s, parallel=parallel)
    assert venv.parallel is parallel
    env = hil.gym.make(CONFIG, episode_s=episode_s)
    obs_v, info_v = venv.reset(seed=11)
    assert list(info_v["seed"]) == [11, 12, 13]
    hist = [(obs_v.copy(), None, None, None, None)]
    for k in range(steps):
        obs_v, r, term, trunc, info = venv.step(_policy(obs_v, venv.action_names, k))
        hist.append((obs_v.copy(), r.copy(), term.copy(), trunc.copy(), info["x"].copy()))
    for i in range(n_env):
        obs, _ = env.reset(seed=11 + i)
        np.testing.assert_array_equal(obs, hist[0][0][i])
        done = False
        for k in range(steps):
            if done:  # NEXT_STEP autoreset: this step of the vector env was the reset
                obs, _ = env.reset()
                done = False
                np.testing.assert_array_equal(obs, hist[k + 1][0][i])
                assert hist[k + 1][1][i] == 0.0 and not hist[k + 1][2][i] and not hist[k + 1][3][i]
                continue
            obs, r, term, trunc, info = env.step(_policy(obs, env.action_names, k))
            np.testing.assert_array_equal(obs, hist[k + 1][0][i])
            np.testing.assert_array_equal(info["x"], hist[k + 1][4][i])
            assert r == hist[k + 1][1][i] and term == hist[k + 1][2][i] and trunc == hist[k + 1][3][i]
            done = term or trunc
    assert venv.episodes.tolist() == [2, 2, 2]


def test_instances_are_randomized_and_reset_mask_resets_only_those():
    venv = hil.gym.make_vec(CONFIG, 8, episode_s=20.0)
    venv.reset(seed=0)
    mu = venv.P[:, venv.model.spec.index("params", "mu_x")]
    assert np.unique(mu).size == 8  # each instance its own draw
    a = np.tile(venv.single_action_space.high * 0.3, (8, 1))
    for _ in range(5):
        venv.step(a)
    mask = np.zeros(8, bool)
    mask[[1, 6]] = True
    venv.reset(options={"reset_mask": mask})
    assert venv.K.tolist() == [5, 0, 5, 5, 5, 5, 0, 5]
    assert venv.episodes.tolist() == [0, 1, 0, 0, 0, 0, 1, 0]


def test_non_finite_action_holds_the_applied_value_and_is_counted():
    venv = hil.gym.make_vec(CONFIG, 2, episode_s=20.0)
    venv.reset(seed=0)
    a = np.tile(venv.single_action_space.high * 0.3, (2, 1))
    venv.step(a)
    a[1, :] = np.nan
    _, _, _, _, info = venv.step(a)
    assert info["clipped"].tolist() == [0, 2]
    assert np.isfinite(venv.Uapp).all()
