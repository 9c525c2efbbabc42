"""The garbage collector kept out of the loop's periods.

Choice: after set-up, `gc.freeze()` moves every object that exists (modules, config,
numpy arrays' owners, Numba dispatchers) into the permanent generation, so no collection
ever traverses them again; then `gc.disable()` stops automatic collections, which
CPython triggers from allocation counts at whatever point of a step the 700th container
happens to be allocated. The loop instead collects the young generation explicitly at its
status tick (every `loop.status_interval_s` of wall time, right after a step's publish,
in the slack before the next deadline), and generation 1 every 10th tick. Both are
bounded by what was allocated since the last tick (a few status dicts and bus messages:
tens of microseconds), and each pause is timed and reported (`gc` in the summary). A
full collection never runs while the loop runs; `end()` re-enables the collector.

Why not leave automatic collection on with a frozen heap: it would still stop the loop at
an unplanned instant, possibly mid-step right before a deadline; the explicit tick puts
the pause where the loop can afford it and makes it measurable.
"""

from __future__ import annotations

import gc
import time


class LoopGc:
    def __init__(self) -> None:
        self.was_enabled = gc.isenabled()
        self.frozen = 0
        self.collections = 0
        self.pause_max_ns = 0
        self.pause_total_ns = 0
        self._ticks = 0
        self.active = False

    def begin(self) -> None:
        """After set-up, before the first deadline: collect once, freeze, disable."""
        gc.collect()
        gc.freeze()
        self.frozen = gc.get_freeze_count()
        gc.disable()
        self.active = True

    def tick(self) -> None:
        """At a status tick: collect generation 0 (every 10th tick: 1), timed."""
        self._ticks += 1
        t0 = time.perf_counter_ns()
        gc.collect(1 if self._ticks % 10 == 0 else 0)
        dt = time.perf_counter_ns() - t0
        self.collections += 1
        self.pause_total_ns += dt
        self.pause_max_ns = max(self.pause_max_ns, dt)

    def end(self) -> None:
        if not self.active:
            return
        self.active = False
        gc.unfreeze()
        if self.was_enabled:
            gc.enable()

    def summary(self) -> dict:
        return {"frozen_objects": self.frozen, "collections": self.collections,
                "pause_max_us": round(self.pause_max_ns * 1e-3, 1),
                "pause_total_us": round(self.pause_total_ns * 1e-3, 1)}
