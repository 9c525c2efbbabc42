"""`hil policy import --residual-scale`: a residual PPO model (hil.gym.residual, its output a
correction to a PID block's command) imported as a hil policy acts, in the policy process's
arithmetic (hil/policy/residual.py), as the gym env's residual actions do on the same
observations, to 1e-6 of each action's range (issue 25's second goal): in the env step by step,
and in a HIL shadow run over the bus, replayed from the recording."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("torch")

import hil.gym  # noqa: E402
from hil.gym.residual import ResidualActions, make_residual_sb3_vec, open_loops  # noqa: E402
from hil.policy.loader import load_version  # noqa: E402
from hil.policy.store import PolicyStore  # noqa: E402
from tests.hil.gym.helpers import CONFIG  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SCALE = [0.05, 0.01]  # per action, the env's order (agitation_power, base_flow)
TOL = 1e-6  # of each action's range: SB3's float32 network against its float64 copy


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hil.cli", "policy", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A briefly trained residual PPO riding on the PID block with the pH loop open, its
    correction made large (the action net x 100) so that a wrong residual arithmetic shows."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    tmp = tmp_path_factory.mktemp("residual")
    fallback = open_loops(hil.gym.load(CONFIG).safety.fallback, ["base_flow"])
    venv = VecNormalize(make_residual_sb3_vec(CONFIG, 2, scale=SCALE, fallback=fallback, episode_s=120.0,
                                              parallel=False))
    venv.seed(2)
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=2, device="cpu")
    model.learn(total_timesteps=256)
    with torch.no_grad():
        model.policy.action_net.weight.mul_(100.0)
        model.policy.action_net.bias.mul_(100.0)
    model.save(tmp / "ppo.zip")
    venv.save(str(tmp / "vecnormalize.pkl"))
    r = _cli("import", str(tmp / "ppo.zip"), str(CONFIG), "--out", str(tmp / "pol"), "--vecnormalize",
             str(tmp / "vecnormalize.pkl"), "--rollout-steps", "200", "--residual-scale", "0.05,0.01",
             "--residual-open-loop", "base_flow")
    assert r.returncode == 0, r.stderr
    assert "residual on the PID block" in r.stdout
    return SimpleNamespace(tmp=tmp, model=model, venv=venv, fallback=fallback)


def _correction(t):
    def corr(obs):
        a, _ = t.model.predict(t.venv.normalize_obs(np.asarray(obs)), deterministic=True)
        return a
    return corr


def test_meta_records_the_residual_and_the_pid_it_rides_on(trained):
    store = PolicyStore(trained.tmp / "pol")
    meta = store.meta("v1")
    r = meta["residual"]
    env = hil.gym.make(CONFIG)
    span = env.action_space.high - env.action_space.low
    assert r["scale"] == SCALE and np.allclose(r["amplitude"], np.array(SCALE) * span, rtol=1e-15, atol=0)
    assert r["track"] is False and r["step_s"] == 1.0
    assert [lp["input"] for lp in r["fallback"]["loops"]] == ["agitation_power"]
    assert r["fallback"]["fixed"] == {"base_flow": 0.0003}  # the opened pH loop, held at its bias
    assert meta["uncertainty"]["kind"] == "bootstrap_heads"


def test_imported_residual_acts_as_the_gym_env_on_the_same_seed(trained):
    """One 120 s episode of the gym vector env with the residual acting (the gym's ResidualActions
    and SB3's predict); the imported version, fed the same observations through the policy
    process's path (observe the bus's y and u, then act on the features), proposes the same
    actions."""
    v = hil.gym.make_vec(CONFIG, 1, episode_s=120.0)
    obs, _ = v.reset(seed=7)
    res = ResidualActions(v, SCALE, fallback=trained.fallback)
    pol = load_version(PolicyStore(trained.tmp / "pol"), "v1")
    assert pol.residual is not None and pol.act_members is not None  # heads: the gate's spread
    corr = _correction(trained)
    span = v.model.a_hi - v.model.a_lo
    worst, moved = 0.0, 0.0
    for k in range(120):
        pol.residual.observe(v.Ymeas[0], v.Uapp[0], k)
        members = pol.act_members(obs[0])  # the runner asks for the members first: act must stay pure
        got = pol.act(obs[0])
        want = res.actions(corr(obs))[0]
        worst = max(worst, float(np.max(np.abs(got - want) / span)))
        moved = max(moved, float(np.max(np.abs(got - res.ctrls[0].action) / span)))
        assert np.allclose(members.mean(axis=0), got, rtol=0, atol=1e-12 * span.max())
        obs, _, term, trunc, _ = v.step(want[None])
        assert not (term[0] or trunc[0]) or k == 119
    assert worst < TOL, worst
    assert moved > 1e-3  # the correction is not negligible: a wrong residual would show


def test_residual_shadow_run_reproduces_the_gym_actions(trained):
    """The version in HIL (lockstep, policy and safety processes over the bus, shadow mode):
    every proposal in the decision log is what the gym's ResidualActions computes from the
    measured outputs and applied inputs the loop published, step after step."""
    from hil.gym.deploy import shadow_run
    from hil.policy.features import FeatureMap
    from hil.recorder import read_recording

    res_run = shadow_run(CONFIG, trained.tmp / "pol", "v1", duration_s=30.0, workdir=trained.tmp / "shadow")
    assert res_run["summary"]["steps"] == 30 and res_run["comparison"]["proposals"] >= 25
    spec = hil.gym.make(CONFIG).model.spec
    pol = load_version(PolicyStore(trained.tmp / "pol"), "v1")
    df = read_recording(trained.tmp / "shadow" / "rec")
    dec = [json.loads(line) for line in open(trained.tmp / "shadow" / "decisions.jsonl")]
    log_names = next(d["actions"] for d in dec if d.get("event") == "start")
    to_log = [pol.actions.index(n) for n in log_names]
    proposals = {d["step"]: np.asarray(d["proposal"]) for d in dec
                 if d.get("event") == "decision" and d.get("proposal") is not None}
    first = min(proposals)
    v = hil.gym.make_vec(CONFIG, 1, episode_s=120.0)  # the gym's arithmetic over the recorded bus values
    fake = SimpleNamespace(model=v.model, action_names=v.action_names, num_envs=1,
                           Ymeas=np.zeros((1, spec.n_outputs)), Uapp=np.zeros((1, spec.n_inputs)))
    res = ResidualActions(fake, SCALE, fallback=trained.fallback)
    fmap = FeatureMap(spec, pol.features)
    corr = _correction(trained)
    span = np.array([spec.quantity("inputs", n).high - spec.quantity("inputs", n).low for n in log_names])
    checked, worst = 0, 0.0
    k = first
    while k in proposals:  # consecutive answered observations (a gap would change the PID's dt)
        fake.Ymeas[0] = df.loc[k, [f"meas.{n}" for n in spec.names("outputs")]].to_numpy(float)
        fake.Uapp[0] = df.loc[k, [f"app.{n}" for n in spec.names("inputs")]].to_numpy(float)
        f = fmap.build(fake.Ymeas[0], fake.Uapp[0])
        want = res.actions(corr(f[None]))[0]
        worst = max(worst, float(np.max(np.abs(proposals[k] - want[to_log]) / span)))
        checked += 1
        k += 1
    assert checked >= 20, (first, sorted(proposals)[:5], checked)
    assert worst < TOL, worst


def test_a_residual_model_without_its_scale_is_refused_with_the_hint(trained):
    r = _cli("import", str(trained.tmp / "ppo.zip"), str(CONFIG), "--out", str(trained.tmp / "pol2"),
             "--vecnormalize", str(trained.tmp / "vecnormalize.pkl"))
    assert r.returncode != 0 and "--residual-scale" in r.stderr
    r = _cli("import", str(trained.tmp / "ppo.zip"), str(CONFIG), "--out", str(trained.tmp / "pol2"),
             "--residual-scale", "0.1", "--residual-open-loop", "feed_rate")
    assert r.returncode != 0 and "feed_rate" in r.stderr and "no [[safety.fallback.loops]]" in r.stderr
    assert not (trained.tmp / "pol2").exists()
