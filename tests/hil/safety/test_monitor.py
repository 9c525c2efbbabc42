"""Monitor rules in simulated time, and rollback to the previous known-good version."""

import json

import pytest

from hil.policy.store import PolicyStore
from hil.safety.config import MonitorSection
from hil.safety.monitor import Monitor, VersionKeeper
from plants.base import load_plant_module

SPEC = load_plant_module("bioreactor").SPEC
I_DO = SPEC.index("outputs", "dissolved_oxygen")


def _monitor(**rule):
    r = {"name": "do_low", "signal": "dissolved_oxygen", "op": "<", "limit": 20.0, "for_s": 30.0, **rule}
    return Monitor(MonitorSection(rules=[r]), SPEC)


def _run(mon, series, dt_s=1.0, t0=0.0):
    y, u = SPEC.nominal("outputs"), SPEC.nominal("inputs")
    trips = []
    for k, v in enumerate(series):
        y[I_DO] = v
        trips += mon.update(t0 + k * dt_s, y, u)
    return trips


def test_rule_trips_after_holding_for_its_sim_time():
    mon = _monitor()
    trips = _run(mon, [25.0] * 5 + [19.0] * 31)  # below from t = 5 s
    assert len(trips) == 1
    assert trips[0].t_s == 35.0 and trips[0].since_s == 5.0
    assert "dissolved_oxygen < 20 for 30 s" in trips[0].message


def test_rule_timing_is_sim_time_not_sample_count():
    # 0.5 s steps: 30 s is 60 samples
    trips = _run(_monitor(), [19.0] * 60, dt_s=0.5)
    assert trips == []
    trips = _run(_monitor(), [19.0] * 61, dt_s=0.5)
    assert len(trips) == 1 and trips[0].t_s == 30.0
    # 10 s steps: 4 samples
    assert len(_run(_monitor(), [19.0] * 4, dt_s=10.0)) == 1


def test_condition_must_hold_continuously_and_rule_rearms():
    mon = _monitor()
    series = [19.0] * 29 + [21.0] + [19.0] * 29  # interrupted just before 30 s
    assert _run(mon, series) == []
    mon = _monitor()
    trips = _run(mon, [19.0] * 100)  # held for 99 s: trips at 30, 60, 90
    assert [t.t_s for t in trips] == [30.0, 60.0, 90.0]


def test_non_finite_signal_counts_as_holding_and_greater_than_rules():
    assert len(_run(_monitor(on_bad="condition"), [float("nan")] * 31)) == 1
    mon = _monitor(op=">", limit=60.0, for_s=0.0)
    assert len(_run(mon, [50.0, 61.0])) == 1


def _store(tmp_path, good):
    store = PolicyStore(tmp_path / "pol")
    for i, ok in enumerate(good, start=1):
        store.write_meta(f"v{i}", {"kind": "entry", "entry": "m:f", "features": [], "actions": [], "known_good": ok})
    return store


def test_rollback_picks_the_previous_known_good_version(tmp_path):
    store = _store(tmp_path, [True, False, True, False, False])  # v1 ok, v2 bad, v3 ok, v4, v5 candidates
    assert store.versions() == ["v1", "v2", "v3", "v4", "v5"]
    assert store.resolve("latest_known_good") == "v3" and store.resolve("latest") == "v5"
    keeper = VersionKeeper(store, "v5")
    new, msg = keeper.rollback(100.0, "rule do_low")
    assert new == "v3" and "v5 -> v3" in msg and "rule do_low" in msg
    new, _ = keeper.rollback(200.0, "rule do_low")
    assert new == "v1"  # v2 is not known-good
    new, msg = keeper.rollback(300.0, "rule do_low")
    assert new is None and "baseline controller holds" in msg
    assert keeper.rolled_back == ["v5", "v3", "v1"]
    assert [h["to"] for h in keeper.history] == ["v3", "v1", None]


def test_a_rolled_back_version_is_never_chosen_again(tmp_path):
    store = _store(tmp_path, [True, True, True])
    keeper = VersionKeeper(store, "v2")
    keeper.rolled_back.append("v1")  # v1 was rolled back earlier in the run
    new, _ = keeper.rollback(0.0, "x")
    assert new is None


def test_versions_order_numerically_and_bad_meta_is_refused(tmp_path):
    store = _store(tmp_path, [True] * 11)
    assert store.versions()[-2:] == ["v10", "v11"]
    assert store.previous_known_good("v11") == "v10"
    (tmp_path / "pol" / "v3" / "meta.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a hil-policy"):
        store.meta("v3")
    with pytest.raises(ValueError, match="no policy version 'v99'"):
        store.resolve("v99")


def test_a_bad_signal_trips_at_once_with_the_rules_action_and_rearms_every_for_s():
    nan = float("nan")
    trips = _run(_monitor(), [25.0] * 3 + [nan] * 65 + [25.0] * 5 + [19.0] * 3)
    assert [(t.t_s, t.action) for t in trips] == [(3.0, "rollback"), (33.0, "rollback"), (63.0, "rollback")]
    assert "dissolved_oxygen is Bad since t = 3 s" in trips[0].message and trips[2].since_s == 3.0
    # a dead probe need not roll the policy back: trip with another action
    trips = _run(_monitor(on_bad="fallback"), [nan])
    assert [t.action for t in trips] == ["fallback"]
    assert [t.action for t in _run(_monitor(on_bad="alarm"), [nan])] == ["alarm"]
    # "condition": Bad counts as the condition holding (trips after for_s)
    assert [t.t_s for t in _run(_monitor(on_bad="condition"), [nan] * 40)] == [30.0]


def test_holding_lists_rules_whose_signal_is_bad():
    mon = _monitor()
    _run(mon, [25.0, float("nan"), float("nan")])
    assert mon.holding() == {"do_low": 1.0}
