"""IEC 60870-5-104 information objects against the process image, free of any 104 library:
what a monitor point reports and when (deadbands), and what a command does to the image.

`Monitor.update(outputs)` takes one published output vector and returns, per monitor point,
its value as served (measured: the output in plant units; double point: 1.0 ON, 0.0 OFF,
NaN INDETERMINATE) and two masks:
- changed: the value differs from the one served until now (the server updates the object, so a
  general interrogation returns the image's values),
- spontaneous: the value moved by more than the point's absolute deadband from the value last
  reported spontaneously (|v - last| > deadband, plant unit; a double point on every state
  change), or it became or stopped being a number (the quality IV changes). Only these are
  transmitted with cause SPONTANEOUS, and only they move the reference `last`.

`Commands.apply(ioa, value, pulse=False)` checks a command and writes it as one atomic image
write, or returns why not (a reason key counted in `refused`): the image was never published
(the loop has not started: no command is taken before its first step), an IOA that is no
command point, a value that is not a number or lies outside the input's physical bounds, a
double command state that is neither ON nor OFF. A refused command never touches the image.

Pulses: a single or double command with the qualifier short or long pulse (QU 1 / 2) is
written as above and later released: `release_pulses()` (called by the server's sampler) puts
its inputs back to their low bounds once the loop has read the write (the image's applied-write
count reached it), so the plant sees the command in at least one step, as a pulse relay would
give it. An input another write changed in between is left alone. Without a pulse qualifier
(QU 0 "no additional definition", 3 persistent) a command holds.
"""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np

from hil.image import H_IN_APPLIED_WRITES, H_OUT_SEQ, InputsStale, ProcessImage
from hil.tagmap.iec104 import Point

ON, OFF = "ON", "OFF"


class Monitor:
    """Deadband bookkeeping of the monitor points (measured values and double points)."""

    def __init__(self, points: list[Point]):
        self.points = [p for p in points if not p.is_command]
        n = len(self.points)
        self.index = np.array([p.index for p in self.points], dtype=np.intp)
        self.deadband = np.array([p.deadband for p in self.points], dtype=np.float64)
        self.is_double = np.array([p.type == "double_point" for p in self.points], dtype=bool)
        self.threshold = np.array([p.threshold if p.type == "double_point" else 0.0 for p in self.points])
        self.current = np.full(n, np.nan)   # as served now (GI)
        self.last = np.full(n, np.nan)      # as last reported spontaneously

    def served_values(self, outputs: np.ndarray) -> np.ndarray:
        """The points' values from an output vector: measured as is, double points 1.0/0.0/NaN."""
        v = outputs[self.index].astype(np.float64, copy=True)
        dp = self.is_double
        if dp.any():
            x = v[dp]
            v[dp] = np.where(np.isnan(x), np.nan, (x >= self.threshold[dp]).astype(np.float64))
        return v

    def update(self, outputs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, changed, spontaneous) for one published output vector (see the module doc)."""
        v = self.served_values(outputs)
        nan_v, nan_cur, nan_last = np.isnan(v), np.isnan(self.current), np.isnan(self.last)
        changed = (nan_v != nan_cur) | (~nan_v & ~nan_cur & (v != self.current))
        with np.errstate(invalid="ignore"):
            moved = np.abs(v - self.last) > self.deadband
        spontaneous = (nan_v != nan_last) | (~nan_v & ~nan_last & moved)
        self.current = v
        self.last = np.where(spontaneous, v, self.last)
        return v, changed, spontaneous


class Commands:
    """Checks and applies commands to the image; thread-safe counters (the 104 library calls
    back from its own thread)."""

    def __init__(self, points: list[Point], image: ProcessImage):
        self.by_ioa = {p.ioa: p for p in points if p.is_command}
        self.image = image
        self.accepted = 0
        self.refused: Counter = Counter()
        self.pulses = 0
        self.last_write_seq = -1
        self._pending: list[tuple[int, list[int], list[float], list[float]]] = []  # seq, indices, written, low
        self._lock = threading.Lock()
        # the image's writers' lock is an flock, which does not exclude two threads of one process
        # (c104's callback thread and the sampler releasing pulses): they take this one first
        self._write_lock = threading.Lock()

    def published(self) -> bool:
        """The loop published its outputs at least once: there is a loop to take a command."""
        return int(self.image.header[H_OUT_SEQ]) > 0

    def plan(self, ioa: int, value) -> tuple[list[int], list[float]] | str:
        """(input indices, values) a command would write, or the reason it is refused."""
        p = self.by_ioa.get(ioa)
        if p is None:
            return "unknown_ioa"
        if p.type == "setpoint":
            try:
                x = float(value)
            except (TypeError, ValueError):
                return "not_a_number"
            if x != x or x in (float("inf"), float("-inf")):
                return "not_a_number"
            if not p.low <= x <= p.high:
                return "out_of_range"
            return [p.index], [x]
        if p.type == "single_command":
            return [p.index], [p.high if bool(value) else p.low]
        state = getattr(value, "name", value)
        if state == ON:
            return [p.index, p.off_index], [p.high, p.off_low]
        if state == OFF:
            return [p.index, p.off_index], [p.low, p.off_high]
        return "invalid_state"

    def apply(self, ioa: int, value, pulse: bool = False) -> str | None:
        """Write the command to the image: None if done, else the reason it was refused.
        pulse: a single or double command released after the loop read it (module doc)."""
        why = "not_started" if not self.published() else None
        plan = self.plan(ioa, value) if why is None else why
        if isinstance(plan, str):
            return self._count(plan)
        try:
            with self._write_lock:
                seq = self.image.write_inputs(*plan)
        except InputsStale:
            return self._count("image_busy")
        p = self.by_ioa[ioa]
        with self._lock:
            self.accepted += 1
            self.last_write_seq = seq
            if pulse and p.type != "setpoint":
                low = [p.low] if p.type == "single_command" else [p.low, p.off_low]
                self._pending.append((seq, plan[0], plan[1], low))
        return None

    def release_pulses(self) -> int:
        """Put the inputs of pulse commands the loop has read back to their low bounds; returns
        how many commands were released."""
        with self._lock:
            if not self._pending:
                return 0
            taken = int(self.image.header[H_IN_APPLIED_WRITES])
            due = [x for x in self._pending if x[0] <= taken]
            self._pending = [x for x in self._pending if x[0] > taken]
        if not due:
            return 0
        with self._write_lock:
            now = self.image.read_inputs()
            indices, values = [], []
            for _, idx, written, low in due:
                for i, w, lo in zip(idx, written, low):
                    if now[i] == w and w != lo:        # still ours, and not already low
                        indices.append(i)
                        values.append(lo)
            if indices:
                try:
                    self.image.write_inputs(indices, values)
                except InputsStale:                    # try again at the next sample
                    with self._lock:
                        self._pending = due + self._pending
                    return 0
        with self._lock:
            self.pulses += len(due)
        return len(due)

    def _count(self, reason: str) -> str:
        with self._lock:
            self.refused[reason] += 1
        return reason

    def count_refused(self, reason: str) -> None:
        """A command the 104 library refused before it reached `apply` (unknown IOA, wrong type)."""
        self._count(reason)

    def counters(self) -> dict:
        with self._lock:
            return {"commands_accepted": self.accepted, "commands_refused": dict(sorted(self.refused.items())),
                    "pulses_released": self.pulses}
