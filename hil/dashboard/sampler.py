"""What the dashboard shows, read from files and shared memory: never from the loop itself.

Each call of `Sampler.frame()` (at most `rate_hz` times per second, in the dashboard's own
process) reads:
- the process image (hil/image.py): a seqlock-consistent copy of the outputs as served and
  the inputs as applied, with the step and simulated time. Reading takes no lock the loop
  waits on: the loop never notices a reader;
- the run's status snapshot (hil/live_runs.py, written off the loop's thread every
  loop.status_interval_s): overruns, late steps, lateness histogram, the loop's alarms;
- the safety process's status file (mode, acting source, policy version, alarms, gate),
  when its modification time changed;
- the decision log's new lines since the last frame (bounded per frame): events (mode
  changes, rollbacks, alarms, acknowledgements, refused promotions) and the count of each
  source of the applied action (policy, projected, fallback and why).
Non-finite numbers travel as null (JSON has no NaN).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, deque

import numpy as np

from hil.image import ProcessImage
from hil.live_runs import read_stats
from hil.processes import process_alive

MAX_LOG_BYTES_PER_FRAME = 1 << 20  # a long log is caught up over several frames
EVENTS_KEPT = 50


def finite_list(a: np.ndarray) -> list:
    """A float array as a list with NaN/inf as None (JSON null)."""
    return [v if math.isfinite(v) else None for v in a.tolist()]


class DecisionLogTail:
    """New records of a JSONL decision log, read incrementally (a partial last line waits)."""

    def __init__(self, path: str | None):
        self.path = path
        self.offset = 0
        self.pending = b""
        self.sources: Counter = Counter()
        self.events: deque = deque(maxlen=EVENTS_KEPT)
        self.last_decision: dict | None = None

    def poll(self) -> bool:
        """Read what was appended; True if anything new was read."""
        if not self.path:
            return False
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(MAX_LOG_BYTES_PER_FRAME)
        except OSError:
            return False
        if not data:
            return False
        self.offset += len(data)
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            ev = rec.get("event")
            if ev == "decision":
                self.sources[str(rec.get("source"))] += 1
                self.last_decision = {"t_s": rec.get("t_s"), "source": rec.get("source"),
                                      "clips": len(rec.get("clips") or ())}
            elif ev not in ("start", "stop"):
                self.events.append({"t_s": rec.get("t_s"), "event": ev,
                                    "reason": str(rec.get("reason") or rec.get("mode") or "")})
        return True

    def summary(self) -> dict:
        return {"sources": dict(self.sources), "events": list(self.events), "last_decision": self.last_decision}


class Sampler:
    """Frames of one live run (`entry`: hil.live_runs) for the panels' series."""

    def __init__(self, entry: dict):
        self.entry = entry
        self.image = ProcessImage.attach(entry["image"])
        self.log = DecisionLogTail(entry.get("decision_log"))
        self._safety_mtime = None
        self._safety: dict | None = None
        self._stats_mtime = None
        self._stats: dict | None = None

    def close(self) -> None:
        if self.image is not None:
            self.image.close()
            self.image = None

    def run_alive(self) -> bool:
        return process_alive(self.entry["pid"])

    def _file_if_changed(self, path: str | None, attr: str) -> dict | None:
        if not path:
            return None
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return getattr(self, attr)
        if mtime != getattr(self, attr + "_mtime"):
            try:
                with open(path) as f:
                    setattr(self, attr, json.load(f))
                setattr(self, attr + "_mtime", mtime)
            except (OSError, ValueError):  # mid-replace: next frame
                pass
        return getattr(self, attr)

    def frame(self) -> dict:
        snap = self.image.snapshot()
        alive = self.run_alive()
        loop_state = self.image.counters()["loop_state"]
        stats = self._file_if_changed(self.entry.get("stats"), "_stats") if alive else self._stats
        if stats is None and alive:
            stats = read_stats(self.entry)
        self.log.poll()
        safety = self._file_if_changed(self.entry.get("safety_status"), "_safety")
        return {
            "type": "frame",
            "step": snap.step,
            "t_s": snap.sim_time_s,
            "loop_state": loop_state if alive else f"{loop_state} (run ended)",
            "y": finite_list(snap.outputs),
            "u": finite_list(snap.applied),
            "stats": stats,
            "safety": _safety_view(safety),
            "decisions": self.log.summary(),
        }


def _safety_view(st: dict | None) -> dict | None:
    """The parts of the safety status the page shows."""
    if not st:
        return None
    fb = st.get("fallback") or {}
    gate = st.get("gate") or {}
    return {"mode": st.get("mode"), "source": st.get("source"), "version": st.get("version"),
            "t_s": st.get("t_s"), "fallback_active": bool(fb.get("active")), "fallback_reason": fb.get("reason"),
            "alarms": st.get("alarms") or [], "alarm_count": st.get("alarm_count", 0),
            "rolled_back": st.get("rolled_back") or [],
            "gate": {"mode": gate.get("mode"), "target": gate.get("target"), "passed": gate.get("passed"),
                     "reasons": gate.get("reasons") or []}}
