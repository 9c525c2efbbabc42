"""Policies: the ensemble, loading (module:attribute, ONNX, stored versions), the runner's answers."""

import numpy as np
import pytest

from hil.bus import Receiver, Sender, payload_schema
from hil.policy.ensemble import MLPEnsemble
from hil.policy.fit import default_features, simulate
from hil.policy.loader import load_entry, load_version
from hil.policy.runner import PolicyRunner
from hil.policy.store import PolicyStore
from plants.base import load_plant_module

from .safety.helpers import POLICIES, scenario

SPEC = load_plant_module("bioreactor").SPEC
FEATURES = ["dissolved_oxygen", "ph", "u.base_flow", "u.agitation_power"]


def test_ensemble_fits_and_disagrees_outside_its_data():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(2000, 2))
    A = np.c_[np.sin(2 * X[:, 0]) + X[:, 1] ** 2, X[:, 0] * X[:, 1]]
    ens, report = MLPEnsemble.fit(X, A, steps=1500, seed=1)
    assert max(report["normalized_mse_per_member"]) < 0.02
    np.testing.assert_allclose(ens.act(np.array([0.3, -0.2])), [np.sin(0.6) + 0.04, -0.06], atol=0.1)
    inside = np.mean([ens.act_members(x).std(0).max() for x in rng.uniform(-1, 1, (50, 2))])
    outside = np.mean([ens.act_members(x).std(0).max() for x in rng.uniform(4, 6, (50, 2))])
    assert outside > 5 * inside


def test_ensemble_save_load_and_residual_path(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(500, 3))
    A = X[:, [2]] + 0.5 * X[:, [0]]  # action = previous action (feature 2) + a change
    ens, _ = MLPEnsemble.fit(X, A, residual_index=[2], steps=500)
    ens.save(tmp_path / "p.npz")
    back = MLPEnsemble.load(tmp_path / "p.npz")
    x = np.array([0.1, 0.2, 5.0])  # feature 2 far outside the data: the residual carries it
    np.testing.assert_array_equal(back.act_members(x), ens.act_members(x))
    assert back.act(x)[0] == pytest.approx(5.05, abs=0.1)


def test_compiled_members_match_numpy_reference():
    rng = np.random.default_rng(3)
    M, f, h, a = 4, 5, 7, 3
    ens = MLPEnsemble(x_mean=rng.normal(size=f), x_std=rng.uniform(0.5, 2, f), y_mean=rng.normal(size=a),
                      y_std=rng.uniform(0.5, 2, a), W0=rng.normal(size=(M, f, a)), W1=rng.normal(size=(M, f, h)),
                      b1=rng.normal(size=(M, h)), W2=rng.normal(size=(M, h, a)), b2=rng.normal(size=(M, a)),
                      residual_index=[4, -1, 0])
    for x in rng.normal(scale=3, size=(20, f)):
        np.testing.assert_allclose(ens.act_members(x), ens.act_members_numpy(x), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ens.act_members(x), ens.predict_batch(x[None])[:, 0], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="expected 5 features"):
        ens.act_members(np.zeros(4))


def test_entry_policies_callable_object_class():
    pol = load_entry("tests.hil.safety.policies:constant", FEATURES, ["base_flow", "agitation_power"])
    np.testing.assert_array_equal(pol.act(np.zeros(4)), [0.0003, 13.0])
    assert pol.act_members is None
    pol = load_entry("tests.hil.safety.policies:Ensemble", FEATURES, ["base_flow", "agitation_power"])
    assert pol.act_members(np.zeros(4)).shape == (3, 2)
    with pytest.raises(ValueError, match="cannot import"):
        load_entry("tests.nope:f", FEATURES, [])
    with pytest.raises(ValueError, match="has no attribute"):
        load_entry("tests.hil.safety.policies:missing", FEATURES, [])


def test_onnx_policy(tmp_path):
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from hil.policy.loader import load_onnx

    w = helper.make_tensor("W", TensorProto.FLOAT, [4, 2], [0, 0, 0, 0, 1e-4, 0, 0, 1.0])
    node = helper.make_node("MatMul", ["x", "W"], ["a"])
    graph = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2])], [w])
    path = tmp_path / "p.onnx"
    onnx.save(helper.make_model(graph), str(path))
    pol = load_onnx(str(path), FEATURES, ["base_flow", "agitation_power"])
    np.testing.assert_allclose(pol.act(np.array([40.0, 5.0, 3.0, 13.0])), [3e-4, 13.0], rtol=1e-5)


def _runner(entry, features=FEATURES, inputs=()):
    pol = {"entry": entry, "features": features, "inputs": list(inputs)}
    sc = scenario({"policy": pol}, drop=("policy.directory", "policy.version"))
    return PolicyRunner(sc, key=KEY)


KEY = b"test-bus-key-0123456789abcdef"  # the bus secret these in-process tests share


def _obs_msg(step=0, q=None):
    y, u = SPEC.nominal("outputs"), SPEC.nominal("inputs")
    q = [0] * SPEC.n_outputs if q is None else q
    raw = Sender("obs", KEY).encode(step, step + 1.0, {"y": y.tolist(), "q": q, "u": u.tolist(), "lockstep": True})
    return Receiver("obs", payload_schema("obs", SPEC.n_outputs, SPEC.n_inputs, 2), KEY).decode(raw)


def _proposal(raw):
    return Receiver("proposal", payload_schema("proposal", SPEC.n_outputs, SPEC.n_inputs, 2), KEY).decode(raw)


def test_runner_answers_and_reorders_actions():
    r = _runner("tests.hil.safety.policies:Reversed")
    r.policy.actions = ["agitation_power", "base_flow"]
    r._install(r.policy)
    msg = _proposal(r.answer(_obs_msg(3)))
    assert msg.step == 3 and msg.payload["version"] == "tests.hil.safety.policies:Reversed"
    np.testing.assert_array_equal(msg.payload["a"], [0.0003, 13.0])  # scenario order
    r = _runner("tests.hil.safety.policies:Ensemble")
    msg = _proposal(r.answer(_obs_msg()))
    assert msg.payload["members"].shape == (3, 2)


@pytest.mark.parametrize("entry, counter", [
    ("tests.hil.safety.policies:nan_policy", "policy_invalid"),
    ("tests.hil.safety.policies:wrong_shape", "policy_invalid"),
    ("tests.hil.safety.policies:raises", "policy_errors"),
])
def test_a_nan_wrong_shape_or_raising_policy_is_silent(entry, counter):
    r = _runner(entry)
    assert r.answer(_obs_msg()) is None
    assert r.counters[counter] == 1
    if counter == "policy_errors":
        assert "policy bug" in r.last_error


def test_runner_switches_version_on_command_and_keeps_it_on_a_bad_one():
    r = PolicyRunner(scenario(), key=KEY)
    assert r.version == "v1"
    cmd = Sender("command", KEY)
    r.command(cmd.encode(-1, 0.0, {"op": "load", "version": "v2", "reason": "test"}))
    assert r.version == "v2" and r.counters["version_switches"] == 1
    assert _proposal(r.answer(_obs_msg())).payload["version"] == "v2"
    r.command(cmd.encode(-1, 0.0, {"op": "load", "version": "v9", "reason": "test"}))
    assert r.version == "v2" and r.counters["command_errors"] == 1
    r.command(b"junk")
    assert r.cmd_rx.counters["dropped_auth"] == 1  # unsigned: dropped before it is parsed


def test_shipped_versions_known_good_and_bad():
    store = PolicyStore(POLICIES)
    assert store.versions()[:2] == ["v1", "v2"]
    assert store.known_good("v1") and not store.known_good("v2")
    mean, cov = store.stats("v1")
    assert mean.shape == (6,) and cov.shape == (6, 6)
    sc = scenario()
    feats = default_features(sc, SPEC)
    results = {}
    for v in ("v1", "v2"):
        pol = load_version(store, v)
        assert pol.features == feats and pol.actions == ["base_flow", "agitation_power"]
        _, _, info = simulate(sc, episodes=1, seconds=900, seed=5, policy=pol.act, features=feats)
        results[v] = info["tracking_nrmse"]
    assert results["v1"] < 0.01  # tracks the baseline's setpoints
    assert results["v2"] > 0.1  # drives DO to 12 %: far off 40 %


def test_a_bad_quality_observation_reaches_the_policy_as_nan_and_it_stays_silent_without_crashing():
    r = PolicyRunner(scenario(), key=KEY)
    i_do = SPEC.index("outputs", "dissolved_oxygen")
    y, u = SPEC.nominal("outputs"), SPEC.nominal("inputs")
    y[i_do] = float("nan")
    q = [0] * SPEC.n_outputs
    q[i_do] = 2
    raw = Sender("obs", KEY).encode(5, 6.0, {"y": y.tolist(), "q": q, "u": u.tolist(), "lockstep": True})
    msg = Receiver("obs", payload_schema("obs", SPEC.n_outputs, SPEC.n_inputs, 2), KEY).decode(raw)
    assert msg is not None and np.isnan(msg.payload["y"][i_do]) and msg.payload["q"][i_do] == 2
    assert r.answer(msg) is None  # non-finite output: silent for this step (the safety's fallback acts)
    assert r.counters["obs_bad_quality"] == 1 and r.counters["policy_invalid"] + r.counters["policy_errors"] == 1
    r.answer(_obs_msg(6))  # (a delta feature still carries the NaN for one step)
    assert _proposal(r.answer(_obs_msg(7))) is not None  # good observations: answered again
