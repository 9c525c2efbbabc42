"""benchmarks/grid_series.py: hil's batch loops and lightsim2grid's TimeSeriesCPP /
ContingencyAnalysisCPP compute the same answers; every goal is evaluated (no timing asserted)."""

import pytest

from .conftest import run_quick

pytest.importorskip("lightsim2grid")
pytest.importorskip("pandapower")


@pytest.mark.timeout(600)
def test_quick_run_answers_agree_and_goals_evaluated():
    res = run_quick("grid_series")
    s, c = res["series"], res["n1"]
    assert s["max_dv_pu"] < 1e-6 and c["max_dv_pu"] < 1e-6       # both stop at max |F| < 1e-8 pu
    assert c["max_dp_flow_mw"] < 1e-3                               # from-end flows of every branch, every outage
    assert s["iterations_median"]["hil"] >= 2                       # 1-2 % load moves: real Newton work
    assert c["outages"] == 186                                      # every case118 branch
    assert c["identical_work"] and c["not_converged_excluded"] == []  # case118: only islanding outages unsolved
    assert c["solved"] + len(c["islanding_excluded"]) == 186 and 0 < len(c["islanding_excluded"]) < 186
    assert set(s["us_per_step"]) == {"hil", "lightsim2grid", "hil_python_loop"}
    assert set(c["us_per_outage"]) == {"hil", "lightsim2grid"}
    for part, key in ((s, "us_per_step"), (c, "us_per_outage")):
        assert all(len(v["repeats"]) == 3 for v in part[key].values())
    assert set(res["goals_met"]) == set(res["goals"])
    assert res["goal_met"] == all(res["goals_met"].values())
    assert {h["peer_name"] for h in res["headline"]} == {"lightsim2grid TimeSeriesCPP",
                                                         "lightsim2grid ContingencyAnalysisCPP"}
