"""A real-time run announced for viewers (hil/live_runs.py): its stats file is written by a child
process (hil/loop/stats_writer.py), so the loop's process runs no other Python thread."""

import json
import threading
import time

from hil.runtime import Runtime
from hil.scenario.config import parse_scenario
from tests.hil.test_config import _with


def test_realtime_announced_run_writes_stats_from_a_child_process_not_a_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    sc = parse_scenario(_with(loop__time_scale=200.0, loop__status_interval_s=0.05))  # 5 ms period
    seen = {}

    def on_stopping(rt):  # after the loop, before the writer is closed
        seen["threads"] = set(threading.enumerate()) - before
        seen["writer"] = rt._stats_writer
        seen["writer_alive"] = rt._stats_writer.process.poll() is None
        deadline = time.monotonic() + 30.0  # the writer is asynchronous: its file comes soon
        while time.monotonic() < deadline:
            try:
                seen["stats"] = json.loads(open(rt._live.stats_path).read())
                break
            except (OSError, ValueError):
                time.sleep(0.01)

    before = set(threading.enumerate())  # earlier tests may have left daemon threads behind
    with Runtime(sc, duration_s=100.0, record=False) as rt:
        rt.announce = True
        summary = rt.run(on_stopping=on_stopping)
    assert summary.steps == 100
    assert seen["threads"] == set()  # no status thread competing with the loop for the GIL
    assert seen["writer_alive"]
    assert seen["stats"]["steps"] > 0 and "lateness_hist_us" in seen["stats"]
    assert seen["writer"].process.returncode == 0  # closed with the run
    assert rt._stats_writer is None
