"""Lateness histogram: percentiles within the bucket resolution of exact ones."""

import numpy as np

from hil.loop.stats import LatencyHistogram, bucket_low, bucket_of


def test_percentiles_match_numpy_within_resolution():
    rng = np.random.default_rng(3)
    samples = (rng.lognormal(mean=9.0, sigma=1.5, size=50_000)).astype(np.int64)  # ~8 us median
    h = LatencyHistogram()
    for v in samples:
        h.record(int(v))
    for q in (50, 99, 99.9):
        exact = np.percentile(samples, q, method="inverted_cdf")
        # 64 buckets per octave: a bucket spans at most 1/64 of its value
        assert abs(h.percentile_ns(q) - exact) <= exact / 64 + 1, q
    assert h.max_ns == samples.max() and h.n == samples.size


def test_buckets_are_monotone_and_contain_their_values():
    values = np.unique(np.concatenate([np.arange(0, 5000), np.geomspace(5000, 2**45, 5000).astype(np.int64)]))
    idx = np.array([bucket_of(int(v)) for v in values])
    assert np.all(np.diff(idx) >= 0)
    lo = bucket_low(idx)
    hi = bucket_low(idx + 1)
    assert np.all((lo <= values) & (values < hi))


def test_count_above_threshold():
    h = LatencyHistogram()
    for v in [10, 100, 2_000_000, 3_000_000]:
        h.record(v)
    assert h.count_above(1_000_000) == 2
