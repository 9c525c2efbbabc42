"""The loop's per-step kernels against the numpy expressions they replace."""

import numpy as np

from hil.loop.kernels import check_state, clip_inputs, take_into


def test_take_into_copies_only_the_indexed_entries():
    dst, src = np.zeros(6), np.arange(6.0) + 10
    take_into(dst, src, np.array([1, 4], dtype=np.intp))
    np.testing.assert_array_equal(dst, [0, 11, 0, 0, 14, 0])


def test_clip_inputs_matches_the_numpy_reference():
    rng = np.random.default_rng(3)
    lo, hi = np.zeros(5), np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    counts = np.zeros(2, dtype=np.int64)
    ref_counts = np.zeros(2, dtype=np.int64)
    for _ in range(200):
        u = rng.uniform(-2, 7, 5)
        u[rng.random(5) < 0.2] = rng.choice([np.nan, np.inf, -np.inf])
        prev = rng.uniform(0, 1, 5)
        out = np.empty(5)
        clip_inputs(u, lo, hi, prev, out, counts)
        ref = np.clip(u, lo, hi)
        bad = ~np.isfinite(u)
        ref[bad] = prev[bad]
        ref_counts += [np.count_nonzero(ref != u) - bad.sum(), bad.sum()]
        np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(counts, ref_counts)
    assert counts.min() > 0


def test_check_state_counts_per_state_and_flags_non_finite():
    lo, hi, tol = np.zeros(3), np.ones(3), np.full(3, 1e-9)
    steps_out = np.zeros(3, dtype=np.int64)
    assert check_state(np.array([0.5, 0.5, 0.5]), lo, hi, tol, steps_out) == 0
    assert check_state(np.array([-1e-12, 1.0 + 1e-12, 0.5]), lo, hi, tol, steps_out) == 0  # within slack
    assert check_state(np.array([-0.1, 0.5, 1.2]), lo, hi, tol, steps_out) == 2
    assert check_state(np.array([-0.1, 0.5, 0.5]), lo, hi, tol, steps_out) == 1
    np.testing.assert_array_equal(steps_out, [2, 0, 1])
    assert check_state(np.array([0.5, np.nan, 0.5]), lo, hi, tol, steps_out) == -1
