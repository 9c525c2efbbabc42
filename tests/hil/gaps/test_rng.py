"""Random streams of the gap kernels (hil/gaps/rng.py) and the arena (hil/gaps/arena.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from hil.gaps.arena import Arena
from hil.gaps.rng import next_u64, normal, seed_streams, stream_seed, uniform

MASK = (1 << 64) - 1


def splitmix64(state: int):
    """Reference SplitMix64 (Steele, Lea, Flood 2014) in plain Python."""
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)


def test_matches_the_reference_splitmix64():
    s = np.array([12345], dtype=np.uint64)
    ref = splitmix64(12345)
    assert [int(next_u64(s, 0)) for _ in range(100)] == [next(ref) for _ in range(100)]


def test_uniform_range_and_streams_differ():
    s = np.zeros(3, dtype=np.uint64)
    seed_streams(s, seed=1, episode=0, base=0)
    assert len(set(s.tolist())) == 3
    assert stream_seed(1, 0, 0) != stream_seed(1, 1, 0) != stream_seed(2, 0, 0)
    u = np.array([uniform(s, 1) for _ in range(50_000)])
    assert u.min() > 0.0 and u.max() <= 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-3


def test_ziggurat_normal_distribution_and_tails():
    """KS at the 0.1 % level, and tail frequencies within 4.5 sd of the Gaussian's."""
    s = np.zeros(1, dtype=np.uint64)
    seed_streams(s, 3, 0, 0)
    z = np.array([normal(s, 0) for _ in range(400_000)])
    assert stats.kstest(z, "norm").pvalue > 1e-3
    for c in (2.0, 3.0, 3.5):  # 3.44 is the ziggurat's base-strip edge: the tail path
        p = 2 * stats.norm.sf(c)
        k = (np.abs(z) > c).sum()
        assert abs(k - z.size * p) < 4.5 * np.sqrt(z.size * p)


def test_arena_views_share_the_buffer():
    a, b = np.arange(6.0).reshape(2, 3), np.array([7, 8], dtype=np.int64)
    c = np.array([1, 2, 3], dtype=np.uint64)
    ar = Arena()
    for x in (a, b, c):
        ar.put(x)
    B, (va, vb, vc) = ar.pack()
    np.testing.assert_array_equal(va, a)
    np.testing.assert_array_equal(vb, b)
    np.testing.assert_array_equal(vc, c)
    va[1, 2] = -1.0
    vb[0] = 99
    assert -1.0 in B and 99 in B.view(np.int64)
    H = B.view(np.int64)
    assert H[:4].tolist() == [12, 2, 3, 1]  # slot 0: offset after the 3-slot header, shape


@pytest.mark.parametrize("seed, episode, base", [(0, 0, 0), (12345678901234, 7, 99), (2**63 + 5, 2**40, 2**33)])
def test_seed_streams_vectorized_equals_the_scalar_hash_chain(seed, episode, base):
    s = np.zeros((7, 43), dtype=np.uint64)
    seed_streams(s, seed, episode, base)
    ref = np.array([stream_seed(seed, episode, base + k) for k in range(s.size)], dtype=np.uint64).reshape(s.shape)
    assert np.array_equal(s, ref)
