"""Timing shared by the peer comparisons: interleaved blocks, rotated order, CPU time, repeats.

The rules (benchmarks/README.md): every side runs the same work; within a repeat the sides run
block by block, interleaved, the order rotated at every block, so a burst of load from another
process hits every side alike; each block is timed in CPU time (this thread's, or the whole
process's for a side that runs on several threads); a repeat's figure is the median of its
blocks, and the result is the median over >= 3 repeats with its spread (min, max).
Figures are per item (per call, per state, per instance-step: the caller says how many items
one block does), in microseconds.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

THREAD = time.thread_time_ns    # CPU time of the calling thread (ns)
PROCESS = time.process_time_ns  # CPU time of every thread of this process (ns)


def summary(values: list[float]) -> dict:
    """Median, min, max and every value (the spread over repeats)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "repeats": [round(v, 4) for v in values]}


def interleaved(sides: dict[str, Callable[[], object]], items: dict[str, int], blocks: int, repeats: int,
                clock: Callable[[], int] = THREAD, warmup: bool = True) -> dict[str, dict]:
    """CPU microseconds per item of each side: {name: summary over repeats}.

    sides: name -> a callable running one block of that side's work; items: name -> how many
    items (calls, states, instance-steps) one block does. Every side runs once untimed first
    (``warmup``: compilation, caches, first-touch), then ``repeats`` x ``blocks`` timed blocks
    in rotated order.
    """
    if repeats < 3:
        raise ValueError(f"repeats must be >= 3 (got {repeats}): a median and a spread need three")
    if blocks < 1:
        raise ValueError(f"blocks must be >= 1 (got {blocks})")
    names = list(sides)
    missing = [n for n in names if items.get(n, 0) <= 0]
    if missing:
        raise ValueError(f"items per block missing or not positive for: {missing}")
    if warmup:
        for n in names:
            sides[n]()
    per_repeat: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(repeats):
        samples: dict[str, list[float]] = {n: [] for n in names}
        for b in range(blocks):
            k = (b + rep) % len(names)
            for n in names[k:] + names[:k]:
                c0 = clock()
                sides[n]()
                samples[n].append((clock() - c0) / 1e3 / items[n])
        for n in names:
            per_repeat[n].append(statistics.median(samples[n]))
    return {n: summary(v) for n, v in per_repeat.items()}


def ratio(peer: dict, hil: dict) -> float:
    """peer / hil of the medians (> 1: hil takes less time)."""
    return peer["median"] / hil["median"]
