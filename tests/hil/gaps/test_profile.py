"""Latency profile files (hil/gaps/profile.py), the measurement (hil/gaps/measure.py) and
`hil profile` (hil/commands/profile.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from hil.commands.profile import command
from hil.gaps.profile import (
    ProfileError, from_latencies, from_timestamps, load_profile, parse_profile, save_profile,
    select_series,
)


def _write(tmp_path, obj, name="p.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def test_round_trip_units_and_histogram(tmp_path):
    prof = {"format": "hil-latency-profile", "version": 1, "series": {
        "a": {"unit": "ms", "samples": [1, 2, 3]},
        "b": {"unit": "us", "histogram": {"edges": [0, 10, 20], "counts": [1, 3]}}}}
    s = load_profile(_write(tmp_path, prof))
    np.testing.assert_allclose(s["a"].samples, [1e-3, 2e-3, 3e-3])
    assert s["b"].low == 0.0 and s["b"].high == pytest.approx(2e-5)
    data, n = s["b"].packed()
    np.testing.assert_allclose(data, [0.25, 1.0, 0.0, 1e-5, 2e-5])
    assert n == 2
    out = tmp_path / "o.json"
    save_profile(from_latencies([1.0, 2.0], "ms"), out)
    assert load_profile(out)["latency"].high == pytest.approx(2e-3)


@pytest.mark.parametrize("obj,msg", [
    ("{not json", "not valid JSON"),
    ({"format": "other", "version": 1, "series": {}}, "'format' must be"),
    ({"format": "hil-latency-profile", "version": 9, "series": {"a": {"samples": [1]}}},
     "version"),
    ({"format": "hil-latency-profile", "version": 1, "series": {}}, "non-empty"),
    ({"format": "hil-latency-profile", "version": 1, "series": {"a": {"samples": [-1.0]}}},
     ">= 0"),
    ({"format": "hil-latency-profile", "version": 1, "series": {"a": {"samples": []}}},
     "non-empty list"),
    ({"format": "hil-latency-profile", "version": 1, "series": {"a": {}}}, "exactly one"),
    ({"format": "hil-latency-profile", "version": 1, "series": {"a": {
        "histogram": {"edges": [0, 1], "counts": [1, 2]}}}}, r"need counts \+ 1"),
    ({"format": "hil-latency-profile", "version": 1, "series": {"a": {
        "histogram": {"edges": [0, 2, 1], "counts": [1, 2]}}}}, "strictly increasing"),
    ({"format": "hil-latency-profile", "version": 1, "series": {"a": {
        "unit": "min", "samples": [1]}}}, "unit"),
])
def test_malformed_profiles_are_rejected(tmp_path, obj, msg):
    with pytest.raises(ProfileError, match=msg):
        load_profile(_write(tmp_path, obj))


def test_missing_file_and_series_selection(tmp_path):
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "nope.json")
    s = parse_profile(from_latencies([1.0], name="x") | {})
    assert select_series(s, None).name == "x"
    with pytest.raises(ProfileError, match="no series 'y'"):
        select_series(s, "y")


def test_from_timestamps_gives_intervals():
    p = from_timestamps([0, 10, 30, 60], "ms")
    np.testing.assert_allclose(p["series"]["interval"]["samples"], [0.01, 0.02, 0.03])


def _request_log(tmp_path, n=400, period_ns=10_000_000, seed=1):
    """A log as adapters/modbus_log.py dumps it: one client polling every 10 ms (+ jitter),
    reading then writing 2 ms later; publishes every 1 ms."""
    from adapters.modbus_log import RequestLog

    rng = np.random.default_rng(seed)
    log = RequestLog(10 * n)
    t0 = 1_000_000_000
    for k in range(n):
        t_read = t0 + k * period_ns + int(rng.integers(0, 200_000))
        pub = t_read - int(rng.integers(0, 1_000_000))
        log.append((t_read, 50_000, "10.0.0.5:502", 1, 3, 0, 4, False, 0, k, pub, -1, t_read + 10_000))
        log.append((t_read + 2_000_000, 60_000, "10.0.0.5:502", 1, 16, 10, 2, True, 0, -1, 0, k, -1))
    path = tmp_path / "_modbus_requests.jsonl"
    log.dump(path)
    return path


def test_profile_command_from_request_log(tmp_path):
    log = _request_log(tmp_path)
    out = tmp_path / "prof.json"
    res = CliRunner().invoke(command, [str(log), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    s = load_profile(out)
    peer = "10.0.0.5:502"
    ri = s[f"{peer}.read_interval"].samples
    assert abs(ri.mean() - 0.010) < 1e-5 and ri.max() < 0.0103
    np.testing.assert_allclose(s[f"{peer}.read_to_write"].samples, 0.002)
    age = s[f"{peer}.observation_age"].samples
    assert 0 <= age.min() and age.max() <= 0.001 + 10e-6  # served 10 us after decoding
    np.testing.assert_allclose(s[f"{peer}.response"].samples[:2], [50e-6, 60e-6])
    assert json.loads(res.output.strip().splitlines()[-1])["series"]


def test_profile_command_plain_and_time_scale(tmp_path):
    src = tmp_path / "lat.txt"
    src.write_text("latency_ms\n" + "\n".join(str(v) for v in [1, 2, 3, 4]))
    out = tmp_path / "p.json"
    res = CliRunner().invoke(command, [str(src), "-o", str(out), "--latencies", "--unit", "ms",
                                       "--time-scale", "10"])
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(load_profile(out)["latency"].samples, [0.01, 0.02, 0.03, 0.04])
    res = CliRunner().invoke(command, [str(src), "-o", str(out), "--timestamps", "--unit", "ms",
                                       "--bins", "2"])
    assert res.exit_code == 0, res.output
    assert load_profile(out)["interval"].counts.sum() == 3


def test_profile_command_rejects_a_bad_log(tmp_path):
    bad = _write(tmp_path, '{"x": 1}\n', "log.jsonl")
    res = CliRunner().invoke(command, [str(bad), "-o", str(tmp_path / "o.json")])
    assert res.exit_code != 0
    assert "lacks column" in str(res.exception) + res.output


def test_measured_profile_replays_its_distribution(tmp_path):
    """Measure -> profile -> replay in the latency gap: same distribution (KS, 0.1 %)."""
    from hil.gaps import latency as lat
    from tests.hil.gaps.gaps_util import build

    log = _request_log(tmp_path, n=3000)
    out = tmp_path / "prof.json"
    assert CliRunner().invoke(command, [str(log), "-o", str(out)]).exit_code == 0
    series = "10.0.0.5:502.observation_age"
    src = load_profile(out)[series].samples
    g = build({"latency": {"observation": {"level": {"dist": "profile", "file": str(out),
                                                     "series": series, "replay": "random"}}}})
    d = g.observation
    L, I, R = d.L.copy(), d.I.copy(), d.R.copy()
    draws = np.array([lat.draw_delay(L, 0, I, R, d.prof) for _ in range(20000)])
    assert stats.ks_2samp(draws, src).pvalue > 1e-3


def test_observation_age_is_taken_at_the_snapshot_not_at_decoding(tmp_path):
    """The loop may publish between decoding a read (t_ns) and taking its snapshot (served_ns):
    the age is served_ns - publish_ns, never negative (t_ns - publish_ns was, in test_demo)."""
    from adapters.modbus_log import RequestLog
    from hil.gaps.measure import client_series, read_log

    log = RequestLog(100)
    t0 = 1_000_000_000
    for k in range(20):
        t_read = t0 + k * 10_000_000
        pub = t_read + 5_000  # published after the request was decoded ...
        served = t_read + 20_000  # ... and before the snapshot was taken
        log.append((t_read, 50_000, "p:1", 1, 3, 0, 4, False, 0, k, pub, -1, served))
    path = tmp_path / "_modbus_requests.jsonl"
    log.dump(path)
    series = client_series(read_log(path), None, 1.0, 0)
    np.testing.assert_allclose(series["p:1.observation_age"]["samples"], 15e-6)
