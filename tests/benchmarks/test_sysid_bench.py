"""benchmarks/sysid_speed.py: the NumPy RK4 reference computes hil's answer (no timing asserted)."""

import pytest

from .conftest import run_quick


@pytest.mark.timeout(600)
def test_quick_run_references_agree():
    res = run_quick("sysid_speed")
    d = res["max_abs_diff_residuals"]
    assert d["numpy_rk4_vs_hil"] < 1e-6  # same scheme, same step: round-off
    assert d["lsoda_vs_hil"] < 0.05     # another integrator: close, not equal (noise sigmas)
    assert set(res["per_evaluation_cpu_s"]) == {"hil", "numpy_rk4", "lsoda"}
    assert all(len(v["repeats"]) == 3 for v in res["per_evaluation_cpu_s"].values())
    assert res["max_rel_diff_values_numpy_rk4_vs_hil_same_solve"] < 1e-6
    assert {r["peer_name"] for r in res["headline"] if "peer_name" in r} == {"same RK4 scheme and step in NumPy",
                                                                              "solve_ivp LSODA, restarted per sample"}
    goal = [r for r in res["headline"] if "goal" in r]  # the 60 s goal evaluated, not necessarily met
    assert len(goal) == 1 and goal[0]["goal"] == 60.0 and isinstance(goal[0]["met"], bool)
