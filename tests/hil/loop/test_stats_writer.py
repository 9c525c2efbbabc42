"""hil.loop.stats_writer: the live-run stats file written by a child process."""

import json
import os

import numpy as np

from hil.live_runs import histogram_buckets
from hil.loop.stats_writer import StatsWriter, stats_document


def _status(steps: int) -> dict:
    counts = np.zeros(64, dtype=np.int64)
    counts[[3, 10]] = [steps, 2]
    return {"steps": steps, "overruns": 1, "alarms": ["a"], "lateness_counts": counts}


def test_stats_document_matches_the_announcement_format():
    doc = stats_document(_status(7))
    assert "lateness_counts" not in doc
    assert doc["steps"] == 7 and doc["alarms"] == ["a"]
    assert doc["lateness_hist_us"] == histogram_buckets(_status(7)["lateness_counts"])


def test_writer_writes_the_last_snapshot_and_exits_at_close(tmp_path):
    path = tmp_path / "run.stats.json"
    w = StatsWriter(str(path))
    for steps in (1, 2, 3):
        w.offer(_status(steps))
    w.close()
    assert w.process.returncode == 0  # the end of the socket ends it
    assert json.loads(path.read_text()) == json.loads(json.dumps(stats_document(_status(3))))
    assert w.offered == 3 and w.dropped == 0
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_offer_to_a_dead_writer_is_counted_never_raised(tmp_path):
    w = StatsWriter(str(tmp_path / "s.json"))
    w.process.kill()
    w.process.wait()
    for steps in range(3):
        w.offer(_status(steps))
    assert w.dropped == 3
    w.close()
