"""A warm worker leaves no state behind: the same runs in a fresh process each (cold) and one
after another in a single warm worker (each run but the first after a different run: a policy
run with a process fault that sets the policy's environment, PLC runs after policy runs) give
the same recording bit for bit, the same criteria and the same verdict; the warm worker's
policy runs loaded the policy's kernel from the worker's Numba cache (hil/campaign/warm.py)."""

import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)

CAMPAIGN = f"""
    [campaign]
    name = "warm"
    seeds = [1, 2]
    out = "out"
    retries = 0
    [[scenarios]]
    name = "policy"
    file = "{ROOT}/configs/bioreactor_policy.toml"
    duration_s = 240.0
    set = {{ "safety.mode" = "full", "safety.rollout.auto_promote" = false }}
    [[scenarios]]
    name = "plc"
    file = "{ROOT}/configs/bioreactor_plc.toml"
    controller = "softplc"
    duration_s = 1800.0
    [faults.none]
    kind = "none"
    [faults.nan]
    kind = "policy_nan"
    scenarios = ["policy"]
    start_s = [80.0, 120.0]
    duration_s = 30.0
    [faults.agitator_stuck]
    kind = "actuator_stuck"
    scenarios = ["plc"]
    signal = "agitation_power"
    value = 0.0
    start_s = [300.0, 600.0]
    duration_s = 600.0
    [[criteria]]
    name = "done"
    kind = "run_completed"
    [[criteria]]
    name = "rec"
    kind = "recording_complete"
    [[criteria]]
    name = "fallback"
    kind = "fallback_within"
    periods = 3
    faults = ["nan"]
    [[criteria]]
    name = "do_above_60"
    kind = "bounds"
    signal = "y.dissolved_oxygen"
    low = 60.0
    window = "after_start"
    scenarios = ["plc"]
"""


def test_warm_worker_runs_equal_cold_runs(tmp_path):
    from hil.campaign.expand import expand
    from hil.campaign.runner import run_campaign
    from hil.campaign.schema import load_campaign

    f = tmp_path / "c.toml"
    f.write_text(textwrap.dedent(CAMPAIGN))
    c = load_campaign(f)
    order = [r.run_id for r in expand(c)]
    assert order[:4] == ["policy.none.s1", "policy.none.s2", "policy.nan.s1", "policy.nan.s2"]
    assert order[4:] == ["plc.none.s1", "plc.none.s2", "plc.agitator_stuck.s1", "plc.agitator_stuck.s2"]

    cold = {r["run"]["run_id"]: r for r in run_campaign(c, tmp_path / "cold", workers=1, progress=False, cold=True)}
    warm = {r["run"]["run_id"]: r for r in run_campaign(c, tmp_path / "warm", workers=1, progress=False)}
    assert set(cold) == set(warm) == set(order)
    for r in list(cold.values()) + list(warm.values()):
        assert r["verdict"] != "error", (r["run"]["run_id"], r.get("error"))
    # cold: a process per run; warm: one process ran them all, in the expanded order
    assert len({r["worker_pid"] for r in cold.values()}) == len(order)
    assert len({r["worker_pid"] for r in warm.values()}) == 1
    assert [r["warm"]["policy_numba_cache"] for r in cold.values()] == [False] * len(order)
    assert all(warm[k]["warm"]["policy_numba_cache"] for k in order[:4])  # policy runs: the worker's cache
    for run_id in order:
        a, b = cold[run_id], warm[run_id]
        assert b["digest"] == a["digest"], run_id  # the same recording, bit for bit
        assert {k: v["status"] for k, v in b["criteria"].items()} == \
               {k: v["status"] for k, v in a["criteria"].items()}, run_id
        assert b["verdict"] == a["verdict"], run_id
    # each run differs from the one before it in the worker, but for the no-fault runs of one
    # scenario (these scenarios draw nothing from the seed: alike), so a worker that carried a
    # run's state into the next would have shown above
    for prev, cur in zip(order, order[1:]):
        if not (prev.split(".")[:2] == cur.split(".")[:2] and ".none." in cur):
            assert cold[cur]["digest"] != cold[prev]["digest"], (prev, cur)
    assert cold["policy.nan.s1"]["criteria"]["fallback"]["status"] == "pass"
