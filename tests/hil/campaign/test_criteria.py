"""Every criterion kind and window kind on synthetic recordings: one that passes, one that fails.

The recordings are built by hand (DataFrames with the recorder's column names), one row per 1 s
step; the fault window is steps [20, 30) unless a test says otherwise."""

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from hil.campaign.criteria import FAIL, NA, PASS, check, fallback_command_times, interventions
from hil.campaign.paired import check_paired, finalize, seen
from hil.campaign.schema import Criterion
from hil.scenario.config import load_scenario
from hil.recorder import columns_for
from plants.base import load_plant_module

ROOT = Path(__file__).resolve().parents[3]
SPEC = load_plant_module("bioreactor").SPEC
POLICY_SC = load_scenario(ROOT / "configs/bioreactor_policy.toml")
N, STEP_S = 60, 1.0
WIN = (20, 30)


def rec(n=N, **cols) -> pd.DataFrame:
    """A recording of n steps: every column at its spec nominal (inputs at the policy scenario's
    fallback values, inside the safety box) unless given as an array or a scalar."""
    df = pd.DataFrame({c: np.zeros(n) for c in columns_for(SPEC)})
    df["step"] = np.arange(n, dtype=float)
    df["t_s"] = (np.arange(n) + 1) * STEP_S
    for kind, prefix in (("states", "x."), ("outputs", "y."), ("outputs", "meas."), ("inputs", "cmd."),
                         ("inputs", "app.")):
        for name in SPEC.names(kind):
            df[prefix + name] = SPEC.quantity(kind, name).nominal
    for p in ("cmd.", "app."):
        df[p + "agitation_power"] = 30.0
        df[p + "base_flow"] = 0.0003
    df["y.volume"] = df["meas.volume"] = 100.0
    for k, v in cols.items():
        df[k.replace("__", ".")] = v
    return df


def crit(**kw) -> Criterion:
    return Criterion(name=kw.pop("name", "c"), **kw)


def run_check(cr, df, window=WIN, decisions=(), fb_times=(), kind="sensor_stuck", summary=None, info=None,
              decimate=1, envelopes=None):
    c = SimpleNamespace(envelopes=envelopes or {})
    summary = summary if summary is not None else {"state": "stopped", "exit_code": 0, "steps": len(df),
                                                   "dropped_rows": 0}
    return check(cr, c, df, POLICY_SC, SPEC, summary, STEP_S, decimate, window, list(decisions), list(fb_times),
                 kind, info, sc_declared=POLICY_SC)


def bump(lo, hi, value, base=70.0, n=N):
    """An array at `base` with `value` on steps [lo, hi)."""
    v = np.full(n, base)
    v[lo:hi] = value
    return v


# ---------------------------------------------------------------- windows


@pytest.mark.parametrize("window, inside, outside", [
    ("all", 5, None),                  # any step counts
    ("fault", 25, 35),                 # [20, 30) only
    ("after_fault", 45, 25),           # from 30 on
    ("after_start", 22, 10),           # from 20 on
])
def test_each_window_sees_a_violation_inside_it_and_not_outside(window, inside, outside):
    cr = crit(kind="bounds", signal="y.dissolved_oxygen", low=60.0, high=80.0, window=window)
    assert run_check(cr, rec(y__dissolved_oxygen=bump(inside, inside + 1, 10.0)))["status"] == FAIL
    if outside is not None:
        assert run_check(cr, rec(y__dissolved_oxygen=bump(outside, outside + 1, 10.0)))["status"] == PASS


def test_windows_without_a_fault_fault_is_empty_and_after_windows_are_the_whole_run():
    df = rec(y__dissolved_oxygen=bump(5, 6, 10.0))
    for window, want in (("fault", PASS), ("after_fault", FAIL), ("after_start", FAIL)):
        cr = crit(kind="bounds", signal="y.dissolved_oxygen", low=60.0, high=80.0, window=window)
        assert run_check(cr, df, window=(None, None))["status"] == want, window


# ---------------------------------------------------------------- absolute criteria


def test_bounds_default_to_the_spec_bounds_and_nan_fails():
    cr = crit(kind="bounds", signal="app.agitation_power")
    assert run_check(cr, rec())["status"] == PASS
    assert run_check(cr, rec(app__agitation_power=bump(3, 4, 101.0, 30.0)))["status"] == FAIL
    r = run_check(cr, rec(app__agitation_power=bump(3, 4, math.nan, 30.0)))
    assert r["status"] == FAIL and "1 sample" in r["detail"]


def test_envelope_every_signal_of_the_named_envelope():
    env = {"process": {"y.dissolved_oxygen": (10.0, 150.0), "y.ph": (4.5, 5.5)}}
    cr = crit(kind="envelope", envelope="process")
    assert run_check(cr, rec(y__ph=5.0), envelopes=env)["status"] == PASS
    r = run_check(cr, rec(y__ph=bump(40, 42, 5.8, 5.0)), envelopes=env)
    assert r["status"] == FAIL and "y.ph" in r["detail"] and r["value"] == pytest.approx(0.3)


def test_iae_integrates_the_absolute_error_over_the_window():
    cr = crit(kind="iae", signal="y.dissolved_oxygen", setpoint=70.0, max=50.0, window="fault")
    r = run_check(cr, rec(y__dissolved_oxygen=bump(20, 30, 74.0)))  # 10 s x 4 % = 40 % s
    assert r["status"] == PASS and r["value"] == pytest.approx(40.0)
    r = run_check(cr, rec(y__dissolved_oxygen=bump(20, 30, 76.0)))  # 60 % s
    assert r["status"] == FAIL and r["value"] == pytest.approx(60.0)
    assert run_check(cr, rec(y__dissolved_oxygen=bump(20, 21, math.nan)))["status"] == FAIL


def test_iae_counts_decimated_rows_at_their_spacing():
    cr = crit(kind="iae", signal="y.dissolved_oxygen", setpoint=70.0, max=50.0)
    r = run_check(cr, rec(n=6, y__dissolved_oxygen=np.array([70, 71, 70, 70, 70, 70.0])), decimate=10,
                  window=(None, None))
    assert r["value"] == pytest.approx(10.0)  # one row stands for 10 s


def test_final_the_last_value_within_limits():
    cr = crit(kind="final", signal="y.penicillin", min=0.195)
    assert run_check(cr, rec(y__penicillin=np.linspace(0.2, 0.197, N)))["status"] == PASS
    r = run_check(cr, rec(y__penicillin=np.linspace(0.2, 0.19, N)))
    assert r["status"] == FAIL and r["value"] == pytest.approx(0.19)


def test_time_outside_counts_seconds_outside_the_band():
    cr = crit(kind="time_outside", signal="y.dissolved_oxygen", low=60.0, high=80.0, max_s=5.0)
    assert run_check(cr, rec(y__dissolved_oxygen=bump(20, 25, 50.0)))["status"] == PASS
    r = run_check(cr, rec(y__dissolved_oxygen=bump(20, 26, 50.0)))
    assert r["status"] == FAIL and r["value"] == pytest.approx(6.0)


def test_recording_complete_rows_consecutive_and_nothing_dropped():
    cr = crit(kind="recording_complete")
    assert run_check(cr, rec())["status"] == PASS
    df = rec().drop(index=[10]).reset_index(drop=True)
    assert run_check(cr, df, summary={"steps": N, "dropped_rows": 0})["status"] == FAIL
    assert run_check(cr, rec(), summary={"steps": N, "dropped_rows": 3})["status"] == FAIL


def test_run_completed_needs_a_clean_stop():
    cr = crit(kind="run_completed")
    assert run_check(cr, rec())["status"] == PASS
    r = run_check(cr, rec(), summary={"state": "failed", "exit_code": 3, "stop_reason": "plant diverged",
                                      "error": "x"})
    assert r["status"] == FAIL


def test_rollback_expected_or_not_since_the_fault_start():
    rb = [{"event": "rollback", "t_s": 25.0}]
    none = crit(kind="rollback", expect=False)
    some = crit(kind="rollback", expect=True)
    assert run_check(none, rec())["status"] == PASS
    assert run_check(none, rec(), decisions=rb)["status"] == FAIL
    assert run_check(some, rec(), decisions=rb)["status"] == PASS
    assert run_check(some, rec(), decisions=[{"event": "rollback", "t_s": 5.0}])["status"] == FAIL  # before it


def test_fallback_within_from_the_decision_log_the_loop_watchdog_or_the_plc():
    cr = crit(kind="fallback_within", periods=5)
    assert run_check(cr, rec(), decisions=[{"event": "fallback_enter", "t_s": 23.0}])["status"] == PASS
    r = run_check(cr, rec(), decisions=[{"event": "fallback_enter", "t_s": 27.0}])
    assert r["status"] == FAIL and r["value"] == 7
    assert run_check(cr, rec())["status"] == FAIL  # never engaged
    assert run_check(cr, rec(), fb_times=[22.0])["status"] == PASS  # the loop's watchdog
    assert run_check(cr, rec(), info={"plc_comm_loss_periods": 3})["status"] == PASS
    assert run_check(cr, rec(), window=(None, None), kind="none")["status"] == NA


def test_fallback_command_times_find_the_watchdog_action_in_the_commands():
    df = rec(cmd__agitation_power=bump(30, 40, 30.0, 50.0), cmd__base_flow=0.0003)
    assert fallback_command_times(df, POLICY_SC, STEP_S) == [30.0]
    assert any(e["kind"] == "loop_fallback" for e in interventions([], df, POLICY_SC, STEP_S))


# ---------------------------------------------------------------- the wrapper's envelope


def test_safety_envelope_passes_a_command_inside_box_rate_and_shear_limit():
    ramp = np.minimum(30.0 + 2.0 * np.arange(N), 60.0)  # 2 W/s (the declared rate), up to 0.6 W/L x 100 L
    r = run_check(crit(kind="safety_envelope"), rec(cmd__agitation_power=ramp, app__agitation_power=ramp))
    assert r["status"] == PASS, r["detail"]


@pytest.mark.parametrize("what, series, volume_l, needle", [
    # a 2 W/s ramp to 85 W in a 150 L broth (shear limit 90 W): only the 80 W box (< the 100 W spec) is broken
    ("box", np.minimum(30.0 + 2.0 * np.arange(N), 85.0), 150.0, "outside the box [0, 80]"),
    ("rate", bump(20, 60, 35.0, 30.0), 100.0, "faster than 2/s"),               # a 5 W jump in one 1 s step
    ("linear", np.minimum(30.0 + np.arange(N), 70.0), 100.0, "limit shear"),    # 70 W > 0.6 W/L x 100 L
])
def test_safety_envelope_catches_each_part_on_the_command_the_loop_would_have_clipped(what, series, volume_l, needle):
    vol = {"y__volume": volume_l, "meas__volume": volume_l}
    r = run_check(crit(kind="safety_envelope", on=["cmd"]), rec(cmd__agitation_power=series, **vol))
    assert r["status"] == FAIL and needle in r["detail"], r["detail"]
    # the same values applied (the command column clean) are caught on app
    r = run_check(crit(kind="safety_envelope", on=["app"]), rec(app__agitation_power=series, **vol))
    assert r["status"] == FAIL and needle in r["detail"]
    # and left out of `checks`, that part is not checked
    others = [c for c in ("box", "rate", "linear") if c != what]
    r = run_check(crit(kind="safety_envelope", checks=others), rec(cmd__agitation_power=series, **vol))
    assert r["status"] == PASS, r["detail"]


def test_safety_envelope_is_n_a_without_a_wrapper():
    plc = load_scenario(ROOT / "configs/bioreactor_plc.toml")
    cr = crit(kind="safety_envelope")
    r = check(cr, SimpleNamespace(envelopes={}), rec(), plc, SPEC, {}, STEP_S, 1, WIN, [], [], "none", None,
              sc_declared=plc)
    assert r["status"] == NA


def test_safety_envelope_holds_the_run_to_the_declared_scenario_not_its_overrides():
    """A canary that opens the wrapper (box = the spec range) is still held to the declared box."""
    opened = load_scenario(ROOT / "configs/bioreactor_policy.toml",
                           {"safety": {"projection": {"box": {"agitation_power": [0.0, 100.0]}}}})
    df = rec(cmd__agitation_power=bump(20, 60, 80.0 + 0.0, 30.0) * 0 + 90.0)
    cr = crit(kind="safety_envelope", checks=["box"])
    r = check(cr, SimpleNamespace(envelopes={}), df, opened, SPEC, {}, STEP_S, 1, WIN, [], [], "none", None,
              sc_declared=POLICY_SC)
    assert r["status"] == FAIL
    r = check(cr, SimpleNamespace(envelopes={}), df, opened, SPEC, {}, STEP_S, 1, WIN, [], [], "none", None,
              sc_declared=opened)
    assert r["status"] == PASS


# ---------------------------------------------------------------- paired criteria


def paired(cr, fdf, bdf, win=WIN, detection=None, decimate=1):
    return check_paired(cr, fdf, bdf, STEP_S, decimate, win, detection)


def test_paired_iae_ratio_against_the_no_fault_twin():
    noise = 70.0 + np.sin(np.arange(N))  # the twin's own error: |sin| summed
    cr = crit(kind="paired_iae", signal="y.dissolved_oxygen", setpoint=70.0, window="after_start", max_ratio=1.5)
    base = rec(y__dissolved_oxygen=noise)
    small = noise.copy()
    small[20:30] += 0.5
    big = noise.copy()
    big[20:30] += 5.0
    assert paired(cr, rec(y__dissolved_oxygen=small), base)["status"] == PASS
    r = paired(cr, rec(y__dissolved_oxygen=big), base)
    assert r["status"] == FAIL and r["value"] > 1.5
    # the floor: a twin with no error at all does not turn a small deviation into an infinite ratio
    flat = rec(y__dissolved_oxygen=70.0)
    floored = crit(kind="paired_iae", signal="y.dissolved_oxygen", setpoint=70.0, max_ratio=1.5, floor=20.0)
    assert paired(floored, rec(y__dissolved_oxygen=bump(20, 30, 72.0)), flat)["status"] == PASS  # 20 / 20
    assert paired(floored, rec(y__dissolved_oxygen=bump(20, 30, 74.0)), flat)["status"] == FAIL  # 40 / 20


def test_paired_iae_compares_the_same_steps_when_the_faulted_run_stopped_early():
    cr = crit(kind="paired_iae", signal="y.dissolved_oxygen", setpoint=70.0, max_ratio=1.01, floor=1.0)
    base = rec(y__dissolved_oxygen=bump(40, 60, 90.0))  # the twin drifts late in the run
    short = rec(n=35, y__dissolved_oxygen=70.5)  # the faulted run stopped at step 34
    r = paired(cr, short, base)
    # 35 x 0.5 = 17.5 % s against the twin's 0 (floor 1) over the same 35 steps; the twin's later
    # 400 % s of drift must not excuse it (ratio 0.04 if it were counted)
    assert r["status"] == FAIL and r["value"] == pytest.approx(17.5), r["detail"]


def test_paired_time_outside_extra_seconds():
    cr = crit(kind="paired_time_outside", signal="y.dissolved_oxygen", low=60.0, high=80.0, max_extra_s=5.0,
              window="after_start")
    base = rec(y__dissolved_oxygen=bump(50, 53, 50.0))  # 3 s outside without the fault
    assert paired(cr, rec(y__dissolved_oxygen=bump(20, 28, 50.0)), base)["status"] == PASS  # 8 - 3 = 5
    r = paired(cr, rec(y__dissolved_oxygen=bump(20, 29, 50.0)), base)
    assert r["status"] == FAIL and r["value"] == pytest.approx(6.0)


def test_paired_final_relative_and_absolute_deviation():
    cr = crit(kind="paired_final", signal="y.penicillin", max_rel=0.01)
    base = rec(y__penicillin=np.linspace(0.2, 0.197, N))
    assert paired(cr, rec(y__penicillin=np.linspace(0.2, 0.1955, N)), base)["status"] == PASS  # -0.76 %
    assert paired(cr, rec(y__penicillin=np.linspace(0.2, 0.1945, N)), base)["status"] == FAIL  # -1.27 %
    ab = crit(kind="paired_final", signal="y.penicillin", max_abs=1e-3)
    assert paired(ab, rec(y__penicillin=np.linspace(0.2, 0.1955, N)), base)["status"] == FAIL
    assert paired(cr, rec(y__penicillin=np.r_[np.full(N - 1, 0.2), np.nan]), base)["status"] == FAIL


def test_paired_deviation_is_the_largest_distance_from_the_twin_at_the_same_steps():
    cr = crit(kind="paired_deviation", signal="y.dissolved_oxygen", max_abs=0.25, window="after_start")
    base = rec(y__dissolved_oxygen=70.0 + np.sin(np.arange(N)))  # the twin moves on its own
    near = base["y.dissolved_oxygen"].to_numpy().copy()
    near[25:40] += 0.2
    far = near.copy()
    far[33] += 0.1  # 0.3 at step 33
    assert paired(cr, rec(y__dissolved_oxygen=near), base)["status"] == PASS
    r = paired(cr, rec(y__dissolved_oxygen=far), base)
    assert r["status"] == FAIL and r["value"] == pytest.approx(0.3) and "step 33" in r["detail"], r["detail"]
    # before the fault start (window after_start) a difference does not count; with "all" it does
    early = base["y.dissolved_oxygen"].to_numpy().copy()
    early[5] += 5.0
    assert paired(cr, rec(y__dissolved_oxygen=early), base)["status"] == PASS
    allw = crit(kind="paired_deviation", signal="y.dissolved_oxygen", max_abs=0.25)
    assert paired(allw, rec(y__dissolved_oxygen=early), base)["status"] == FAIL
    # the same steps: a faulted run stopped early is compared with the twin's first rows only
    assert paired(cr, rec(n=35, y__dissolved_oxygen=near[:35]), rec(y__dissolved_oxygen=bump(40, 60, 99.0,
                  base=0) + base["y.dissolved_oxygen"].to_numpy()))["status"] == PASS
    # NaN (a broken plant) fails closed
    nan = near.copy()
    nan[30] = np.nan
    r = paired(cr, rec(y__dissolved_oxygen=nan), base)
    assert r["status"] == FAIL and r["value"] == math.inf


def test_paired_detection_needs_the_fault_run_to_engage_and_the_twin_not_to():
    cr = crit(kind="paired_detection", periods=5)
    df = rec()
    assert paired(cr, df, df, detection=(3, None))["status"] == PASS
    assert paired(cr, df, df, detection=(8, None))["status"] == FAIL  # too late
    assert paired(cr, df, df, detection=(None, None))["status"] == FAIL  # never
    r = paired(cr, df, df, detection=(3, 2))  # the twin engaged as well: not a detection of the fault
    assert r["status"] == FAIL and "no-fault run engaged" in r["detail"]
    assert paired(cr, df, df, win=(None, None))["status"] == NA


def test_finalize_merges_paired_verdicts_and_marks_the_fault_seen():
    c = SimpleNamespace(criteria=[crit(name="done", kind="run_completed"),
                                  crit(name="iae", kind="paired_iae", signal="y.ph", setpoint=5.0, max_ratio=2.0),
                                  crit(name="det", kind="paired_detection", periods=5)])
    res = {"run": {"run_id": "p.f.s1"}, "fault": {"start_step": 20}, "verdict": "pass", "failed": [],
           "criteria": {"done": {"status": PASS}}}
    finalize(c, res, {"iae": {"status": FAIL}, "det": {"status": FAIL}})
    assert res["verdict"] == "fail" and res["failed"] == ["iae", "det"] and res["seen"] is True
    res2 = {"run": {"run_id": "p.f.s2"}, "fault": {"start_step": 20}, "verdict": "pass", "failed": [],
            "criteria": {"done": {"status": PASS}}}
    finalize(c, res2, {"iae": {"status": PASS}, "det": {"status": PASS}})
    assert res2["verdict"] == "pass" and seen(res2)  # detected in time: seen, and the run passes
    res3 = {"run": {"run_id": "p.f.s3"}, "fault": {"start_step": 20}, "verdict": "pass", "failed": [],
            "criteria": {"done": {"status": PASS}}}
    finalize(c, res3, {"iae": {"status": PASS}, "det": {"status": FAIL}})
    assert res3["seen"] is False  # no criterion saw it: counts against the detection goal


def test_finalize_drops_stale_verdicts_of_an_earlier_pass_and_of_removed_criteria():
    """The campaign was edited between two passes (resume): a paired criterion that no longer
    applies to the run and a criterion that is gone leave no verdict behind."""
    c = SimpleNamespace(criteria=[crit(name="done", kind="run_completed"),
                                  crit(name="dev", kind="paired_deviation", signal="y.ph", max_abs=0.01)])
    res = {"run": {"run_id": "p.f.s1"}, "fault": {"start_step": 20}, "verdict": "fail", "failed": ["dev", "old"],
           "criteria": {"done": {"status": PASS}, "dev": {"status": FAIL}, "old": {"status": FAIL}}}
    finalize(c, res, {})  # this pass: "dev" does not apply to the run any more
    assert res["criteria"] == {"done": {"status": PASS}} and res["verdict"] == "pass", res
