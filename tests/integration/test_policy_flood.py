"""A flood of oversized and wrong-length frames on the loop's action socket and the safety's
proposal socket (issue 17: 8 connections x 1 MB for 6 s stalled the loop, 122 overruns, the
safety demoted with "policy lost"; on the proposal socket the first action came 203 steps late).

A short real-time run (10x: 100 ms period, 80 steps) with three real processes over tcp (any
local user reaches those sockets). A separate process opens 6 connections to each socket and
pushes, for 4 s of wall time, on 4 of them 1 MiB frames (over ZMQ_MAXMSGSIZE: libzmq cuts the connection
before hil sees a byte; the sender reconnects) and on 2 of them 20-byte frames (shorter than any legal frame:
dropped by length before the tag is hashed, counted in `dropped_size`). Counts are asserted,
never timings: the run completed every step, the drops were counted on both sockets, and the
APPLIED values are the safety's decisions.
"""

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from hil.scenario.config import parse_scenario
from hil.recorder import read_recording
from hil.runtime import Runtime
from tests.hil.safety.helpers import CONFIG, base_dict, chain_changes, merge, read_log, remove_ipc_dirs

FLOODER = r"""
import json, sys, time, zmq
action, proposal, seconds, out, ready = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
ctx = zmq.Context()
frames = {"big": b"\x5a" * (1 << 20), "small": b"\x01" * 20}
socks = []  # (name, kind, socket): 4 connections of 1 MiB frames, 2 of short ones, per endpoint
for name, ep in (("action", action), ("proposal", proposal)):
    for kind, n in (("big", 4), ("small", 2)):
        for _ in range(n):
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 16)
            s.connect(ep)
            socks.append((name, kind, s))
sent = {f"{n}_{k}": 0 for n in ("action", "proposal") for k in ("big", "small")}
open(ready, "w").write("1")
end = time.monotonic() + seconds
while time.monotonic() < end:
    for name, kind, s in socks:
        for _ in range(4 if kind == "small" else 1):
            try:
                s.send(frames[kind], zmq.NOBLOCK)
                sent[f"{name}_{kind}"] += 1
            except zmq.Again:
                pass
    time.sleep(0.0005)
json.dump(sent, open(out, "w"))
"""


@pytest.fixture(autouse=True)
def _clean_ipc_dirs():
    yield
    remove_ipc_dirs()


def test_flood_of_big_and_short_frames_is_dropped_and_counted_and_the_safety_keeps_acting(tmp_path):
    changes = {"loop": {"time_scale": 10.0},
               "safety": {"mode": "full", "log_every_step": True, "rollout": {"auto_promote": False}}}
    sc = parse_scenario(merge(base_dict(), chain_changes(tmp_path, "tcp", **changes)))
    ep = sc.bus.endpoints
    report, ready = tmp_path / "flood.json", tmp_path / "flood.ready"
    rt = Runtime(sc, lockstep=False, duration_s=80.0, record_path=str(tmp_path / "rec"), scenario_path=str(CONFIG))
    procs = []

    def start_flood(_rt):  # before the loop's first step: the whole flood lands on a running loop
        procs.append(subprocess.Popen([sys.executable, "-c", FLOODER, ep["action"], ep["proposal"], "4.0",
                                       str(report), str(ready)]))
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    try:
        summary = rt.run(on_started=start_flood)
    finally:
        rt.close()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    sent = json.loads(report.read_text())
    assert summary.state == "stopped" and summary.exit_code == 0 and summary.steps == 80, summary.error
    assert sent["action_big"] > 0 and sent["proposal_big"] > 0, sent  # 1 MiB frames went out
    assert sent["action_small"] > 1000 and sent["proposal_small"] > 1000, sent
    c, s = summary.extra["bus"], summary.extra["safety"]
    assert c["action_dropped_size"] > 1000, c  # counted by length, never hashed
    assert s["proposal_dropped_size"] > 1000, s
    assert c["action_dropped_auth"] == 0 and s["proposal_dropped_auth"] == 0  # no long frame reached a hash
    assert c["fallback_steps"] == 0 and c["watchdog_trips"] == 0, c
    # APPLIED: the safety's decision for the previous step, or (a late action) one it made before
    df = read_recording(tmp_path / "rec").set_index("step")[["app.base_flow", "app.agitation_power"]]
    decisions = {r["step"]: r for r in read_log(tmp_path / "decisions.jsonl") if r["event"] == "decision"}
    exact = 0
    for k in range(1, 80):
        app = df.loc[k].to_numpy()
        if k - 1 in decisions and np.allclose(app, decisions[k - 1]["action"], rtol=1e-12):
            exact += 1
        else:
            assert any(np.allclose(app, decisions[j]["action"], rtol=1e-12) for j in decisions if j < k - 1), k
    assert exact >= 0.9 * 79, exact
    # the policy's proposals got through the flood: the safety acted on them, not on its baseline
    assert sum(r["source"] == "policy" for r in decisions.values()) >= 0.9 * len(decisions)
