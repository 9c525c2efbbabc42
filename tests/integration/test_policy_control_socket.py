"""The safety's control socket survives any frame sequence (issue 17: one unsigned two-part
request killed the safety process, and the loop ran the rest on its watchdog fallback).

Lockstep, three real processes; at step 40 the test sends to the safety's control endpoint
(tcp, which any local user reaches, and ipc): frames without the REQ envelope, an empty frame,
a three-part message, a 1 MiB frame and a two-part unsigned request from a REQ socket; then a
well-formed status request, which must be answered. Asserted: the safety stays alive, its
counters saw the junk, and every APPLIED action after the junk is the safety's decision (the
loop's watchdog never took over).
"""

import msgpack
import numpy as np
import pytest
import zmq

from hil.scenario.config import parse_scenario
from hil.recorder import read_recording
from hil.runtime import Runtime
from tests.hil.safety.helpers import CONFIG, base_dict, chain_changes, merge, read_log, remove_ipc_dirs

JUNK_AT_STEP = 40


@pytest.fixture(autouse=True)
def _clean_ipc_dirs():
    yield
    remove_ipc_dirs()


def _send_junk(endpoint: str, marks: dict) -> None:
    ctx = zmq.Context.instance()
    socks = []

    def sock(kind):
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        socks.append(s)
        return s

    try:
        dealer = sock(zmq.DEALER)  # bare frames: no empty delimiter after the identity
        dealer.send(b"")  # empty
        dealer.send_multipart([b"a", b"b", b"c"])  # three parts, no envelope
        dealer.send_multipart([b"", msgpack.packb({"op": "status"}), b"extra"])  # envelope + two parts
        sock(zmq.DEALER).send(b"\xff" * (1 << 20))  # 1 MiB: over ZMQ_MAXMSGSIZE, the connection is cut
        req = sock(zmq.REQ)
        req.send_multipart([msgpack.packb({"op": "demote", "to": "shadow"}), b"second part"])  # unsigned, 2 parts
        marks["two_part_reply"] = msgpack.unpackb(req.recv(), raw=False) if req.poll(10_000) else None
        replies = []
        for _ in range(3):  # answers to the envelope-less junk that had an identity to answer to
            if dealer.poll(2000):
                replies.append(dealer.recv_multipart())
        marks["dealer_replies"] = len(replies)
        ok = sock(zmq.REQ)
        ok.send(msgpack.packb({"op": "status"}))
        marks["status_reply"] = msgpack.unpackb(ok.recv(), raw=False) if ok.poll(10_000) else None
    finally:
        for s in socks:
            s.close(0)


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_junk_on_the_control_socket_leaves_the_safety_acting(tmp_path, transport):
    changes = {"safety": {"mode": "full", "log_every_step": True, "rollout": {"auto_promote": False}}}
    sc = parse_scenario(merge(base_dict(), chain_changes(tmp_path, transport, **changes)))
    rt = Runtime(sc, lockstep=True, duration_s=150.0, record_path=str(tmp_path / "rec"), scenario_path=str(CONFIG))
    marks: dict = {}
    before = rt.bus.before_step

    def before_step(step, t_s, u_cmd, lockstep):
        if step == JUNK_AT_STEP:
            marks["pid"] = rt._policy_handles.safety.pid
            _send_junk(sc.bus.endpoint("control", sc.name), marks)
        return before(step, t_s, u_cmd, lockstep)

    rt.bus.before_step = before_step
    try:
        summary = rt.run()
    finally:
        rt.close()
    assert summary.state == "stopped" and summary.exit_code == 0, (summary.error, summary.alarms)
    assert summary.dead_processes == {} and not summary.extra["safety_watch"]["died"]
    two = marks["two_part_reply"]
    assert two is not None and not two["ok"], two  # answered with an error, the socket still serves
    assert marks["dealer_replies"] >= 2
    st = marks["status_reply"]
    assert st is not None and st["ok"] and st["status"]["pid"] == marks["pid"], st
    counters = summary.extra["safety"]
    assert counters["control_malformed"] >= 4, counters  # empty, 3 parts, envelope + 2, REQ 2 parts
    assert counters["control_requests"] >= 1 and counters["control_refused"] == 0
    # the loop kept getting the safety's actions: APPLIED = the safety's decision, every step
    c = summary.extra["bus"]
    assert c["watchdog_trips"] == 0 and c["fallback_steps"] == 0 and c["actions_applied"] == 149, c
    df = read_recording(tmp_path / "rec").set_index("step")[["app.base_flow", "app.agitation_power"]]
    decisions = {r["step"]: r for r in read_log(tmp_path / "decisions.jsonl") if r["event"] == "decision"}
    for j in range(JUNK_AT_STEP - 5, 149):
        np.testing.assert_allclose(df.loc[j + 1].to_numpy(), decisions[j]["action"], rtol=1e-12,
                                   err_msg=f"step {j + 1}")
        assert decisions[j]["source"] == "policy", decisions[j]  # the policy's answers reached it too
