"""benchmarks/campaign_throughput.py: the stratified sample and its projection (no timing asserted)."""

from types import SimpleNamespace

import pytest

from .conftest import load, run_quick


def _run(scenario, fault, seed):
    return SimpleNamespace(scenario=scenario, fault=fault, seed=seed, run_id=f"{scenario}.{fault}.s{seed}")


def _res(scenario, fault, seed, wall_s):
    return {"run": {"scenario": scenario, "fault": fault, "seed": seed}, "wall_s": wall_s}


def test_sample_takes_the_same_seeds_of_every_stratum_and_one_run_per_canary():
    b = load("campaign_throughput")
    runs = [_run("plc", f, s) for f in ("none", "stuck") for s in (3, 1, 2)] + \
        [_run("plc", "canary.open", s) for s in (2, 1)]
    groups = b.strata(runs)
    assert set(groups) == {("plc", "none"), ("plc", "stuck"), ("plc", "canary.open")}
    ids = [r.run_id for r in b.sample(groups, 2)]
    # the faulted runs' twins are in the sample: the same seeds of the no-fault stratum
    assert ids == ["plc.none.s1", "plc.none.s2", "plc.stuck.s1", "plc.stuck.s2", "plc.canary.open.s1"]


def test_projection_scales_each_stratum_by_its_own_run_time():
    b = load("campaign_throughput")
    groups = {("plc", "none"): [_run("plc", "none", s) for s in range(1, 21)],
              ("policy", "nan"): [_run("policy", "nan", s) for s in range(1, 21)]}
    res = [_res("plc", "none", 1, 4.0), _res("policy", "nan", 1, 16.0)]
    # sample: 20 s of runs on 2 workers = 10 s; end to end 15 s with 1 s of reports: 4 s overhead
    p = b.project(groups, res, workers=2, e2e_s=15.0, report_s=1.0)
    assert p["overhead_s"] == pytest.approx(4.0)
    assert p["full_runs"] == 40
    assert p["projected_full_s"] == pytest.approx(4.0 + (20 * 4.0 + 20 * 16.0) / 2 + 1.0 / 2 * 40)
    with pytest.raises(RuntimeError, match="policy.nan"):
        b.project(groups, res[:1], workers=2, e2e_s=15.0, report_s=1.0)


def test_helper_share_takes_each_stratum_s_helper_time_out_once_per_run():
    b = load("campaign_throughput")
    groups = {("plc", "none"): [_run("plc", "none", s) for s in range(1, 11)],
              ("policy", "nan"): [_run("policy", "nan", s) for s in range(1, 21)]}
    res = [{**_res("plc", "none", 1, 2.0), "phases_s": {"start_s": 0.1, "loop_s": 1.5, "stop_s": 0.1}},
           {**_res("policy", "nan", 1, 9.0), "phases_s": {"start_s": 3.0, "loop_s": 4.0, "stop_s": 1.0}},
           {**_res("policy", "nan", 2, 9.0), "phases_s": {"start_s": 2.0, "loop_s": 4.0, "stop_s": 1.0}}]
    # per worker: (10 x 0.2 + 20 x 3.5) / 2
    assert b.helper_share(groups, res, workers=2) == pytest.approx((10 * 0.2 + 20 * 3.5) / 2)
    assert b.mean_phases(res)["policy"] == {"start_s": 2.5, "loop_s": 4.0, "stop_s": 1.0}


@pytest.mark.timeout(900)
def test_quick_run_cold_starts_a_worker_per_run_warm_reuses_one():
    res = run_quick("campaign_throughput", "--workers", "1", timeout=880)
    assert res["quick"] and res["sample_runs"] == 2 and set(res["modes"]) == {"warm", "warm_spawn", "cold"}
    assert res["modes"]["warm"]["worker_processes"] == res["modes"]["warm_spawn"]["worker_processes"] == 1
    assert res["modes"]["cold"]["worker_processes"] == 2
    for m in res["modes"].values():
        assert m["full_runs"] == 40 and m["projected_full_s"] > 0  # 2 strata x 20 seeds
    assert res["cold_over_warm"] > 0


@pytest.mark.timeout(600)
def test_profile_policy_reports_every_process_of_the_kept_runs():
    res = run_quick("campaign_throughput", "--workers", "1", "--modes", "", "--profile-policy", "2", timeout=580)
    p = res["profile_policy"]
    assert p["run"] == "policy.none.s1" and p["repeats"] == 2 and p["steps"] == 1800  # 30 min of batch, 1 s steps
    cpu = p["cpu_us_per_step"]
    # the kept policy and safety processes were found across the reset runs (CPU measured, not absent)
    assert set(cpu) == {"loop", "recorder", "policy", "safety", "total"}
    assert all(cpu[r]["median"] > 0 for r in ("loop", "policy", "safety"))
    assert cpu["total"]["median"] >= cpu["loop"]["median"] + cpu["policy"]["median"]
    # every step wakes the policy once at least (one observation, one blocking receive)
    assert p["vol_ctxsw_per_step"]["policy"]["median"] >= 0.9
