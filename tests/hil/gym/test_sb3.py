"""hil.gym.sb3: hil's vector env as a Stable-Baselines3 VecEnv: SB3's own checks, its same-step
autoreset with `terminal_observation`, instances still bit for bit the single env, and PPO
training through it for a few thousand steps."""

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("torch")

import hil.gym  # noqa: E402
from hil.gym.sb3 import make_sb3_vec  # noqa: E402
from tests.hil.gym.helpers import CONFIG  # noqa: E402


def _action(env):
    a = np.array([0.0005, 25.0])[:: 1 if env.action_names[0] == "base_flow" else -1]
    return np.clip(a, env.action_space.low, env.action_space.high)


def test_same_step_autoreset_and_instances_are_the_single_env():
    """Episodes of 30 steps: at the done step SB3 gets the new episode's first observation, the
    last one in terminal_observation; both equal what the single env gives for that seed."""
    venv = make_sb3_vec(CONFIG, 2, episode_s=30.0, parallel=False)
    env = hil.gym.make(CONFIG, episode_s=30.0)
    a = _action(env)
    venv.seed(7)
    obs = venv.reset()
    ref0, _ = env.reset(seed=7)
    assert np.array_equal(obs[0], ref0)
    ref = [ref0]
    for _ in range(30):
        o, _, term, trunc, _ = env.step(a)
        ref.append(o)
    ref_next, _ = env.reset()  # episode 1 of seed 7
    got = [obs[0]]
    for k in range(30):
        obs, rew, dones, infos = venv.step(np.tile(a, (2, 1)))
        assert rew.dtype == np.float32 and dones.dtype == bool and len(infos) == 2
        if k < 29:
            assert not dones.any()
            got.append(obs[0])
    assert dones.all() and all(i["TimeLimit.truncated"] for i in infos)
    assert np.array_equal(infos[0]["terminal_observation"], ref[30])
    assert np.array_equal(np.array(got), np.array(ref[:30]))
    assert np.array_equal(obs[0], ref_next) and infos[0]["episode_index"] == 0  # info of the ended episode
    obs, _, dones, infos = venv.step(np.tile(a, (2, 1)))  # the new episode steps at once (no reset step)
    assert not dones.any() and infos[0]["episode_index"] == 1 and infos[0]["t_s"] == pytest.approx(1.0)


def test_ppo_trains_through_the_adapter():
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_checker import check_env  # noqa: F401  (single envs only)
    from stable_baselines3.common.vec_env import VecNormalize

    venv = VecNormalize(make_sb3_vec(CONFIG, 4, episode_s=120.0, parallel=False))
    venv.seed(0)
    model = PPO("MlpPolicy", venv, n_steps=256, batch_size=256, n_epochs=2, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=2048)
    assert model.num_timesteps >= 2048
    assert np.isfinite(venv.obs_rms.mean).all() and np.isfinite(venv.obs_rms.var).all()
    obs = venv.reset()
    act, _ = model.predict(obs, deterministic=True)
    assert act.shape == (4, len(venv.venv.venv.action_names)) and np.isfinite(act).all()
