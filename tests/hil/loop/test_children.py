"""hil.loop.children.status_tick_stages: the status tick one stage per period (fake runtime)."""

import pytest

from hil.errors import RunStopped
from hil.loop.children import status_tick, status_tick_stages


class _Log(list):
    def rec(self, what, ret=None):
        self.append(what)
        return ret


class _Rt:
    def __init__(self, log, stop_reasons=()):
        self.log = log
        self.safety_watch = None
        self._policy_handles = None
        self.shield_in_loop = False
        self._stop = False
        outer = self

        class Children:
            def check(self, step, t_s):
                return log.rec("check", list(stop_reasons))

        class Gc:
            def tick(self):
                log.rec("gc")

        class Sink:
            def __init__(self, name):
                self.name = name

            def offer(self, status):
                log.rec(f"{self.name}:{status['steps']}")

        self.children, self.gc = Children(), Gc()
        self._reporter, self._stats_writer = Sink("reporter"), Sink("writer")
        outer._status = lambda steps: log.rec("snapshot", {"steps": steps})


def test_one_stage_per_next_supervision_first():
    log = _Log()
    stages = status_tick_stages(_Rt(log), 7, 0.7)
    next(stages)
    assert log == ["check"]
    next(stages)
    assert log == ["check", "gc"]
    next(stages)
    assert log == ["check", "gc", "snapshot"]
    assert next(stages, "end") == "end"
    assert log == ["check", "gc", "snapshot", "writer:7", "reporter:7"]


def test_a_dead_required_child_stops_at_the_first_stage_with_the_snapshot_handed_over():
    log = _Log()
    with pytest.raises(RunStopped):
        next(status_tick_stages(_Rt(log, stop_reasons=["recorder died"]), 3, 0.3))
    assert log == ["check", "snapshot", "writer:3", "reporter:3"]  # no collection on the way out


def test_status_tick_runs_every_stage_at_once():
    log = _Log()
    status_tick(_Rt(log), 5, 0.5)
    assert log == ["check", "gc", "snapshot", "writer:5", "reporter:5"]
