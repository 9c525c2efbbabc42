"""benchmarks/shield.py runs (--quick) and its comparison is on identical work: the shield and
the safety process's projection gave the same actions (the script exits non-zero otherwise), on
both proposal mixes, with the envelope acting in the adversarial one. No speed is asserted."""

from tests.benchmarks.conftest import load, run_quick


def test_shield_benchmark_compares_identical_work():
    out = run_quick("shield")
    assert set(out["mixes"]) == {"typical", "adversarial"}
    assert out["limit_rows"] >= 30 and out["actions"] == 8
    for mix in out["mixes"].values():
        assert mix["max_abs_diff_over_span"] <= 1e-9
        for side in ("old_projection_us", "shield_python_us", "shield_kernel_us"):
            assert len(mix[side]["repeats"]) >= 3 and mix[side]["median"] > 0
    assert out["mixes"]["adversarial"]["sources"].get("projected", 0) > 0
    assert isinstance(out["goal_met"], bool)
    results = load("results")
    results.check_headline("shield", out)  # rows the generated table can show
    goals = [r for r in out["headline"] if "goal" in r]
    assert len(goals) == 4 and all(isinstance(r["met"], bool) for r in goals)  # 2 kernel mixes + 2 real-time goals
