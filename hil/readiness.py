"""Readiness by handshake, with bounds that hold on a loaded machine.

A child process (policy, safety, server, recorder, proxy) is ready when it says so (a status
file, an event, a line on stdout). How long that takes depends on the machine: 2 s on an idle
one, a minute at a load average of 8 on 2 cores (imports, Numba caches, key files). A fixed
30 s bound is a guess that fails on a busy machine. Here the wait ends:

- at once when the handshake arrives (ready);
- at once when a child exits before it (it died: nothing to wait for);
- when the children make no progress for `stall_s` wall seconds: their CPU time (utime +
  stime from /proc/<pid>/stat, every thread) did not move, so the child is stuck, not slow.
  A starved child on a loaded machine still gets its share of a CPU and moves on;
- at `max_s` wall seconds in any case (a child that keeps computing and never answers).

    from hil.readiness import wait_ready
    why = wait_ready(lambda: path.exists(), [proc.pid], alive=lambda: proc.poll() is None)
    if why is not None:
        raise RuntimeError(f"policy did not come up: {why}")

Units: wall seconds throughout.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable

STALL_S = 60.0  # wall s without CPU progress of any child: stuck
MAX_S = 900.0  # wall s in any case
POLL_S = 0.02

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, s) a process has used so far; None if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:  # the fields after the command name, which may hold spaces and parentheses
        fields = stat[stat.rindex(b")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)
    except (ValueError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """The children of a process, theirs, ... (from /proc/<pid>/task/<tid>/children; [] if unreadable)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


class Progress:
    """Whether a set of processes is moving: the wall time since their CPU time last changed.
    `tree`: count their descendants too (a `hil run` whose servers are starting)."""

    def __init__(self, pids: Iterable[int], now: float | None = None, tree: bool = False):
        self.pids = list(pids)
        self.tree = tree
        self._last = self._total()
        self._since = time.monotonic() if now is None else now

    def _total(self) -> float | None:
        pids = self.pids + [d for p in self.pids for d in descendants(p)] if self.tree else self.pids
        vals = [cpu_seconds(p) for p in pids]
        known = [v for v in vals if v is not None]
        return sum(known) if known else None

    def stalled_s(self, now: float | None = None) -> float:
        """Wall s since the processes last used CPU (0.0 right after they did). Without /proc
        (another OS) progress cannot be seen: the time since the start counts, so only `max_s`
        of a caller bounds the wait and `stall_s` should not be shorter than it would be."""
        now = time.monotonic() if now is None else now
        total = self._total()
        if total is not None and total != self._last:
            self._last, self._since = total, now
        return now - self._since


def wait_ready(ready: Callable[[], bool], pids: Iterable[int], alive: Callable[[], bool], *,
               stall_s: float = STALL_S, max_s: float = MAX_S, poll_s: float = POLL_S,
               wait: Callable[[float], bool] | None = None, tree: bool = False) -> str | None:
    """Wait until `ready()`; None when it is, else the reason it never will be (a sentence).

    `alive()`: False as soon as a child has exited. `wait(timeout)`: how to sleep between checks
    (e.g. an Event's wait, which returns True when it is set); default time.sleep. `tree`: the
    progress of the processes' descendants counts too."""
    t0 = time.monotonic()
    prog = Progress(pids, t0, tree=tree)
    while True:
        if ready():
            return None
        if not alive():
            return "it exited before it was ready" if not ready() else None
        now = time.monotonic()
        if now - t0 >= max_s:
            return f"not ready after {now - t0:.0f} s (max_s {max_s:g} s), still running"
        if prog.stalled_s(now) >= stall_s:
            return (f"no progress for {stall_s:g} s (its CPU time did not move; {now - t0:.0f} s since the start): "
                    f"stuck")
        if wait is not None:
            if wait(poll_s):
                continue
        else:
            time.sleep(poll_s)
