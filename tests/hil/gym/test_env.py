"""hil.gym.HilEnv: the Gymnasium contract, seeding, and the lockstep loop's trajectory bit for bit."""

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

import hil.gym  # noqa: E402
from hil.errors import ConfigError  # noqa: E402
from tests.hil.gym.helpers import CONFIG, runtime_replay  # noqa: E402


def _rollout(env, seed, actions):
    obs, info = env.reset(seed=seed)
    rows = [(obs, info)]
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        rows.append((obs, info, r, term, trunc))
        if term or trunc:
            break
    return rows


def _actions(env, n, seed=0):
    rng = np.random.default_rng(seed)
    lo, hi = env.action_space.low, env.action_space.high
    # around the operating point, inside the bounds: base 0..1 mL/h, agitation 10..40 W
    base = rng.uniform(0.0, 0.001, n)
    agit = rng.uniform(10.0, 40.0, n)
    a = np.stack([base, agit], axis=1)
    assert env.action_names == ["agitation_power", "base_flow"] or env.action_names == ["base_flow", "agitation_power"]
    if env.action_names[0] == "agitation_power":
        a = a[:, ::-1]
    return np.clip(a, lo, hi)


def test_passes_gymnasium_env_checker():
    from gymnasium.utils.env_checker import check_env

    env = hil.gym.make(CONFIG, episode_s=60.0)
    check_env(env, skip_render_check=True)


def test_episode_is_reproducible_from_its_seed_bit_for_bit():
    env = hil.gym.make(CONFIG, episode_s=300.0)
    acts = _actions(env, 300)
    a = _rollout(env, 7, acts)
    env.reset(seed=99)  # something else in between
    env.reset()
    b = _rollout(env, 7, acts)
    c = _rollout(env, 8, acts)
    assert len(a) == len(b) == 301
    for ra, rb in zip(a, b):
        np.testing.assert_array_equal(ra[0], rb[0])
        np.testing.assert_array_equal(ra[1]["x"], rb[1]["x"])
    # another seed: other draws, other trajectory
    assert a[0][1]["randomized"] != c[0][1]["randomized"]
    assert not np.array_equal(a[-1][1]["x"], c[-1][1]["x"])
    # episodes of one seed differ from each other and come back with the seed
    env.reset(seed=7)
    _, i1 = env.reset()
    env.reset(seed=7)
    _, i1b = env.reset()
    assert i1["episode_index"] == 1 and i1["randomized"] == i1b["randomized"] != a[0][1]["randomized"]


def test_trajectory_matches_the_lockstep_runtime_recording(tmp_path):
    """The env's states, true and measured outputs and applied inputs equal, bit for bit, what
    hil.runtime.Runtime records in lockstep for the same scenario, seed and commands (every
    gap on, randomized parameters and gap draws of episode 0)."""
    n, seed = 240, 5
    env = hil.gym.make(CONFIG, episode_s=float(n))
    acts = _actions(env, n, seed=1)
    rows = _rollout(env, seed, acts)
    assert len(rows) == n + 1 and rows[-1][4]  # truncated at the episode length
    df, summary = runtime_replay(acts, env.action_names, seed, 1.0, tmp_path / "rec")
    assert summary.extra["randomized"] == rows[0][1]["randomized"]
    spec = env.unwrapped.model.spec
    assert len(df) == n
    for k in range(n):
        info = rows[k + 1][1]
        rec = df.iloc[k]
        np.testing.assert_array_equal(info["x"], rec[[f"x.{s}" for s in spec.names("states")]].to_numpy(float))
        np.testing.assert_array_equal(info["y"], rec[[f"y.{s}" for s in spec.names("outputs")]].to_numpy(float))
        np.testing.assert_array_equal(info["u_applied"], rec[[f"app.{s}" for s in spec.names("inputs")]].to_numpy(float))
        meas = rec[[f"meas.{s}" for s in spec.names("outputs")]].to_numpy(float)
        m = env.unwrapped.model
        obs = rows[k + 1][0]
        # the observation's plain features are the recorded measured outputs / applied inputs
        full = np.concatenate([meas, info["u_applied"]])
        plain = ~m.feature_delta
        np.testing.assert_array_equal(obs[plain], full[m.feature_index[plain]])


def test_terminated_on_a_safety_stop_kept_apart_from_truncated():
    env = hil.gym.make(CONFIG, episode_s=3600.0, limits={"dissolved_oxygen": [30.0, 100.0]},
                       terminal_reward=-500.0)
    env.reset(seed=1)
    a = np.zeros(2)  # no agitation, no base: the DO falls below 30 %
    for k in range(3600):
        obs, r, term, trunc, info = env.step(a)
        if term or trunc:
            break
    assert term and not trunc
    assert info["stop"] == ["limit dissolved_oxygen"] and info["y"][env.unwrapped.model.spec.index("outputs", "dissolved_oxygen")] < 30.0
    assert r < -400.0
    env2 = hil.gym.make(CONFIG, episode_s=30.0)
    env2.reset(seed=1)
    for _ in range(30):
        _, _, term, trunc, _ = env2.step(np.array([0.0003, 30.0]) if env2.action_names[0] == "base_flow" else np.array([30.0, 0.0003]))
    assert trunc and not term


def test_reward_is_the_scenario_kpi_expression():
    env = hil.gym.make(CONFIG, episode_s=10.0, reward="-abs(y.dissolved_oxygen - 40.0) - 2.0 * du.agitation_power")
    env.reset(seed=2)
    m = env.unwrapped.model
    i_do = m.spec.index("outputs", "dissolved_oxygen")
    i_ag = m.spec.index("inputs", "agitation_power")
    prev = env.unwrapped.u_app[i_ag]
    _, r, _, _, info = env.step(env.action_space.high * 0.5)
    want = -abs(info["y"][i_do] - 40.0) - 2.0 * (info["u_applied"][i_ag] - prev)
    assert r == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("reward, why", [
    ("__import__('os').system('true')", "unknown function"),
    ("[1, 2]", "not allowed"),
    ("y.no_such_output", "no output"),
    ("open('x')", "unknown function"),
    ("y.dissolved_oxygen.real", "unknown signal block"),
    ("1 +", "not an expression"),
])
def test_reward_expression_is_validated_not_evaluated(reward, why):
    with pytest.raises(ConfigError) as exc:
        hil.gym.make(CONFIG, reward=reward)
    assert "gym.reward" in str(exc.value) and why in str(exc.value)


def test_gym_section_errors_name_the_key():
    with pytest.raises(ConfigError) as exc:
        hil.gym.make(CONFIG, observation=["dissolved_oxygen", "nope"], limits={"ph": [7.0, 6.0]},
                     episode_s=10.5)
    text = str(exc.value)
    assert "gym.observation[1]" in text and "gym.limits.ph" in text and "gym.episode_s" in text


def test_registered_id_builds_the_same_env_through_gymnasium_make():
    env_id = hil.gym.register()
    env = gym.make(env_id, path=str(CONFIG), episode_s=20.0)
    direct = hil.gym.make(CONFIG, episode_s=20.0)
    o1, _ = env.reset(seed=4)
    o2, _ = direct.reset(seed=4)
    np.testing.assert_array_equal(o1, o2)
    a = direct.action_space.low + 0.2 * (direct.action_space.high - direct.action_space.low)
    for _ in range(5):
        r1 = env.step(a)
        r2 = direct.step(a)
    np.testing.assert_array_equal(r1[0], r2[0])
    assert r1[1] == r2[1]


def test_a_scenario_without_bus_inputs_is_refused_with_the_reason():
    with pytest.raises(ConfigError) as exc:
        hil.gym.make(CONFIG.parent / "bioreactor_gaps.toml")
    assert "driver = 'bus'" in str(exc.value)
