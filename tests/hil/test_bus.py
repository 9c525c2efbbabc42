"""The bus: message encoding, validation and dropping, and the loop's end (LoopBusEndpoint)."""

import json
import math
import os
import struct
import tempfile
import time

import msgpack
import numpy as np
import pytest
import zmq

from hil.bus import (
    HEADER,
    KIND_CODES,
    SCHEMA_VERSION,
    LoopBusEndpoint,
    Receiver,
    Sender,
    drain,
    open_socket,
    payload_schema,
)
from hil.bus.auth import channel_key, sign
from hil.bus.config import BusSection

N_OUT, N_IN, N_ACT = 3, 4, 2
KEY = b"k" * 32  # the run's bus secret in these tests
OTHER_KEY = b"x" * 32


def _rx(kind="action"):
    return Receiver(kind, payload_schema(kind, N_OUT, N_IN, N_ACT), KEY)


def _signed(body: bytes, channel="action", key=KEY) -> bytes:
    return sign(channel_key(key, channel), body)


def _take(rx, raw):
    """decode, then accept what decoded (a consumer acting on every valid message)."""
    msg = rx.decode(raw)
    return msg if msg is not None and rx.accept(msg) else None


def _action(sender, step=0, a=(1.0, 2.0), **payload):
    body = {"a": list(a), "source": "policy", "mode": "full", "advice": None}
    body.update(payload)
    return sender.encode(step, step + 1.0, body)


def _raw(_key=KEY, a=(1.0, 2.0), advice=None, source=b"p", mode=b"full", body=None, tail=b"", cut=0, **header):
    """A signed action frame (hil/bus/wire.py layout) with any header value or body part forged:
    header fields v, kind, flags, n0, n1, sid, seq, step, t_s, wall_ns; `a`/`advice` float
    vectors; `source`/`mode` raw UTF-8 bytes (length-prefixed here); `body` replaces the whole
    body; `tail` is appended and `cut` bytes removed before signing (a truncated frame)."""
    h = {"v": SCHEMA_VERSION, "kind": KIND_CODES["action"], "flags": 0 if advice is None else 1, "n0": len(a),
         "n1": 0, "sid": 5, "seq": 1, "step": 0, "t_s": 1.0, "wall_ns": time.time_ns()}
    h.update(header)
    if body is None:
        body = struct.pack(f"<{len(a)}d", *a)
        if advice is not None:
            body += struct.pack(f"<{len(advice)}d", *advice)
        body += struct.pack("<H", len(source)) + source + struct.pack("<H", len(mode)) + mode
    frame = HEADER.pack(h["v"], h["kind"], h["flags"], h["n0"], h["n1"], h["sid"], h["seq"], h["step"], h["t_s"],
                        h["wall_ns"]) + body + tail
    return _signed(frame[:len(frame) - cut], key=_key)


def test_every_kind_round_trips_with_its_header():
    for kind, payload in (
        ("obs", {"y": [1.0, 2.0, 3.0], "q": [0, 1, 0], "u": [0.0, 1, 2.5, -1.0], "lockstep": True}),
        ("proposal", {"a": [1.0, 2.0], "members": [[1.0, 2.0], [1.5, 2.5]], "version": "v3", "compute_us": 12.5}),
        ("action", {"a": [1.0, 2.0], "source": "baseline:silent", "mode": "limited", "advice": [0.5, 0.5]}),
        ("command", {"op": "load", "version": "v1", "reason": "rollback"}),
    ):
        s = Sender(kind, KEY)
        before = time.time_ns()
        msg = _rx(kind).decode(s.encode(7, 8.0, payload))
        assert msg is not None, kind
        assert (msg.kind, msg.sid, msg.seq, msg.step, msg.t_s) == (kind, s.sid, 1, 7, 8.0)
        assert before <= msg.wall_ns <= time.time_ns()
        for key, value in payload.items():
            got = msg.payload[key]
            if key == "q":
                np.testing.assert_array_equal(got, value)
                assert got.dtype == np.uint8
            elif isinstance(value, list):
                np.testing.assert_array_equal(got, np.array(value, dtype=float))
                assert got.dtype == np.float64
            else:
                assert got == value


@pytest.mark.parametrize(
    "raw, counter",
    [
        (_signed(b"\xc1 not a frame"), "dropped_size"),  # shorter than the header: not even hashed
        (_signed(b""), "dropped_size"),
        (_raw(cut=len(_raw()) - 16 - 47), "dropped_size"),  # a header one byte short
        (_signed(msgpack.packb({"v": 1, "kind": "action", "sid": 5, "seq": 1, "step": 0, "t_s": 1.0,
                                "wall_ns": 0, "payload": {"a": [1.0, 2.0], "source": "p", "mode": "full",
                                                          "advice": None}})), "dropped_schema"),  # the old format
        (b"", "dropped_auth"),
        (b"short", "dropped_auth"),
        (_raw()[:-16], "dropped_auth"),  # a well-formed frame without its tag
        (_raw(_key=OTHER_KEY), "dropped_auth"),  # signed with another key
        (_raw()[:-1] + bytes([_raw()[-1] ^ 1]), "dropped_auth"),  # one bit of the tag flipped
        (_raw()[:16] + bytes([_raw()[16] ^ 1]) + _raw()[17:], "dropped_auth"),  # one bit of the body (seq)
        (_signed(_raw()[:-16], channel="advice"), "dropped_auth"),  # another channel's key
        (_raw(v=SCHEMA_VERSION + 1), "dropped_schema"),
        (_raw(v=1), "dropped_schema"),
        (_raw(kind=KIND_CODES["obs"]), "dropped_schema"),
        (_raw(kind=9), "dropped_schema"),
        (_raw(cut=1), "dropped_malformed"),  # truncated: the last string is one byte short
        (_raw(cut=6), "dropped_malformed"),  # truncated: the mode string is gone
        (_raw(tail=b"\x00"), "dropped_malformed"),  # one byte more than the fields
        (_raw(seq=0), "dropped_malformed"),
        (_raw(seq=-1), "dropped_malformed"),
        (_raw(sid=-1), "dropped_malformed"),
        (_raw(step=-2), "dropped_malformed"),
        (_raw(flags=2), "dropped_malformed"),  # an unknown flag
        (_raw(n1=1), "dropped_malformed"),  # an action carries no second count
        (_raw(flags=1), "dropped_malformed"),  # says advice, carries none: the strings read as floats
        (_raw(t_s=float("nan")), "dropped_nonfinite"),
        (_raw(t_s=float("inf")), "dropped_nonfinite"),
        (_raw(a=(1.0, 2.0, 3.0)), "dropped_shape"),
        (_raw(a=(1.0,)), "dropped_shape"),
        (_raw(n0=3), "dropped_shape"),  # the count says 3, the scenario 2
        (_raw(a=(1.0, 2.0, 3.0), n0=2), "dropped_malformed"),  # the count says 2, the bytes hold 3
        (_raw(a=(1.0, float("nan"))), "dropped_nonfinite"),
        (_raw(advice=(float("inf"), 0.0)), "dropped_nonfinite"),
        (_raw(source=b"\xff\xfe"), "dropped_malformed"),  # not UTF-8
        (_raw(source=b"s" * 257), "dropped_malformed"),  # longer than MAX_STR
        (_raw(body=struct.pack("<2d", 1.0, 2.0) + struct.pack("<H", 500) + b"p"), "dropped_malformed"),  # length past the end
    ],
)
def test_bad_messages_are_dropped_and_counted(raw, counter):
    rx = _rx()
    assert rx.decode(raw) is None
    assert rx.counters[counter] == 1
    assert rx.dropped == 1 and rx.counters["accepted"] == 0
    # a bad message never advances the sequence state: a good one right after is taken
    assert _take(rx, _raw()) is not None


def test_replays_and_old_sequence_numbers_are_dropped():
    rx, s = _rx(), Sender("action", KEY)
    first, second, third = (_action(s, step=i) for i in range(3))
    assert _take(rx, first) is not None
    assert _take(rx, first) is None  # exact replay
    assert _take(rx, third) is not None
    assert _take(rx, second) is None  # older sequence number, arrived late
    assert rx.counters["dropped_replay"] == 2
    # a restarted sender (newer session) is accepted from seq 1 ...
    restarted = Sender("action", KEY, sid=s.sid + 1)
    assert _take(rx, _action(restarted)) is not None
    # ... and the old session is over: its next message is a replay of the past
    assert _take(rx, _action(s, step=5)) is None
    assert rx.counters["dropped_replay"] == 3


def test_decode_moves_no_replay_state_only_accept_does():
    rx, s = _rx(), Sender("action", KEY)
    stray = _action(Sender("action", KEY, sid=s.sid + 10**12), step=10**6)  # decoded, then refused by its consumer
    assert rx.decode(stray) is not None and rx.last == (-1, -1)
    msg = rx.decode(_action(s, step=0))
    assert msg is not None and rx.accept(msg) and rx.last == (s.sid, 1)
    assert not rx.accept(msg)  # the same message twice: a replay
    assert rx.counters["accepted"] == 1 and rx.counters["dropped_replay"] == 1


def test_an_unsigned_message_never_touches_replay_state():
    rx, s = _rx(), Sender("action", KEY)
    forged = _raw(sid=2**62, a=(9.0, 9.0), source=b"x")[:-16]  # a well-formed frame, tag removed
    for raw in (forged, forged + b"\x00" * 16, _signed(forged, key=OTHER_KEY)):
        assert rx.decode(raw) is None
    assert rx.counters["dropped_auth"] == 3 and rx.last == (-1, -1)
    assert _take(rx, _action(s)) is not None


@pytest.mark.parametrize("y, q, ok, counter", [
    ([1.0, float("nan"), 3.0], [0, 2, 0], True, None),  # a dropout travels as Bad
    ([1.0, float("inf"), 3.0], [0, 2, 0], True, None),  # any non-finite where Bad: NaN out
    ([1.0, 2.0, 3.0], [2, 0, 1], True, None),  # Bad with a finite value: NaN out as well
    ([1.0, float("nan"), 3.0], [0, 0, 0], False, "dropped_nonfinite"),
    ([1.0, float("nan"), 3.0], [0, 1, 0], False, "dropped_nonfinite"),  # Uncertain must be finite
    ([1.0, float("nan"), 3.0], [2, 0, 0], False, "dropped_nonfinite"),  # Bad elsewhere
    ([1.0, 2.0, 3.0], [0, 3, 0], False, "dropped_malformed"),
    ([1.0, 2.0, 3.0], [0, 255, 0], False, "dropped_malformed"),
    ([1.0, float("nan"), 3.0], [0, 2, 0], True, None),
])
def test_observation_quality_on_the_wire(y, q, ok, counter):
    rx = _rx("obs")
    msg = rx.decode(Sender("obs", KEY).encode(0, 1.0, {"y": y, "q": q, "u": [0.0] * N_IN, "lockstep": False}))
    if not ok:
        assert msg is None and rx.counters[counter] == 1
        return
    assert msg is not None and msg.payload["q"].dtype == np.uint8
    assert msg.payload["q"].tolist() == q and msg.payload["y"].dtype == np.float64
    bad = np.array(q) == 2
    assert np.isnan(msg.payload["y"][bad]).all() and np.isfinite(msg.payload["y"][~bad]).all()


def _obs_frame(y=(1.0, 2.0, 3.0), u=(0.0,) * N_IN, q=(0, 0, 0), cut=0, **header):
    h = {"v": SCHEMA_VERSION, "kind": KIND_CODES["obs"], "flags": 0, "n0": len(y), "n1": len(u), "sid": 5, "seq": 1,
         "step": 0, "t_s": 1.0, "wall_ns": 0}
    h.update(header)
    frame = HEADER.pack(*h.values()) + struct.pack(f"<{len(y) + len(u)}d", *y, *u) + bytes(q)
    return _signed(frame[:len(frame) - cut], channel="obs")


@pytest.mark.parametrize("raw, counter", [
    (_obs_frame(), None),
    (_obs_frame(flags=1), None),  # lockstep
    # an observation has one fixed length: anything else is dropped before its tag is hashed
    (_obs_frame(q=(0, 0)), "dropped_size"),  # the quality section one byte short
    (_obs_frame(cut=1), "dropped_size"),  # truncated
    (_obs_frame(y=(1.0, 2.0), q=(0, 0)), "dropped_size"),  # two outputs, the scenario has three
    (_obs_frame(u=(0.0,) * (N_IN + 1)), "dropped_size"),
    (_obs_frame(flags=2), "dropped_malformed"),  # an unknown flag
    (_obs_frame(y=(1.0, math.inf, 3.0)), "dropped_nonfinite"),  # not finite, quality Good
    (_obs_frame(u=(0.0, math.nan, 0.0, 0.0), q=(2, 2, 2)), "dropped_nonfinite"),  # u has no quality
])
def test_observation_frames_are_checked(raw, counter):
    rx = _rx("obs")
    msg = rx.decode(raw)
    if counter is None:
        assert msg is not None and msg.payload["lockstep"] == bool(HEADER.unpack_from(raw)[2])
    else:
        assert msg is None and rx.counters[counter] == 1 and rx.dropped == 1


def test_a_sender_refuses_what_the_format_cannot_carry():
    with pytest.raises(ValueError, match="2 codes for 3 outputs"):
        Sender("obs", KEY).encode(0, 1.0, {"y": [1.0, 2.0, 3.0], "q": [0, 0], "u": [0.0] * N_IN, "lockstep": False})
    with pytest.raises(ValueError, match="at most 256 UTF-8 bytes"):
        Sender("action", KEY).encode(0, 1.0, {"a": [1.0, 2.0], "source": "x" * 257, "mode": "full", "advice": None})
    with pytest.raises(ValueError, match=r"members must be \(m, 2\)"):
        Sender("proposal", KEY).encode(0, 1.0, {"a": [1.0, 2.0], "members": [[1.0, 2.0, 3.0]], "version": "v",
                                                "compute_us": 1.0})


def test_bus_section_endpoints_and_watchdog():
    ipc = BusSection(ipc_dir="/tmp/x")
    assert ipc.endpoint("action", "sc") == "ipc:///tmp/x/action"
    tcp = BusSection(transport="tcp", tcp_base_port=6000, endpoints={"control": "tcp://127.0.0.1:7000"})
    assert tcp.endpoint("obs_policy", "sc") == "tcp://127.0.0.1:6000"
    assert tcp.endpoint("action", "sc") == "tcp://127.0.0.1:6003"
    assert tcp.endpoint("control", "sc") == "tcp://127.0.0.1:7000"
    assert BusSection().watchdog_steps(0.5) == 2
    assert BusSection(watchdog_s=3.0).watchdog_steps(1.0) == 3
    assert BusSection(watchdog_s=0.1).watchdog_steps(1.0) == 1
    assert BusSection().deadline_s(0.01, lockstep=False) == pytest.approx(0.005)
    assert BusSection(lockstep_timeout_s=4.0).deadline_s(0.01, lockstep=True) == pytest.approx(2.0)


# ---- the loop's endpoint against a fake safety process (real sockets, in this process) ----


@pytest.fixture
def bus_dir():
    d = tempfile.mkdtemp(prefix="hb", dir="/tmp")
    yield d
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)


@pytest.fixture
def rig(bus_dir):
    """A LoopBusEndpoint plus peer sockets standing in for the policy and safety processes."""
    addrs = {n: f"ipc://{bus_dir}/{n}" for n in ("obs_policy", "obs_safety", "action")}
    ep = LoopBusEndpoint(
        obs_addrs=[addrs["obs_policy"], addrs["obs_safety"]], action_addr=addrs["action"],
        n_outputs=N_OUT, n_inputs=N_IN, action_names=["b", "d"],
        apply_index=np.array([1, 3]), apply_pos=np.array([0, 1]), fallback=np.array([-1.0, -2.0]),
        watchdog_steps=2, lockstep_timeout_s=2.0, max_action_age_steps=2, key=KEY)
    ctx = zmq.Context()
    peers = {
        "policy": open_socket(ctx, zmq.PULL, addrs["obs_policy"], bind=False),
        "safety": open_socket(ctx, zmq.PULL, addrs["obs_safety"], bind=False),
        "action": open_socket(ctx, zmq.PUSH, addrs["action"], bind=False),
    }
    time.sleep(0.2)  # connections up
    try:
        yield ep, peers
    finally:
        for s in peers.values():
            s.close(0)
        ctx.term()
        ep.close()


def _send(sock, data, ep=None):
    sock.send(data)
    if ep is not None:
        assert ep._action_sock.poll(2000)  # delivered before the loop polls (poll does not consume)
    time.sleep(0.02)


def _step(ep, k, lockstep=False):
    u = np.zeros(N_IN)
    ep.before_step(k, float(k), u, lockstep)
    ep.after_step(k, k + 1.0, np.arange(N_OUT, dtype=float), u)
    return u


def test_observations_reach_both_peers_and_actions_apply_to_bus_inputs(rig):
    ep, peers = rig
    u = _step(ep, 0)
    np.testing.assert_array_equal(u, [0.0, -1.0, 0.0, -2.0])  # no action yet: fallback
    for peer in ("policy", "safety"):
        assert peers[peer].poll(2000)
        raws = drain(peers[peer])
        assert len(raws) == 1
        msg = _rx("obs").decode(raws[0])
        assert msg.step == 0 and msg.t_s == 1.0
        np.testing.assert_array_equal(msg.payload["y"], [0.0, 1.0, 2.0])
    safety = Sender("action", KEY)
    _send(peers["action"], _action(safety, step=0, a=(5.0, 6.0)), ep)
    u = _step(ep, 1)
    np.testing.assert_array_equal(u, [0.0, 5.0, 0.0, 6.0])
    assert ep.counters()["actions_applied"] == 1 and ep.counters()["no_action_steps"] == 1


def test_garbage_replays_and_old_actions_are_counted_never_applied(rig):
    ep, peers = rig
    safety = Sender("action", KEY)
    for k in range(4):
        _step(ep, k)
    good = _action(safety, step=3, a=(5.0, 6.0))
    _send(peers["action"], good, ep)
    u = _step(ep, 4)
    np.testing.assert_array_equal(u[[1, 3]], [5.0, 6.0])
    hostile = [
        b"garbage",  # unsigned
        _signed(b"garbage"),  # signed garbage (a bug in a genuine peer)
        good,  # replay of the applied action
        _action(Sender("action", KEY, sid=1), step=4, a=(99.0, 99.0)),  # an old session
        _action(safety, step=0, a=(98.0, 98.0)),  # answers an observation 5 steps old
        _action(safety, step=40, a=(97.0, 97.0)),  # answers an observation never published
        _raw(v=99, step=4),
        _action(safety, step=4, a=(math.nan, 1.0)),
    ]
    for raw in hostile:
        peers["action"].send(raw)
    assert ep._action_sock.poll(2000)
    time.sleep(0.1)
    u = _step(ep, 5)
    np.testing.assert_array_equal(u[[1, 3]], [5.0, 6.0])  # still the last valid action
    c = ep.counters()
    assert c["action_dropped_auth"] == 1 and c["action_dropped_size"] == 1  # signed garbage: too short
    assert c["action_dropped_replay"] == 2
    assert c["action_dropped_too_old"] == 1
    assert c["dropped_future"] == 1
    assert c["action_dropped_schema"] == 1
    assert c["action_dropped_nonfinite"] == 1
    assert c["action_accepted"] == 1  # only the action acted on: old-step and future moved no replay state
    # a signed action from a much newer session, for a step never published (the old lock-out) ...
    peers["action"].send(_action(Sender("action", KEY, sid=safety.sid + 10**12), step=10**6, a=(96.0, 96.0)))
    _send(peers["action"], _action(safety, step=5, a=(7.0, 8.0)), ep)
    u = _step(ep, 6)
    np.testing.assert_array_equal(u[[1, 3]], [7.0, 8.0])  # ... does not lock the genuine safety out
    assert ep.counters()["dropped_future"] == 2 and ep.counters()["watchdog_trips"] == 0


def test_newest_valid_action_wins_and_watchdog_applies_fallback(rig):
    ep, peers = rig
    safety = Sender("action", KEY)
    for k in range(3):
        _step(ep, k)
    peers["action"].send(_action(safety, step=1, a=(1.0, 1.0)))
    _send(peers["action"], _action(safety, step=2, a=(2.0, 2.0)), ep)
    u = _step(ep, 3)
    np.testing.assert_array_equal(u[[1, 3]], [2.0, 2.0])
    assert ep.counters()["action_superseded"] == 1
    # the safety process goes silent: one step holds the action, the second applies the fallback
    u = _step(ep, 4)
    np.testing.assert_array_equal(u[[1, 3]], [2.0, 2.0])
    u = _step(ep, 5)
    np.testing.assert_array_equal(u[[1, 3]], [-1.0, -2.0])
    assert ep.in_fallback and ep.counters()["watchdog_trips"] == 1
    _step(ep, 6)
    assert ep.counters()["fallback_steps"] == 2 and ep.counters()["watchdog_trips"] == 1
    # it comes back: the next valid action applies at once
    _send(peers["action"], _action(safety, step=6, a=(3.0, 3.0)), ep)
    u = _step(ep, 7)
    np.testing.assert_array_equal(u[[1, 3]], [3.0, 3.0])
    assert not ep.in_fallback


@pytest.mark.parametrize("spin_us", [0.0, 3000.0])
def test_lockstep_waits_for_the_answer_and_times_out(rig, spin_us):
    ep, peers = rig
    ep.lockstep_timeout_s = 1.0
    ep._spin_ns = int(spin_us * 1000)  # busy-poll first (bus.answer_spin_us), then sleep in the receive
    _step(ep, 0, lockstep=True)
    safety = Sender("action", KEY)
    import threading

    def answer_late():
        time.sleep(0.1)
        peers["action"].send(_signed(b"garbage"))  # dropped and counted; the loop keeps waiting
        peers["action"].send(_action(safety, step=0, a=(4.0, 4.0)))

    threading.Thread(target=answer_late).start()
    t0 = time.monotonic()
    u = _step(ep, 1, lockstep=True)
    assert 0.05 < time.monotonic() - t0 < 1.0  # waited for the answer, not for the timeout
    np.testing.assert_array_equal(u[[1, 3]], [4.0, 4.0])
    t0 = time.monotonic()
    _step(ep, 2, lockstep=True)  # nobody answers: bounded wait, counted
    assert time.monotonic() - t0 >= 1.0
    assert ep.counters()["lockstep_timeouts"] == 1
    assert ep.counters()["action_dropped_size"] == 1 and ep.counters()["actions_applied"] == 2


def test_unconnected_peer_is_counted_never_blocks(bus_dir):
    ep = LoopBusEndpoint(
        obs_addrs=[f"ipc://{bus_dir}/o1", f"ipc://{bus_dir}/o2"], action_addr=f"ipc://{bus_dir}/a",
        n_outputs=N_OUT, n_inputs=N_IN, action_names=["b"], apply_index=np.array([0]),
        apply_pos=np.array([0]), fallback=np.array([0.0]), watchdog_steps=2, lockstep_timeout_s=1.0,
        max_action_age_steps=2, key=KEY)
    try:
        t0 = time.monotonic()
        for k in range(50):
            _step(ep, k)
        assert time.monotonic() - t0 < 5.0  # 50 steps: never waits for the missing peers
        assert ep.counters()["obs_unsent"] == 100 and ep.counters()["obs_sent"] == 0
    finally:
        ep.close()


@pytest.mark.parametrize(
    "a, counter",
    [
        ([1e308, 1e308], None),  # finite, though their sum overflows: accepted
        ([-0.0, 2.5], None),
        ([float("inf"), float("-inf")], "dropped_nonfinite"),  # their sum is NaN
        ([1e308, float("nan")], "dropped_nonfinite"),
        ([1e308, float("inf")], "dropped_nonfinite"),
        ([1.0, 2.0, float("nan")], "dropped_shape"),
    ],
)
def test_vector_checks_fast_and_slow_paths(a, counter):
    rx = _rx()
    msg = rx.decode(_raw(a=a))
    if counter is None:
        assert msg is not None and msg.payload["a"].tolist() == [float(v) for v in a]
    else:
        assert msg is None and rx.counters[counter] == 1


def test_loop_fallback_ramps_from_the_applied_value_at_the_rate_inside_the_box(bus_dir):
    """After the watchdog trips, each step moves the bus inputs toward the fallback action by at
    most rate * step_s from what was APPLIED, and never outside the safety's box."""
    a = {n: f"ipc://{bus_dir}/{n}" for n in ("o1", "o2", "a")}
    ep = LoopBusEndpoint(
        obs_addrs=[a["o1"], a["o2"]], action_addr=a["a"], n_outputs=N_OUT, n_inputs=N_IN, action_names=["b", "d"],
        apply_index=np.array([1, 3]), apply_pos=np.array([0, 1]), fallback=np.array([30.0, 50.0]),
        watchdog_steps=1, lockstep_timeout_s=1.0, max_action_age_steps=2, key=KEY, step_s=0.5,
        fallback_rate=np.array([4.0, np.inf]), fallback_lo=np.array([0.0, 0.0]), fallback_hi=np.array([80.0, 40.0]))
    try:
        u = np.array([0.0, 13.0, 0.0, 7.0])  # the initial commands: applied before any action
        ep.before_step(0, 0.0, u, False)
        assert u[1] == pytest.approx(15.0) and u[3] == 40.0  # 13 + 4 * 0.5; 50 clipped into the box
        applied = []
        for k in range(1, 12):
            u_app = u.copy()
            u_app[1] -= 0.5  # an actuator gap: what was applied differs from the command
            ep.after_step(k - 1, k * 0.5, np.zeros(N_OUT), u_app)
            u = u_app.copy()
            ep.before_step(k, k * 0.5, u, False)
            assert u[1] - u_app[1] <= 2.0 + 1e-12  # from the applied value, at most rate * step_s
            applied.append(u[1])
        assert applied[-1] == pytest.approx(30.0) and ep.counters()["fallback_rate_limited_steps"] >= 5
    finally:
        ep.close()


def test_run_dir_refused_when_wider_than_0700_or_owned_by_another_user(tmp_path, monkeypatch):
    from hil.bus.auth import create_run_key, ensure_private_dir, read_run_key
    from hil.errors import ConfigError

    d = tmp_path / "run"
    assert ensure_private_dir(str(d)) == str(d) and (d.stat().st_mode & 0o777) == 0o700  # created private
    d.chmod(0o755)
    with pytest.raises(ConfigError, match=r"bus.ipc_dir: .*run has mode 0755, wider than 0711.*chmod 700"):
        ensure_private_dir(str(d))
    d.chmod(0o700)
    uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: uid + 4242)
    with pytest.raises(ConfigError, match=rf"{d} is owned by uid {uid}, not by this user"):
        ensure_private_dir(str(d))
    monkeypatch.undo()
    (tmp_path / "link").symlink_to(d)
    with pytest.raises(ConfigError, match="not a directory"):
        ensure_private_dir(str(tmp_path / "link"))
    # the key file: fresh per run, 0600, readable back by the same user only
    bus = BusSection(ipc_dir=str(d))
    k1, k2 = create_run_key(bus, "sc"), create_run_key(bus, "sc")
    assert k1 != k2 and len(k1) == 32 and read_run_key(bus, "sc") == k2
    assert ((d / "key").stat().st_mode & 0o777) == 0o600
    (d / "key").chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0644"):
        read_run_key(bus, "sc")


def test_a_scenario_whose_run_dir_is_world_readable_is_refused_at_load(tmp_path):
    from hil.errors import ConfigError
    from tests.hil.safety.helpers import scenario

    d = tmp_path / "shared"
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    with pytest.raises(ConfigError, match=rf"bus.ipc_dir: {d} has mode 0777, wider than 0711"):
        scenario({"bus": {"ipc_dir": str(d)}})
    d.chmod(0o700)
    assert scenario({"bus": {"ipc_dir": str(d)}}).bus.ipc_dir == str(d)


def test_policy_and_safety_get_fifo_priority_on_every_thread():
    """launch.set_priority: SCHED_FIFO for every thread of both children (real-time runs)."""
    import subprocess
    import sys

    from hil.safety.launch import Handles, set_priority

    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); time.sleep(30)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]
    try:
        time.sleep(0.5)  # both threads up
        h = Handles(procs[0], procs[1], "", "", "", "")
        warns = set_priority(h, 1)
        if warns:
            pytest.skip(f"no SCHED_FIFO here: {warns[0]}")
        for p in procs:
            tids = [int(t) for t in os.listdir(f"/proc/{p.pid}/task")]
            assert len(tids) == 2 and all(os.sched_getscheduler(t) == os.SCHED_FIFO for t in tids)
        assert h.priority == 1 and set_priority(h, 0) == []
    finally:
        for p in procs:
            p.kill()
            p.wait(5)


def test_the_policy_s_channel_keys_cannot_make_an_action_the_loop_accepts():
    """The policy process gets only the obs, proposal and command keys: no tag it can make is
    valid on the action channel (nor can it derive the action key: BLAKE2b is one-way)."""
    from hil.bus.auth import POLICY_CHANNELS, bootstrap_keys, channel_keys, child_env, child_key

    policy_keys = channel_keys(KEY, POLICY_CHANNELS)
    with pytest.raises(KeyError, match="no key for the bus channel 'action'"):
        Sender("action", policy_keys)
    rx = _rx("action")
    body = _action(Sender("action", KEY))[:-16]
    for channel, ckey in policy_keys.items():
        assert rx.decode(sign(ckey, body)) is None
    assert rx.counters["dropped_auth"] == len(POLICY_CHANNELS)
    # a spawned child's environment holds no key at all; the policy's bootstrap carries its channel keys only
    env = child_env(base={"HIL_BUS_KEY": "00" * 32, "HIL_BUS_CHANNEL_KEYS": "x", "PATH": "/bin"})
    assert env == {"PATH": "/bin"}
    boot = json.loads(json.dumps(bootstrap_keys(KEY, POLICY_CHANNELS)))
    assert KEY.hex() not in json.dumps(boot)
    got = child_key(BusSection(), "sc", boot)
    assert got == policy_keys
    tx = Sender("proposal", got)
    assert Receiver("proposal", payload_schema("proposal", N_OUT, N_IN, N_ACT), KEY).decode(
        tx.encode(0, 1.0, {"a": [1.0, 2.0], "members": [], "version": "v1", "compute_us": 1.0})) is not None


def _hold_run_dir(d, ready, done):
    from hil.bus.auth import lock_run_dir

    lock_run_dir(d)
    ready.set()
    done.wait(30)


def test_a_second_run_on_the_same_run_dir_is_refused_naming_the_first(tmp_path):
    """Two runs of one scenario would share ipc sockets (a bind takes the other's over) and
    key: the second is refused with the first one's pid; once it is gone, the dir is free."""
    import multiprocessing as mp

    from hil.bus.auth import lock_run_dir, release_run_dir
    from hil.errors import ConfigError

    d = str(tmp_path / "run")
    os.mkdir(d, 0o700)
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold_run_dir, args=(d, ready, done))
    p.start()
    try:
        assert ready.wait(30)
        with pytest.raises(ConfigError, match=f"in use by another run \\(pid {p.pid}\\)"):
            lock_run_dir(d)
    finally:
        done.set()
        p.join(30)
    lock_run_dir(d)  # the first run is over: free
    release_run_dir(d)


def test_oversized_frames_are_dropped_by_length_before_the_tag_is_checked():
    """A 1 MB frame (signed or not) is counted dropped_size: the length is the first check,
    so a flood of big frames costs a len() each, not a hash and a copy."""
    rx = _rx()
    big = b"\x00" * (1 << 20)
    assert rx.decode(big) is None and rx.decode(_signed(big)) is None
    assert rx.counters["dropped_size"] == 2 and rx.counters["dropped_auth"] == 0
    assert rx.max_bytes < 1024  # an action frame of two values: a few hundred bytes at most
    assert _take(rx, _raw()) is not None


def test_the_action_socket_refuses_frames_over_the_largest_legal_action(rig):
    """ZMQ_MAXMSGSIZE at the largest legal action frame: a 64 kB frame drops its sender's
    connection inside zmq (never queued, never read by the loop); the genuine safety's next
    action is applied."""
    from hil.bus import max_frame_bytes

    ep, peers = rig
    assert ep._action_sock.getsockopt(zmq.MAXMSGSIZE) == max_frame_bytes("action", 0, 0, 2)
    ctx = zmq.Context()
    flood = ctx.socket(zmq.PUSH)
    flood.setsockopt(zmq.LINGER, 0)
    flood.connect(ep._action_sock.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        for _ in range(3):
            flood.send(b"\x01" * (64 << 10))
        time.sleep(0.2)
        _step(ep, 0)
        safety = Sender("action", KEY)
        _send(peers["action"], _action(safety, step=0, a=(7.0, 8.0)), ep)
        u = _step(ep, 1)
        np.testing.assert_array_equal(u[[1, 3]], [7.0, 8.0])
        c = ep.counters()
        assert c["action_received"] == 1 and c["action_dropped_size"] == 0  # zmq refused the big ones
    finally:
        flood.close(0)
        ctx.term()


def test_peek_step_reads_the_header_step_of_every_kind_and_checks_nothing():
    from hil.bus.wire import peek_step

    for step in (-1, 0, 3, 4, 123456789):
        obs = Sender("obs", KEY).encode(step, 1.0, {"y": [0.0] * N_OUT, "q": [0] * N_OUT, "u": [0.0] * N_IN,
                                                    "lockstep": False})
        assert peek_step(obs) == step
        sup = Sender("supervisor", KEY).encode_supervisor(step, 1.0, True, np.zeros(2), np.ones(2), "full", "r")
        assert peek_step(sup) == step
    forged = bytearray(obs)
    forged[-1] ^= 1  # a bad tag: peek_step still reads the field (it is for skipping only) ...
    assert peek_step(bytes(forged)) == 123456789
    rx = Receiver("obs", payload_schema("obs", N_OUT, N_IN, 0), KEY)
    assert rx.decode(bytes(forged)) is None and rx.counters["dropped_auth"] == 1  # ... decode refuses it
    assert peek_step(obs[:47]) is None  # shorter than a header


def test_an_abstention_is_a_proposal_frame_with_its_flag_and_no_members():
    """A policy silent by its own output says so (lockstep): the frame decodes as an abstention
    with a zero action; the flag with members, or any other flag bit, is malformed."""
    s = Sender("proposal", KEY)
    rx = _rx("proposal")
    msg = rx.decode(s.encode_abstain(7, 8.0, 2, "v3", 0.0))
    assert msg is not None and msg.step == 7 and msg.payload["abstain"] is True
    np.testing.assert_array_equal(msg.payload["a"], [0.0, 0.0])
    assert msg.payload["members"].shape == (0, 2) and msg.payload["version"] == "v3"
    ok = rx.decode(s.encode_proposal(8, 9.0, np.array([1.0, 2.0]), None, "v3", 1.0))
    assert ok is not None and ok.payload["abstain"] is False
    from hil.bus.wire import FLAG_ABSTAIN, HEADER, TAG_BYTES

    def reflagged(frame: bytes, flags: int) -> bytes:
        fields = list(HEADER.unpack_from(frame))
        fields[2] = flags
        body = HEADER.pack(*fields) + frame[HEADER.size:-TAG_BYTES]
        return body + sign(channel_key(KEY, "proposal"), body)[-TAG_BYTES:]

    with_members = s.encode_proposal(9, 9.0, np.array([1.0, 2.0]), np.array([[1.0, 2.0]]), "v3", 1.0)
    for frame in (reflagged(with_members, FLAG_ABSTAIN), reflagged(s.encode_abstain(10, 9.0, 2, "v3", 0.0), 2)):
        before = rx.counters["dropped_malformed"]
        assert rx.decode(frame) is None
        assert rx.counters["dropped_malformed"] == before + 1
