"""Issue 25's recipe, "Train with SB3, prove it in HIL" (docs/guides/train-then-prove.md), run
end to end as the page writes it: its runnable blocks in order in a copy of the repository (PPO
trained briefly through hil.gym.sb3, `hil policy import`, `hil policy check --policy DIR`,
`hil shadow`, `hil safety log`), then what they left behind is checked: the imported version, and
a shadow run in which the baseline acted and every proposal the policy process made was SB3's own
deterministic action on the features the loop published."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("torch")

from tests.docs import runnable  # noqa: E402

PAGE = "docs/guides/train-then-prove.md"


def _bound_s() -> float:
    """Each block has its own bound (its marker's timeout); the test's is their sum and a margin."""
    return sum(b.timeout_s for b in runnable.all_blocks()[PAGE]) + 300.0


@pytest.mark.timeout(_bound_s())
def test_the_recipe_runs_as_written(tmp_path):
    blocks = runnable.all_blocks()[PAGE]
    scripts = "".join(b.script for b in blocks)
    for step in ("make_sb3_vec", "hil policy import", "hil policy check", "--policy", "hil shadow",
                 "hil safety log"):
        assert step in scripts, step  # the page still walks the whole road
    work = runnable.repo_copy(tmp_path / "repo")
    results = runnable.run_blocks(blocks, work)
    for res in results:
        assert res.problem() is None, res.report()
    assert len(results) == len(blocks)

    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    from hil.bus.config import action_input_names, declared_bus_input_names
    from hil.scenario.config import load_scenario
    from hil.policy.features import FeatureMap
    from hil.policy.loader import load_version
    from hil.policy.store import PolicyStore
    from hil.recorder import read_recording

    store = PolicyStore(work / "runs" / "ppo_policy")
    assert store.versions() == ["v1"] and not store.known_good("v1") and store.meta("v1")["kind"] == "mlp"
    shadow = results[-1].output
    assert "mode shadow" in shadow and "the baseline acted" in shadow

    cfg = work / "configs" / "bioreactor_gym.toml"
    spec = load_scenario(cfg).plant.load().spec
    pol = load_version(store, "v1")
    model = PPO.load(work / "runs" / "ppo.zip", device="cpu")
    with open(work / "runs" / "vecnormalize.pkl", "rb") as fh:  # the statistics the block saved
        venv = pickle.load(fh)
    assert isinstance(venv, VecNormalize)
    df = read_recording(work / "runs" / "shadow" / "rec")
    fmap = FeatureMap(spec, pol.features)
    # the env's action order is the scenario's declared one; the decision log's is the bus's
    # (hil.bus.config.action_input_names): compare by name
    log_order = action_input_names(load_scenario(cfg), spec)
    assert sorted(log_order) == sorted(pol.actions)
    span = np.array([spec.quantity("inputs", n).high - spec.quantity("inputs", n).low for n in log_order])
    env_order = declared_bus_input_names(load_scenario(cfg), spec)
    to_policy = [env_order.index(n) for n in log_order]
    recs = [json.loads(line) for line in open(work / "runs" / "shadow" / "decisions.jsonl")]
    dec = [r for r in recs if r.get("event") == "decision"]
    assert dec and {r["mode"] for r in dec} == {"shadow"}
    checked = 0
    for d in dec:
        if d.get("proposal") is None:
            continue
        k = d["step"]
        y = df.loc[k, [f"meas.{n}" for n in spec.names("outputs")]].to_numpy(float)
        u = df.loc[k, [f"app.{n}" for n in spec.names("inputs")]].to_numpy(float)
        f = fmap.build(y, u)
        if not np.isfinite(f).all():
            continue
        want, _ = model.predict(venv.normalize_obs(f[None, :]), deterministic=True)
        want = want[0][to_policy]
        assert np.max(np.abs(np.asarray(d["proposal"]) - want) / span) < 1e-5, (k, d["proposal"], want)
        checked += 1
    assert checked >= 100  # of the 120 steps of the 2 min shadow run

