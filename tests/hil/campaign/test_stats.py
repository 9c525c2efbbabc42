import math

from scipy.stats import binom

from hil.campaign.stats import clopper_pearson_lower, summarize


def test_clopper_pearson_200_of_200():
    lo = clopper_pearson_lower(200, 200, 0.95)
    assert math.isclose(lo, 0.05 ** (1 / 200), rel_tol=1e-9)  # k = n: (alpha)^(1/n) = 0.98513
    assert f"{100 * lo:.1f}" == "98.5"


def test_clopper_pearson_is_the_exact_binomial_bound():
    lo = clopper_pearson_lower(17, 20, 0.95)
    # P(X >= 17 | n=20, p=lo) = 0.05 exactly at the bound
    assert math.isclose(binom.sf(16, 20, lo), 0.05, rel_tol=1e-6)
    assert clopper_pearson_lower(0, 20) == 0.0


def test_summary_counts_and_worst_run():
    res = [{"run": {"run_id": f"r{i}"}, "criteria": {"c": {"status": "pass", "value": float(i)},
                                                       "d": {"status": "n/a", "value": None}}}
           for i in range(5)]
    res[3]["criteria"]["c"] = {"status": "fail", "value": 0.1}
    s = summarize(res)
    assert s["c"]["passed"] == 4 and s["c"]["runs"] == 5 and s["c"]["failed"] == ["r3"]
    assert s["c"]["worst_run"] == "r3" and s["d"]["runs"] == 0
    assert s["c"]["sentence"].startswith("held in 4/5 runs: >= ")


def test_worst_run_is_the_smallest_margin():
    res = [{"run": {"run_id": f"r{i}"}, "criteria": {"titer": {"status": "pass", "value": 0.2 + i * 0.01,
                                                              "margin": i * 0.01 + 0.005}}} for i in range(4)]
    assert summarize(res)["titer"]["worst_run"] == "r0"  # lowest titer = closest to its minimum
