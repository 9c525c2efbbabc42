"""`hil policy import`: a Stable-Baselines3 model trained on a scenario's gym env becomes a hil
policy version whose actions are SB3's deterministic `predict` on the same observations (its
VecNormalize statistics and action mapping folded in), checkable with `hil policy check`; a model
that does not fit the scenario is refused with the reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("torch")

import hil.gym  # noqa: E402
from hil.gym.sb3 import make_sb3_vec  # noqa: E402
from hil.policy.loader import load_version  # noqa: E402
from hil.policy.store import PolicyStore  # noqa: E402
from tests.hil.gym.helpers import CONFIG  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hil.cli", "policy", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def _observations(n=300, seed=11):
    """Observations the env really gives (a random-action rollout)."""
    env = hil.gym.make(CONFIG, episode_s=600.0)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out = []
    for _ in range(n):
        out.append(obs)
        obs, _, term, trunc, _ = env.step(rng.uniform(env.action_space.low, env.action_space.high))
        if term or trunc:
            obs, _ = env.reset()
    return np.array(out), env


def test_ppo_with_vecnormalize_imports_and_acts_as_sb3_predicts(tmp_path):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    venv = VecNormalize(make_sb3_vec(CONFIG, 2, episode_s=120.0, parallel=False), clip_obs=5.0)
    venv.seed(0)
    model = PPO("MlpPolicy", venv, n_steps=128, batch_size=128, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"net_arch": [64, 64]})
    model.learn(total_timesteps=512)
    model.save(tmp_path / "ppo.zip")
    venv.save(str(tmp_path / "vecnormalize.pkl"))
    r = _cli("import", str(tmp_path / "ppo.zip"), str(CONFIG), "--out", str(tmp_path / "pol"),
             "--vecnormalize", str(tmp_path / "vecnormalize.pkl"), "--rollout-steps", "200")
    assert r.returncode == 0, r.stderr
    store = PolicyStore(tmp_path / "pol")
    assert store.versions() == ["v1"] and not store.known_good("v1")
    pol = load_version(store, "v1")
    obs, env = _observations()
    assert pol.features == env.feature_names and pol.actions == env.action_names
    want, _ = model.predict(venv.normalize_obs(obs), deterministic=True)
    got = np.array([pol.act(o) for o in obs])
    span = env.action_space.high - env.action_space.low
    assert np.max(np.abs(got - want) / span) < 1e-6  # float32 network vs its float64 copy (issue 25 goal)
    assert np.ptp(got, axis=0).max() > 0  # the network is not constant on these observations
    mean, cov = store.stats("v1")
    assert mean.shape == (len(pol.features),) and cov.shape == (len(pol.features),) * 2
    # checkable as any policy directory
    r = _cli("check", str(ROOT / "configs" / "bioreactor_gym.toml"), "--policy", str(tmp_path / "pol"),
             "--version", "v1")
    assert r.returncode == 0 and r.stdout.startswith("v1 (mlp)"), r.stderr


def test_sac_imports_with_its_squashed_actions(tmp_path):
    from stable_baselines3 import SAC

    venv = make_sb3_vec(CONFIG, 1, episode_s=120.0, parallel=False)
    model = SAC("MlpPolicy", venv, learning_starts=50, batch_size=32, seed=0, device="cpu",
                policy_kwargs={"net_arch": [32, 32]})
    model.learn(total_timesteps=120)
    model.save(tmp_path / "sac.zip")
    r = _cli("import", str(tmp_path / "sac.zip"), str(CONFIG), "--out", str(tmp_path / "pol"),
             "--rollout-steps", "50", "--algo", "sac", "--heads", "0")
    assert r.returncode == 0, r.stderr
    pol = load_version(PolicyStore(tmp_path / "pol"), "v1")
    obs, env = _observations(100)
    want, _ = model.predict(obs, deterministic=True)
    got = np.array([pol.act(o) for o in obs])
    span = env.action_space.high - env.action_space.low
    assert np.max(np.abs(got - want) / span) < 1e-6


def test_a_model_that_does_not_fit_the_scenario_is_refused(tmp_path):
    from stable_baselines3 import PPO

    venv = make_sb3_vec(CONFIG, 1, episode_s=60.0, parallel=False, observation=["dissolved_oxygen", "ph"])
    PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, device="cpu").save(tmp_path / "small.zip")
    r = _cli("import", str(tmp_path / "small.zip"), str(CONFIG), "--out", str(tmp_path / "pol"))
    assert r.returncode != 0 and "observes (2,)" in r.stderr and "features" in r.stderr
    assert not (tmp_path / "pol").exists()


def test_train_import_and_shadow_run_in_hil(tmp_path):
    """The road end to end at a small scale: PPO trained through the SB3 adapter, imported,
    run in HIL in shadow mode over the bus; what the policy process proposed on every step is
    SB3's own deterministic action on the features the loop published (to float32 rounding)."""
    import json

    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    from hil.gym.deploy import shadow_run
    from hil.policy.features import FeatureMap
    from hil.recorder import read_recording

    venv = VecNormalize(make_sb3_vec(CONFIG, 2, episode_s=120.0, parallel=False))
    venv.seed(1)
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=1, device="cpu")
    model.learn(total_timesteps=256)
    model.save(tmp_path / "ppo.zip")
    venv.save(str(tmp_path / "vecnormalize.pkl"))
    r = _cli("import", str(tmp_path / "ppo.zip"), str(CONFIG), "--out", str(tmp_path / "pol"),
             "--vecnormalize", str(tmp_path / "vecnormalize.pkl"), "--rollout-steps", "100")
    assert r.returncode == 0, r.stderr
    res = shadow_run(CONFIG, tmp_path / "pol", "v1", duration_s=20.0, workdir=tmp_path / "shadow")
    c = res["comparison"]
    assert res["summary"]["steps"] == 20 and c["modes"] == ["shadow"] and c["proposals"] >= 18
    assert c["shadow_gate"]["passed"] is not None or c["shadow_gate"]["reasons"]  # a verdict or why not
    pol = load_version(PolicyStore(tmp_path / "pol"), "v1")
    spec = hil.gym.make(CONFIG).model.spec
    df = read_recording(tmp_path / "shadow" / "rec")
    fmap = FeatureMap(spec, pol.features)
    dec = [json.loads(line) for line in open(tmp_path / "shadow" / "decisions.jsonl")]
    # the decision log's action order (its start event) and the env's (SB3's) map by name
    log_names = next(d["actions"] for d in dec if d.get("event") == "start")
    to_log = [pol.actions.index(n) for n in log_names]
    span = np.array([spec.quantity("inputs", n).high - spec.quantity("inputs", n).low for n in log_names])
    checked = 0
    for d in dec:
        if d.get("event") != "decision" or d.get("proposal") is None:
            continue
        k = d["step"]
        y = df.loc[k, [f"meas.{n}" for n in spec.names("outputs")]].to_numpy(float)
        u = df.loc[k, [f"app.{n}" for n in spec.names("inputs")]].to_numpy(float)
        f = fmap.build(y, u)
        if not np.isfinite(f).all():
            continue
        want, _ = model.predict(venv.normalize_obs(f[None, :]), deterministic=True)
        assert np.max(np.abs(np.asarray(d["proposal"]) - want[0][to_log]) / span) < 1e-6, (k, d["proposal"], want)
        checked += 1
    assert checked >= 15
