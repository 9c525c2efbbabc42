"""benchmarks/fair.py: interleaved blocks in rotated order, per-item figures, >= 3 repeats."""

import pytest

from .conftest import load

fair = load("fair")


def test_blocks_are_interleaved_with_the_order_rotated():
    calls = []
    sides = {n: (lambda n=n: calls.append(n)) for n in ("a", "b", "c")}
    r = fair.interleaved(sides, {"a": 1, "b": 2, "c": 4}, blocks=3, repeats=3, warmup=False)
    assert calls[:9] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # repeat 0: rotated at every block
    assert calls[9:12] == ["b", "c", "a"]  # repeat 1 starts one further on
    assert len(calls) == 27
    assert set(r) == {"a", "b", "c"} and all(len(v["repeats"]) == 3 for v in r.values())
    assert all(v["min"] <= v["median"] <= v["max"] for v in r.values())


def test_figures_are_per_item_of_the_clock():
    ticks = iter(range(0, 10**9, 1000))  # every clock read advances 1000 ns: each block lasts 1 us
    r = fair.interleaved({"x": lambda: None, "y": lambda: None}, {"x": 1, "y": 4}, blocks=2, repeats=3,
                         clock=lambda: next(ticks), warmup=False)
    assert r["x"]["median"] == 1.0 and r["y"]["median"] == 0.25
    assert fair.ratio(r["x"], r["y"]) == 4.0


def test_warmup_runs_every_side_once_untimed_and_bad_arguments_are_refused():
    n = {"a": 0}

    def a():
        n["a"] += 1

    fair.interleaved({"a": a}, {"a": 1}, blocks=2, repeats=3)
    assert n["a"] == 1 + 2 * 3
    with pytest.raises(ValueError, match=">= 3"):
        fair.interleaved({"a": a}, {"a": 1}, blocks=2, repeats=2)
    with pytest.raises(ValueError, match="items per block"):
        fair.interleaved({"a": a, "b": a}, {"a": 1}, blocks=2, repeats=3)
