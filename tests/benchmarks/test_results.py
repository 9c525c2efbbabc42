"""benchmarks/results.py: smoke results are never stored; the table shows the headline rows."""

import json
import sys

import pytest

from .conftest import load

results = load("results")


@pytest.fixture
def tmp_results(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    return tmp_path


def test_quick_results_are_refused(tmp_results):
    with pytest.raises(results.SmokeResult, match="quick"):
        results.write("x", {"quick": True, "a": 1})
    assert not list(tmp_results.glob("*.json"))
    cmd = [sys.executable, "-c", "import json; print(json.dumps({'quick': True}))"]
    assert results.record("x", cmd) == 1 and not list(tmp_results.glob("*.json"))


def test_record_stores_and_tables_the_headline(tmp_results):
    row = {"figure": "f", "hil": 2.0, "peer": 1.0, "peer_name": "p", "ratio": 0.5, "unit": "us", "goal": 1.0, "met": False}
    cmd = [sys.executable, "-c", f"import json; print(json.dumps({{'quick': False, 'headline': [{row!r}]}}))"]
    assert results.record("x", cmd) == 0
    doc = json.loads((tmp_results / "x.json").read_text())
    assert doc["result"]["headline"][0]["ratio"] == 0.5 and doc["meta"]["benchmark"] == "x"
    md = (tmp_results / "README.md").read_text()
    assert "| f | 2.00 us | 1.00 us (p) | 0.5000 | 1.00 | **no** |" in md


@pytest.mark.parametrize("headline", [{"shield_kernel_us": 8.8}, [{"hil": 1.0}], ["row"]])
def test_a_malformed_headline_is_refused_naming_the_benchmark(tmp_results, headline):
    with pytest.raises(results.SmokeResult, match="shield: .*headline"):
        results.write("shield", {"headline": headline})
    assert not list(tmp_results.glob("*.json"))
