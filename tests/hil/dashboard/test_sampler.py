"""The dashboard's readers: the decision log read incrementally (partial lines wait), and a
live run's frame read from its process image and files, never from the loop."""

import json
import os

import numpy as np

from hil import live_runs
from hil.dashboard.sampler import DecisionLogTail, Sampler
from hil.image import ProcessImage


def test_decision_log_tail_counts_sources_and_keeps_events(tmp_path):
    log = tmp_path / "d.jsonl"
    tail = DecisionLogTail(str(log))
    assert not tail.poll()  # no file yet
    recs = [{"event": "start"}, {"event": "decision", "t_s": 1.0, "source": "policy"},
            {"event": "decision", "t_s": 2.0, "source": "fallback:confidence", "clips": [{}]},
            {"event": "mode", "t_s": 2.0, "mode": "advisory", "reason": "demoted: dashboard: x"}]
    text = "".join(json.dumps(r) + "\n" for r in recs)
    log.write_text(text[:-10])  # the last line is still being written
    assert tail.poll()
    assert tail.summary()["sources"] == {"policy": 1, "fallback:confidence": 1}
    assert tail.summary()["events"] == []
    with open(log, "a") as f:
        f.write(text[-10:])
    tail.poll()
    s = tail.summary()
    assert s["events"] == [{"t_s": 2.0, "event": "mode", "reason": "demoted: dashboard: x"}]
    assert s["last_decision"] == {"t_s": 2.0, "source": "fallback:confidence", "clips": 1}


def test_frame_from_image_and_status_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    os.chmod(tmp_path, 0o700)
    img = ProcessImage.create(2, 3)
    try:
        img.publish(np.array([1.0, np.nan, 3.0]), np.array([0.5, 0.25]), 7, 7.0)
        img.set_loop_state("running")
        stats = tmp_path / "stats.json"
        stats.write_text(json.dumps({"overruns": 2, "lateness_hist_us": [[1.0, 5]]}))
        entry = {"pid": os.getpid(), "image": img.name, "stats": str(stats), "scenario": "s"}
        samp = Sampler(entry)
        f = samp.frame()
        assert (f["step"], f["t_s"], f["loop_state"]) == (7, 7.0, "running")
        assert f["y"] == [1.0, None, 3.0] and f["u"] == [0.5, 0.25]  # NaN travels as null
        assert f["stats"]["overruns"] == 2 and f["safety"] is None
        img.publish(np.array([2.0, 2.0, 2.0]), np.array([0.0, 0.0]), 8, 8.0)
        assert samp.frame()["y"] == [2.0, 2.0, 2.0]
        samp.close()
    finally:
        img.close()


def test_live_runs_find_by_scenario_and_prune_dead(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    os.chmod(tmp_path, 0o700)
    d = live_runs.live_dir()
    os.makedirs(d)
    live = {"scenario": "a", "pid": os.getpid(), "stats": "", "record_path": str(tmp_path / "rec")}
    dead = {"scenario": "a", "pid": 2 ** 22 + 12345, "stats": ""}
    (tmp_path / "hil" / "live" / f"a.{os.getpid()}.json").write_text(json.dumps(live))
    dead_path = tmp_path / "hil" / "live" / "a.dead.json"
    dead_path.write_text(json.dumps(dead))
    assert live_runs.find(scenario_name="a")["pid"] == os.getpid()
    assert live_runs.find(record_dir=str(tmp_path / "rec"))["pid"] == os.getpid()
    assert live_runs.find(scenario_name="b") is None
    assert not dead_path.exists()  # pruned
