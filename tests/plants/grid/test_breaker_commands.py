"""Breaker command semantics of the grid plant (`line.open_cmd`, `line.close_cmd`), as documented
in plants/grid/plant.py, docs/guides/grid.md and configs/grid118.toml: a latched breaker.
A command acts while it is set; clearing it leaves the breaker where it is; open wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from plants.base import Plant, load_plant

CASE14 = str(Path(__file__).resolve().parents[3] / "configs/grids/case14.m")


@pytest.fixture()
def p14():
    return Plant(load_plant("grid", {"case": CASE14}), dt=1.0)


def _set(p, name, v):
    p.u[p.spec.index("inputs", name)] = v


def _closed(p, line):
    p.compute_outputs()
    return p.y[p.spec.index("outputs", f"line_{line}.closed")]


def test_open_pulse_opens_and_the_breaker_stays_open_when_cleared(p14):
    assert _closed(p14, 13) == 1.0
    _set(p14, "line_13.open_cmd", 1.0)
    p14.step(1.0)
    assert _closed(p14, 13) == 0.0
    _set(p14, "line_13.open_cmd", 0.0)          # cleared: no effect on the breaker (not a level)
    for _ in range(3):
        p14.step(1.0)
        assert _closed(p14, 13) == 0.0
    _set(p14, "line_13.close_cmd", 1.0)          # a close pulse closes it (no trip: no cooldown)
    p14.step(1.0)
    assert _closed(p14, 13) == 1.0
    _set(p14, "line_13.close_cmd", 0.0)          # cleared: stays closed
    p14.step(1.0)
    assert _closed(p14, 13) == 1.0
    # commands only: protection opened nothing on the way
    assert all(_closed(p14, k) == 1.0 for k in range(1, 21))


def test_open_held_wins_over_close_and_locks_the_breaker_out(p14):
    _set(p14, "line_13.open_cmd", 1.0)
    _set(p14, "line_13.close_cmd", 1.0)
    for _ in range(3):
        p14.step(1.0)
        assert _closed(p14, 13) == 0.0
    _set(p14, "line_13.open_cmd", 0.0)           # lock-out released while close is still set: closes
    p14.step(1.0)
    assert _closed(p14, 13) == 1.0
