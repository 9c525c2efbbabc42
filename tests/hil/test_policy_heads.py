"""Bootstrapped heads (hil/policy/heads.py): a single network's disagreement signal grows away
from the buffer it was fitted on, and the members it sends are centred on the network's action."""

import numpy as np
import pytest

from hil.policy.heads import CentredHeads, fit_heads, scores
from hil.policy.mlp import MLPPolicy


def _network(seed=0, f=4, a=2):
    """A PPO-sized tanh network (64x64) with SB3-like small weights, clipped to [0, 1] x [0, 100]."""
    rng = np.random.default_rng(seed)
    Ws = [rng.normal(0, 1 / np.sqrt(f), (f, 64)), rng.normal(0, 1 / 8, (64, 64)), rng.normal(0, 0.1, (64, a))]
    bs = [np.zeros(64), np.zeros(64), np.array([0.5, 50.0])]
    return MLPPolicy(Ws, bs, ["tanh", "tanh", "identity"], low=np.zeros(a), high=np.array([1.0, 100.0]),
                     squash=False)


def test_heads_disagree_off_the_buffer_and_agree_on_it():
    net = _network()
    rng = np.random.default_rng(1)
    X = rng.normal(0, 1, (1000, 4))
    heads, report = fit_heads(net.act, X, 5, seed=0)
    assert report["members"] == 5
    span = net.high - net.low
    fresh = scores(heads, rng.normal(0, 1, (400, 4)), span)  # new samples from the buffer's distribution
    far = scores(heads, rng.normal(0, 1, (400, 4)) + 5.0, span)  # 5 standard deviations away
    # the signal the gate thresholds: typical off-buffer spread above the in-distribution p99
    assert far["disagreement"]["p50"] > 2 * fresh["disagreement"]["p99"], (fresh, far)


def test_members_are_centred_on_the_network_action():
    net = _network(2)
    X = np.random.default_rng(3).normal(0, 1, (500, 4))
    heads, _ = fit_heads(net.act, X, 4, seed=1, steps=200)
    members = CentredHeads(net.act, heads)
    for x in X[:20] * 3:
        m = members.act_members(x)
        assert m.shape == (4, 2)
        np.testing.assert_allclose(m.mean(axis=0), net.act(x), rtol=0, atol=1e-12 * 100)
        np.testing.assert_allclose(m.std(axis=0), heads.act_members(x).std(axis=0), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("k, n, message", [(1, 500, "at least 2"), (5, 30, "too small")])
def test_bad_head_settings_are_refused(k, n, message):
    with pytest.raises(ValueError, match=message):
        fit_heads(_network().act, np.zeros((n, 4)), k)
