"""Live runs announced for viewers: how `hil dashboard SCENARIO|RUN_DIR` finds a running loop.

A run started by `hil run` or `hil demo` announces itself in this user's live-run directory
(beside the run index of hil/run_dirs.py: `$XDG_RUNTIME_DIR/hil/live/` or
`~/.cache/hil/live/`, 0700), with two files named after the scenario and the loop's pid:

    <scenario>.<pid>.json        written once: process image name, recording directory,
                                 safety status file and decision log, scenario (as run)
    <scenario>.<pid>.stats.json  rewritten at each status tick (loop.status_interval_s, from
                                 hil/loop/stats_writer.py's child process in real time, the
                                 status thread in lockstep; never the loop's): steps, simulated and
                                 wall time, overruns, late steps, active alarms, the lateness
                                 histogram (non-empty buckets: [low us, count])

Both are written atomically and removed when the run ends; files whose pid is gone are
ignored and pruned by `find`. A viewer never talks to the loop: it reads these files and
the process image (hil/image.py), so attaching one costs the loop nothing.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import numpy as np

from hil.atomic import write_json_atomic
from hil.processes import process_alive


def live_dir() -> str:
    """This user's live-run directory (see the module docstring)."""
    from hil.run_dirs import index_path

    return os.path.join(os.path.dirname(index_path()), "live")


def _paths(scenario_name: str, pid: int) -> tuple[str, str]:
    base = os.path.join(live_dir(), f"{scenario_name}.{pid}")
    return base + ".json", base + ".stats.json"


def histogram_buckets(counts: np.ndarray) -> list[list[float]]:
    """[[bucket low (us), count], ...] of the non-empty buckets of a hil.loop.stats histogram."""
    from hil.loop.stats import bucket_low

    idx = np.flatnonzero(counts)
    return [[float(lo) * 1e-3, int(c)] for lo, c in zip(bucket_low(idx), counts[idx])]


class Announcement:
    """A run's entry in the live-run directory (the runtime owns one while it runs)."""

    def __init__(self, runtime) -> None:
        sc = runtime.scenario
        os.makedirs(live_dir(), mode=0o700, exist_ok=True)
        self.info_path, self.stats_path = _paths(sc.name, os.getpid())
        handles = runtime._policy_handles
        self.info = {
            "scenario": sc.name,
            "pid": os.getpid(),
            "image": runtime.image.name,
            "lockstep": runtime.lockstep,
            "step_s": runtime.step_s,
            "period_s": 0.0 if runtime.lockstep else sc.loop.period_s,
            "record_path": str(Path(runtime.record_path).resolve()) if runtime.record_path else None,
            "scenario_path": str(Path(runtime.scenario_path).resolve()) if runtime.scenario_path else None,
            "decision_log": str(Path(handles.decision_log).resolve()) if handles is not None else None,
            "safety_status": str(Path(handles.status_path).resolve()) if handles is not None else None,
            "scenario_config": sc.model_dump(mode="json"),
            "stats": self.stats_path,
        }
        write_json_atomic(self.info_path, self.info)

    def update(self, status: dict) -> None:
        """Write a status snapshot (the status thread calls this; `lateness_counts` is a copy)."""
        out = {k: v for k, v in status.items() if k != "lateness_counts"}
        counts = status.get("lateness_counts")
        if counts is not None:
            out["lateness_hist_us"] = histogram_buckets(counts)
        write_json_atomic(self.stats_path, out)

    def withdraw(self) -> None:
        for p in (self.info_path, self.stats_path):
            try:
                os.unlink(p)
            except OSError:
                pass


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def live_entries() -> list[dict]:
    """Every live run of this user (newest first); entries of dead runs are removed."""
    out = []
    for path in glob.glob(os.path.join(live_dir(), "*.json")):
        if path.endswith(".stats.json"):
            continue
        info = _read(path)
        if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
            continue
        if not process_alive(info["pid"]):
            for p in (path, info.get("stats") or ""):
                try:
                    os.unlink(p)
                except OSError:
                    pass
            continue
        info["_mtime"] = os.path.getmtime(path)
        out.append(info)
    return sorted(out, key=lambda e: -e["_mtime"])


def find(scenario_name: str | None = None, record_dir: str | None = None, pid: int | None = None) -> dict | None:
    """The newest live run of the scenario / recording into `record_dir` / of loop pid `pid`."""
    rec = str(Path(record_dir).resolve()) if record_dir else None
    for e in live_entries():
        if scenario_name is not None and e["scenario"] != scenario_name:
            continue
        if rec is not None and e.get("record_path") != rec:
            continue
        if pid is not None and e["pid"] != pid:
            continue
        return e
    return None


def read_stats(entry: dict) -> dict | None:
    """The run's latest status snapshot, or None (not written yet, or the run is gone)."""
    return _read(entry["stats"]) if entry.get("stats") else None
