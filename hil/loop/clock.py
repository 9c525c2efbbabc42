"""The loop's clocks: real time on absolute deadlines, or lockstep with no wall clock.

Real time: step k starts at the deadline `t0 + k * period` (never `sleep(period)`, which
accumulates drift). The clock sleeps until `spin` before the deadline, then busy-waits the
last stretch, because a sleeping thread wakes up tens to hundreds of microseconds late.
Lateness (start of the step minus its deadline) goes into a histogram.

Overrun policy (as ros2_control): when a step starts a whole period or more late, the
missed deadlines are skipped and counted, never run back-to-back in a catch-up burst; the
next deadline is the first one still in the future.

Lockstep: `wait()` returns at once with zero lateness; simulated time advances by the same
step, so both modes share the loop's code path.
"""

from __future__ import annotations

import math
import time

from hil.loop.stats import LatencyHistogram


class RealtimeClock:
    """Absolute-deadline clock with sleep-then-spin wake-up.

    period_s: wall period (s). spin_s: busy-wait before each deadline (s); it costs
    spin_s / period_s of one core and should exceed the OS's wake-up error.
    """

    realtime = True

    def __init__(self, period_s: float, spin_s: float = 200e-6):
        if not (math.isfinite(period_s) and period_s >= 1e-9):
            raise ValueError(f"period_s = {period_s!r}: a real-time period must be finite and at least 1 ns")
        self.period_ns = int(round(period_s * 1e9))
        self.spin_ns = int(round(min(spin_s, period_s) * 1e9))
        self.lateness = LatencyHistogram()
        self.overruns = 0  # deadlines skipped because a step started a period or more late
        self.late_steps = 0  # steps that started a period or more late
        self.spin_ns_total = 0
        self.k = 0
        self.t0_ns = 0
        self.start_ns = 0

    def start(self, first_deadline_in_s: float = 0.0) -> None:
        """Set deadline 0 (`first_deadline_in_s` from now, default: one spin from now)."""
        delay = max(int(first_deadline_in_s * 1e9), self.spin_ns)
        self.start_ns = time.monotonic_ns()
        self.t0_ns = self.start_ns + delay
        self.k = 0

    def wait(self) -> int:
        """Block until deadline k, record lateness (ns), advance k; returns the lateness."""
        deadline = self.t0_ns + self.k * self.period_ns
        now = time.monotonic_ns()
        sleep_ns = deadline - self.spin_ns - now
        if sleep_ns > 0:
            time.sleep(sleep_ns * 1e-9)
            now = time.monotonic_ns()
        spin_from = now
        while now < deadline:
            now = time.monotonic_ns()
        self.spin_ns_total += now - spin_from
        late = now - deadline
        self.lateness.record(late)
        skipped = late // self.period_ns
        if skipped:
            self.late_steps += 1
            self.overruns += skipped
        self.k += 1 + skipped
        return late

    def elapsed_s(self) -> float:
        return (time.monotonic_ns() - self.start_ns) * 1e-9

    def spin_fraction(self) -> float:
        """Share of one core spent busy-waiting since start()."""
        wall = time.monotonic_ns() - self.start_ns
        return self.spin_ns_total / wall if wall > 0 else 0.0


class LockstepClock:
    """No wall clock: each wait() returns at once; deterministic runs for a given seed."""

    realtime = False

    def __init__(self) -> None:
        self.lateness = LatencyHistogram()
        self.overruns = 0
        self.late_steps = 0
        self.k = 0
        self.start_ns = 0

    def start(self, first_deadline_in_s: float = 0.0) -> None:
        self.start_ns = time.monotonic_ns()
        self.k = 0

    def wait(self) -> int:
        self.k += 1
        return 0

    def elapsed_s(self) -> float:
        return (time.monotonic_ns() - self.start_ns) * 1e-9

    def spin_fraction(self) -> float:
        return 0.0
