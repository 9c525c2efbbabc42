"""`hil policy import` of a TorchScript or an ONNX file (hil/policy/import_graph.py): the imported
version's actions are the source model's on the same features (to 1e-6 of each action's span, in
the env and in a shadow run in HIL),
with normalization and action scaling folded into the graph or recorded beside it; a graph that
does not fit the scenario is refused with the reason."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import hil.gym  # noqa: E402
from hil.policy.loader import load_version  # noqa: E402
from hil.policy.store import PolicyStore  # noqa: E402
from tests.hil.gym.helpers import CONFIG  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's TorchScript and its exporter
ROOT = Path(__file__).resolve().parents[3]
TOL = 1e-6  # of each action's span: float32 graphs evaluated by torch and by onnxruntime


class Actor(torch.nn.Module):
    """A small actor: optional folded normalization (x - mean) / std, a tanh MLP, and either the
    action scaling folded in (plant units) or the raw tanh output in [-1, 1]."""

    def __init__(self, n_f, low, high, mean=None, std=None, fold_scaling=True):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(n_f, 32), torch.nn.Tanh(), torch.nn.Linear(32, len(low)))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        f32 = torch.float32
        self.register_buffer("mean", torch.zeros(n_f) if mean is None else torch.tensor(mean, dtype=f32))
        self.register_buffer("std", torch.ones(n_f) if std is None else torch.tensor(std, dtype=f32))
        self.register_buffer("low", torch.tensor(low, dtype=f32))
        self.register_buffer("high", torch.tensor(high, dtype=f32))
        self.fold_scaling = fold_scaling

    def forward(self, x):
        h = torch.tanh(self.net((x - self.mean) / self.std))
        if self.fold_scaling:
            return self.low + (h + 1.0) * 0.5 * (self.high - self.low)
        return h


def _observations(n=200, seed=5):
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


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hil.cli", "policy", "import", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def test_torchscript_with_everything_folded_in_imports_with_heads(tmp_path):
    obs, env = _observations()
    lo, hi = env.action_space.low, env.action_space.high
    actor = Actor(obs.shape[1], lo, hi, mean=obs.mean(0), std=obs.std(0) + 1e-6).eval()
    scripted = torch.jit.script(actor)
    scripted.save(str(tmp_path / "actor.pt"))
    r = _cli(str(tmp_path / "actor.pt"), str(CONFIG), "--out", str(tmp_path / "pol"), "--rollout-steps", "300",
             "--heads", "3")
    assert r.returncode == 0, r.stderr
    assert "3 bootstrapped heads" in r.stdout
    store = PolicyStore(tmp_path / "pol")
    meta = store.meta("v1")
    assert meta["kind"] == "onnx" and meta["training"]["format"] == "torchscript" and "io" not in meta
    pol = load_version(store, "v1")
    assert pol.features == env.feature_names and pol.actions == env.action_names
    with torch.no_grad():
        want = scripted(torch.as_tensor(obs, dtype=torch.float32)).double().numpy()
    got = np.array([pol.act(o) for o in obs])
    assert np.max(np.abs(got - want) / (hi - lo)) < TOL
    assert np.ptp(got, axis=0).min() > 1e-3 * (hi - lo).min()  # not a constant network
    # the heads are its members, centred on its action
    m = pol.act_members(obs[0])
    assert m.shape == (3, len(lo)) and np.allclose(m.mean(0), got[0], rtol=1e-12, atol=1e-12)
    mean, cov = store.stats("v1")
    assert mean.shape == (obs.shape[1],) and np.isfinite(cov).all()
    _shadow_proposals_are_the_module(tmp_path, scripted, pol, env)


def _shadow_proposals_are_the_module(tmp_path, module, pol, env):
    """In HIL (shadow run over the bus, the policy process confined, onnxruntime): every
    proposal is the source module's action on the features the loop published."""
    import json

    from hil.gym.deploy import shadow_run
    from hil.policy.features import FeatureMap
    from hil.recorder import read_recording

    res = shadow_run(CONFIG, tmp_path / "pol", "v1", duration_s=20.0, workdir=tmp_path / "shadow")
    assert res["comparison"]["proposals"] >= 18, res["comparison"]
    spec = env.model.spec
    df = read_recording(tmp_path / "shadow" / "rec")
    fmap = FeatureMap(spec, pol.features)
    dec = [json.loads(line) for line in open(tmp_path / "shadow" / "decisions.jsonl")]
    log_names = next(d["actions"] for d in dec if d.get("event") == "start")
    to_log = [pol.actions.index(n) for n in log_names]
    span = np.array([spec.quantity("inputs", n).high - spec.quantity("inputs", n).low for n in log_names])
    checked = 0
    for d in dec:
        if d.get("event") != "decision" or d.get("proposal") is None:
            continue
        k = d["step"]
        f = fmap.build(df.loc[k, [f"meas.{n}" for n in spec.names("outputs")]].to_numpy(float),
                       df.loc[k, [f"app.{n}" for n in spec.names("inputs")]].to_numpy(float))
        if not np.isfinite(f).all():
            continue
        with torch.no_grad():
            want = module(torch.as_tensor(f[None, :], dtype=torch.float32)).double().numpy()[0]
        assert np.max(np.abs(np.asarray(d["proposal"]) - want[to_log]) / span) < TOL, (k, d["proposal"], want)
        checked += 1
    assert checked >= 15


def test_onnx_with_normalization_and_scaling_recorded(tmp_path):
    from stable_baselines3.common.vec_env import VecNormalize

    from hil.gym.sb3 import make_sb3_vec
    from hil.policy.import_graph import import_onnx

    obs, env = _observations()
    lo, hi = env.action_space.low, env.action_space.high
    actor = Actor(obs.shape[1], lo, hi, fold_scaling=False).eval()  # takes normalized x, gives [-1, 1]
    torch.onnx.export(actor, (torch.zeros(1, obs.shape[1]),), str(tmp_path / "actor.onnx"), dynamo=False,
                      input_names=["obs"], output_names=["action"])
    venv = VecNormalize(make_sb3_vec(CONFIG, 1, episode_s=60.0, parallel=False), clip_obs=4.0)
    venv.obs_rms.mean = obs.mean(0)
    venv.obs_rms.var = obs.var(0) + 1e-3
    with open(tmp_path / "vecnormalize.pkl", "wb") as f:
        pickle.dump(venv, f)
    venv.close()
    from hil.scenario.config import load_scenario

    sc = load_scenario(CONFIG)
    vdir = import_onnx(tmp_path / "actor.onnx", sc, tmp_path / "pol", vecnormalize_path=tmp_path / "vecnormalize.pkl",
                       action_map="squash", heads=0, rollout_steps=100)
    store = PolicyStore(tmp_path / "pol")
    assert vdir.name == "v1" and store.meta("v1")["io"] == "io.npz"
    pol = load_version(store, "v1")
    # the source: SB3's normalization, the torch network, the squash rescaling, computed here
    z = np.clip((obs - venv.obs_rms.mean) / np.sqrt(venv.obs_rms.var + venv.epsilon), -4.0, 4.0)
    with torch.no_grad():
        h = actor(torch.as_tensor(z, dtype=torch.float32)).double().numpy()
    want = lo + (h + 1.0) * 0.5 * (hi - lo)
    got = np.array([pol.act(o) for o in obs])
    assert np.max(np.abs(got - want) / (hi - lo)) < TOL
    assert pol.act_members is None  # imported without heads: a single network


def test_graphs_that_do_not_fit_are_refused(tmp_path):
    obs, env = _observations(20)
    lo, hi = env.action_space.low, env.action_space.high
    n_f = obs.shape[1]
    wrong = Actor(n_f - 1, lo, hi).eval()
    torch.onnx.export(wrong, (torch.zeros(1, n_f - 1),), str(tmp_path / "small.onnx"), dynamo=False)
    r = _cli(str(tmp_path / "small.onnx"), str(CONFIG), "--out", str(tmp_path / "pol"))
    assert r.returncode != 0 and f"observes ({n_f - 1},)" in r.stderr and f"(batch, {n_f})" in r.stderr
    # raw tanh output in [-1, 1] for inputs whose bounds are not [-1, 1], no --action-map: refused
    raw = Actor(n_f, lo, hi, fold_scaling=False).eval()
    torch.onnx.export(raw, (torch.zeros(1, n_f),), str(tmp_path / "raw.onnx"), dynamo=False)
    r = _cli(str(tmp_path / "raw.onnx"), str(CONFIG), "--out", str(tmp_path / "pol"), "--heads", "0",
             "--rollout-steps", "20")
    assert r.returncode != 0 and "is not inside its bounds" in r.stderr and "--action-map" in r.stderr
    (tmp_path / "junk.onnx").write_bytes(b"not a graph")
    r = _cli(str(tmp_path / "junk.onnx"), str(CONFIG), "--out", str(tmp_path / "pol"))
    assert r.returncode != 0 and "is not a valid ONNX model" in r.stderr
    assert not (tmp_path / "pol").exists()
