"""The deployment path, very short: train on the env, save as a `hil policy` version, run it in
HIL (loop, policy and safety processes over the bus, lockstep) in shadow mode beside the
baseline, compare."""

import json

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from click.testing import CliRunner  # noqa: E402

from hil.gym.deploy import print_comparison, shadow_run  # noqa: E402
from hil.gym.train_example import train  # noqa: E402
from hil.policy.features import FeatureMap  # noqa: E402
from hil.policy.loader import load_version  # noqa: E402
from hil.policy.store import PolicyStore  # noqa: E402
from hil.recorder import read_recording  # noqa: E402
from plants.base import load_plant_module  # noqa: E402
from tests.hil.gym.helpers import CONFIG  # noqa: E402
from tests.hil.safety.helpers import remove_ipc_dirs  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_ipc_dirs():
    yield
    remove_ipc_dirs()


def test_train_save_load_and_shadow_run_in_hil(tmp_path):
    out = tmp_path / "policies"
    lines = []
    meta = train(str(CONFIG), out=str(out), generations=2, pairs=2, episodes=2, episode_s=60.0, log=lines.append)
    assert meta["version"] == "v1" and meta["kind"] == "mlp_ensemble" and not meta["known_good"]
    assert len(lines) == 3 and "held-out" in lines[-1]
    ev = meta["training"]["evaluation"]
    assert np.isfinite(ev["policy_return"]) and np.isfinite(ev["baseline_return"])
    # what `hil policy` loads
    pol = load_version(PolicyStore(out), "v1")
    assert pol.actions == ["agitation_power", "base_flow"] and len(pol.features) == 6  # the scenario file's order
    from hil.cli import main as cli

    res = CliRunner().invoke(cli, ["policy", "show", str(out), "v1"])
    assert res.exit_code == 0, res.output
    assert "mlp_ensemble" in res.output

    res = shadow_run(CONFIG, out, "v1", duration_s=20.0, workdir=tmp_path / "shadow")
    c = res["comparison"]
    assert res["summary"]["state"] == "stopped" and res["summary"]["steps"] == 20
    assert c["modes"] == ["shadow"] and c["sources"] == ["baseline:shadow"]
    assert c["proposals"] >= 18 and set(c["inputs"]) == {"base_flow", "agitation_power"}
    # the wire carried the trained policy on what the loop published, and the loop applied the
    # baseline's action, never the proposal
    spec = load_plant_module("bioreactor").SPEC
    df = read_recording(tmp_path / "shadow" / "rec")
    fmap = FeatureMap(spec, pol.features)
    feats = []
    for k in range(len(df)):
        y = df.loc[k, [f"meas.{n}" for n in spec.names("outputs")]].to_numpy(float)
        u = df.loc[k, [f"app.{n}" for n in spec.names("inputs")]].to_numpy(float)
        feats.append(fmap.build(y, u))
    dec = [json.loads(line) for line in open(tmp_path / "shadow" / "decisions.jsonl")]
    log_names = next(r["actions"] for r in dec if r.get("event") == "start")  # the log's order, mapped by name
    to_log = [pol.actions.index(n) for n in log_names]
    dec = [r for r in dec if r.get("event") == "decision" and r.get("proposal") is not None]
    checked = 0
    for r in dec:
        k = r["step"]
        if not np.isfinite(feats[k]).all():
            continue
        np.testing.assert_allclose(r["proposal"], pol.act(feats[k])[to_log], rtol=1e-12, atol=0)
        if k + 1 < len(df):
            cmd = df.loc[k + 1, [f"cmd.{n}" for n in log_names]].to_numpy(float)
            np.testing.assert_array_equal(cmd, r["action"])
            checked += 1
    assert checked >= 15
    printed = []
    print_comparison(res, echo=printed.append)
    text = "\n".join(printed)
    assert "shadow run: 20 steps" in text and "agitation_power" in text and "shadow gate:" in text
