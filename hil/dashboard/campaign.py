"""The dashboard's campaign view: progress of `hil campaign run` from its progress.json.

The campaign driver rewrites `<out>/progress.json` after every finished run
(hil/campaign/runner.py CampaignProgress): total, done, pass/fail, the latest results, state. A frame
is that file as last read (re-read when its modification time changes), so watching a
campaign costs its workers nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hil.processes import process_alive


class CampaignSampler:
    """Frames of one campaign output directory (same interface as dashboard.sampler.Sampler)."""

    def __init__(self, out_dir: str):
        self.path = Path(out_dir) / "progress.json"
        self.entry = {"pid": None, "campaign_dir": str(Path(out_dir).resolve())}
        self._mtime = None
        self._data: dict = {}
        self._read()

    def _read(self) -> dict:
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime != self._mtime:
                self._data = json.loads(self.path.read_text())
                self._mtime = mtime
                self.entry["pid"] = self._data.get("pid")
        except (OSError, ValueError):  # not written yet, or mid-replace: the last one read
            pass
        return self._data

    def run_alive(self) -> bool:
        pid = self.entry.get("pid")
        return isinstance(pid, int) and process_alive(pid)

    def close(self) -> None:
        pass

    def frame(self) -> dict:
        d = dict(self._read())
        state = d.get("state", "waiting")
        if state == "running" and not self.run_alive():
            state = "interrupted (driver gone)"
        return {"type": "frame", "campaign": d, "loop_state": state, "t_s": d.get("elapsed_s"),
                "step": d.get("done", 0)}


def attach_campaign(out_dir: str):
    """(CampaignSampler, hello) for a campaign output directory."""
    samp = CampaignSampler(out_dir)
    name = samp._data.get("campaign") or Path(out_dir).name
    hello = {"type": "hello", "campaign": True, "scenario": f"campaign {name}", "plant": "", "pid": samp.entry["pid"],
             "lockstep": True, "has_safety": False, "names": {"y": [], "u": []}, "units": {"y": [], "u": []},
             "groups": {"y": {}, "u": {}}, "panels": [], "record_path": samp.entry["campaign_dir"]}
    return samp, hello


def is_campaign_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "campaign.json")) or os.path.isfile(os.path.join(path, "progress.json"))
