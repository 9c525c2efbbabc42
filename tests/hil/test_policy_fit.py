"""Fitting a policy version by imitation of the baseline (small settings: seconds)."""

import json

import numpy as np

from hil.policy.fit import fit_version
from hil.policy.loader import load_version
from hil.policy.store import PolicyStore

from .safety.helpers import scenario


def test_fit_writes_a_new_version_with_training_statistics(tmp_path):
    sc = scenario()
    out = tmp_path / "pol"
    meta = fit_version(sc, str(out), episodes=1, seconds=300.0, steps=300, members=3, hidden=8)
    assert meta["version"] == "v1" and meta["known_good"] is True
    store = PolicyStore(out)
    mean, cov = store.stats("v1")
    assert np.all(np.linalg.eigvalsh(cov) > -1e-12) and mean.shape == (len(meta["features"]),)
    tr = meta["training"]
    assert tr["samples"] == 300 and tr["members"] == 3
    assert tr["mahalanobis"]["p50"] <= tr["mahalanobis"]["p99"] <= tr["mahalanobis"]["max"]
    pol = load_version(store, "v1")
    assert pol.act_members(np.asarray(mean)).shape == (3, 2)
    meta2 = fit_version(sc, str(out), episodes=1, seconds=120.0, steps=50, members=2, hidden=4,
                        setpoints={"agitation_power": 12.0})
    assert meta2["version"] == "v2" and meta2["known_good"] is False
    on_disk = json.loads((out / "v2" / "meta.json").read_text())
    assert on_disk["training"]["baseline_setpoints"]["dissolved_oxygen -> agitation_power"] == 12.0
