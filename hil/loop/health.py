"""What can go wrong around the loop, noticed from inside it: alarms and their watches.

- `InputWatch`: the inputs' seqlock stuck odd (a writer died or hangs mid-write);
- `StateBounds`: plant states outside their spec bounds, counted per state;
- `ChildWatch`: helper processes (Modbus, OPC UA servers, recorder) that died.

Per-step calls (`InputWatch.torn`, `StateBounds.note`) do Python work only when something
is wrong; `ChildWatch.check` runs at the loop's status tick (every `loop.status_interval_s`
of wall time): one non-blocking waitpid per child.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

import numpy as np

# Exit codes of `hil run` (the CLI exits with RunSummary.exit_code).
EXIT_DONE = 0  # duration reached or stop requested
EXIT_DIVERGED = 1  # a plant state became NaN/inf
EXIT_CONFIG = 2  # bad configuration or usage; nothing started
EXIT_STATE_OUT_OF_BOUNDS = 3  # loop.on_state_out_of_bounds = "fail" and a state left its bounds
EXIT_PROCESS_DIED = 4  # a required helper process (Modbus/OPC UA server, recorder) died
# 5, 6, 7: a plant watch with action "fail" (the grid: blackout 5, unserved load 6, collapse 7)
EXIT_SAFETY_LOST = 8  # [safety] required: the safety process died (the run stops) or hung

# Consecutive torn input reads (one per step, each already retried) before the loop tries
# to repair the image: a writer's critical section is a few microseconds, so three whole
# periods of odd sequence mean it died or hangs.
REPAIR_AFTER_STEPS = 3


@dataclass
class Alarm:
    """One alarm: kind (stable identifier), source (signal or process), message for humans,
    and where it was raised (step index, sim time s)."""

    kind: str
    source: str
    message: str
    step: int
    sim_time_s: float
    active: bool = True

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class Alarms:
    """The run's alarm list: shown in the status line while active, all in the summary."""

    def __init__(self) -> None:
        self.items: list[Alarm] = []

    def raise_(self, kind: str, source: str, message: str, step: int, sim_time_s: float) -> Alarm:
        alarm = Alarm(kind, source, message, step, sim_time_s)
        self.items.append(alarm)
        return alarm

    def active(self) -> list[str]:
        return [a.message for a in self.items if a.active]

    def as_list(self) -> list[dict]:
        return [a.as_dict() for a in self.items]


class InputWatch:
    """The loop's inputs stuck mid-write: repair (dead writer) or report (hung writer).

    `torn(step, t)` is called after a torn read; it returns True when it repaired the image
    so that the loop reads again at once. Stale steps are those where the loop ran on held
    inputs past REPAIR_AFTER_STEPS because a live writer kept the lock.
    """

    def __init__(self, image, alarms: Alarms, repair_after: int = REPAIR_AFTER_STEPS):
        self.image = image
        self.alarms = alarms
        self.repair_after = repair_after
        self.run = 0  # consecutive torn reads
        self.stale_steps = 0
        self.repairs = 0  # repairs done by the loop itself
        self._stale: Alarm | None = None

    def torn(self, step: int, t_s: float) -> bool:
        self.run += 1
        if self.run < self.repair_after:
            return False
        repaired = self.image.repair_inputs()
        if repaired is None:  # a live writer holds the lock and has not finished
            self.stale_steps += 1
            if self._stale is None:
                self._stale = self.alarms.raise_(
                    "inputs_stale", "image",
                    f"inputs stale since step {step - self.run + 1}: a writer holds the image mid-write; "
                    "the loop holds the last inputs", step, t_s)
            return False
        if repaired:
            self.repairs += 1
            self.alarms.raise_(
                "input_writer_died", "image",
                f"a writer died mid-write (inputs torn for {self.run} steps): its write was rolled back at step {step}",
                step, t_s).active = False
        self.ok(step)
        return True

    def ok(self, step: int) -> None:
        """A read succeeded (call only when `run` is non-zero)."""
        self.run = 0
        if self._stale is not None:
            self._stale.active = False
            self._stale.message += f" (until step {step})"
            self._stale = None


class OutputWatches:
    """The plant's own watches on its true outputs (plants.base.OutputWatch): `y[i] > above`.

    `check(y, step, t_s)` costs one gather and compare per step; Python work happens only when
    a watch's condition changes. A "warn" watch raises an alarm (inactive again when the
    condition clears, raised anew when it returns) and adds one run warning per kind; a "fail"
    watch returns (kind, message, exit_code) so that the loop stops the run."""

    def __init__(self, spec, watches, alarms: Alarms):
        self.watches = tuple(watches)
        self.idx = np.array([spec.index("outputs", w.output) for w in self.watches], dtype=np.intp)
        self.above = np.array([float(w.above) for w in self.watches])
        self.on = np.zeros(len(self.watches), dtype=np.bool_)
        self.alarms = alarms
        self._alarm: dict[int, Alarm] = {}
        self.warned: list[str] = []

    def check(self, y: np.ndarray, step: int, t_s: float):
        hit = y[self.idx] > self.above
        if not (hit != self.on).any():
            return None
        stop = None
        for i in np.flatnonzero(hit != self.on):
            w, now = self.watches[i], bool(hit[i])
            self.on[i] = now
            if not now:
                if i in self._alarm:
                    self._alarm[i].active = False
                continue
            msg = (w.message or f"{w.output} = {{value}} above {w.above:g}").replace("{value}", f"{y[self.idx[i]]:.6g}")
            msg += f" at step {step} (t = {t_s:g} s)"
            self._alarm[i] = self.alarms.raise_(w.kind, w.output, msg, step, t_s)
            if w.action == "fail":
                stop = stop or (w.kind, msg, int(w.exit_code))
            elif w.kind not in {k for k, _ in self.warned}:
                self.warned.append((w.kind, msg))
        return stop


class StateBounds:
    """States outside [low, high] of the spec, with a slack of 1e-9 of each range (RK4
    rounding around a bound, e.g. a concentration at -1e-15, is not a physical violation)."""

    def __init__(self, spec, alarms: Alarms):
        self.names = spec.names("states")
        self.lo, self.hi = spec.lows("states"), spec.highs("states")
        self.tol = 1e-9 * (self.hi - self.lo)
        self.steps_out = np.zeros(spec.n_states, dtype=np.int64)
        self.alarms = alarms
        self._alarm: dict[int, Alarm] = {}
        self._base: dict[int, str] = {}

    def note(self, x: np.ndarray, step: int, t_s: float) -> str | None:
        """After a step with states out of bounds: alarm each newly out state; returns a
        message naming the first one out (for a run that fails on it)."""
        first = None
        for i in np.flatnonzero((x < self.lo - self.tol) | (x > self.hi + self.tol)):
            msg = (f"state {self.names[i]} = {x[i]:.6g} outside its bounds [{self.lo[i]:g}, {self.hi[i]:g}] "
                   f"at step {step} (t = {t_s:g} s)")
            first = first or msg
            if i not in self._alarm or not self._alarm[i].active:
                self._alarm[i] = self.alarms.raise_("state_out_of_bounds", self.names[i], msg, step, t_s)
                self._base[i] = msg
        return first

    def status(self, x: np.ndarray) -> None:
        """At a status tick: counts into the alarms' messages; alarms of states back in
        bounds become inactive (they stay in the summary)."""
        for i, alarm in self._alarm.items():
            alarm.message = self._base[i] + f" [{int(self.steps_out[i])} steps out]"
            if alarm.active and self.lo[i] - self.tol[i] <= x[i] <= self.hi[i] + self.tol[i]:
                alarm.active = False

    def counts(self) -> dict[str, int]:
        return {self.names[i]: int(n) for i, n in enumerate(self.steps_out) if n}


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class _Child:
    name: str
    process: object  # multiprocessing.Process (is_alive(), exitcode)
    required: bool
    dead: bool = False


class ChildWatch:
    """Helper processes the loop depends on; `check()` at each status tick."""

    def __init__(self, alarms: Alarms):
        self.alarms = alarms
        self.children: list[_Child] = []

    def add(self, name: str, process, required: bool) -> None:
        self.children.append(_Child(name, process, required))

    def check(self, step: int, t_s: float) -> list[str]:
        """Newly dead required children's messages (the run stops on them); alarms for all."""
        stop: list[str] = []
        for c in self.children:
            if c.dead or c.process.is_alive():
                continue
            c.dead = True
            how = describe_exit(c.process.exitcode)
            msg = f"{c.name} process died ({how}) at step {step}"
            self.alarms.raise_("process_died", c.name, msg, step, t_s)
            if c.required:
                stop.append(msg)
        return stop

    def dead(self) -> dict[str, str]:
        return {c.name: describe_exit(c.process.exitcode) for c in self.children if c.dead}

    def is_dead(self, name: str) -> bool:
        return any(c.dead for c in self.children if c.name == name)
