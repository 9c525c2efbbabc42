"""The ZeroMQ bus: msgpack messages, their validation, and the loop's end of the bus.

A message is a msgpack map:

    v        int    schema version (SCHEMA_VERSION); anything else is dropped
    kind     str    "obs" (loop -> policy, safety), "proposal" (policy -> safety),
                    "action" (safety -> loop), "command" (safety -> policy)
    sid      int    sender session: time.time_ns() when the sender started, so a restarted
                    sender is newer than its previous life and a replay of an old one is older
    seq      int    per-session sequence number, strictly increasing from 1
    step     int    loop step of the observation the message is about (obs: its own step;
                    proposal / action: the observation they answer; command: -1)
    t_s      float  simulated time of that observation (s)
    wall_ns  int    time.time_ns() at send
    payload  map    per kind, see `payload_schema`; vectors are lists of numbers in plant units

On the wire a message is its msgpack bytes followed by a keyed BLAKE2b tag (hil/bus_auth.py):
only processes holding the run's secret can produce a message any receiver accepts.

Observations carry per-output quality "q" (OPC UA style): 0 Good, 1 Uncertain, 2 Bad. A
non-finite "y" value is allowed only where q is Bad (a dropout travels as Bad, it does not
drop the whole observation); receivers hand out y as float64 with NaN wherever q is Bad and q as
a uint8 array.

Receivers (`Receiver`) drop and count, never act on, in this order: a missing or wrong tag
(`dropped_auth`, checked first), bytes that are not msgpack, wrong schema version or kind,
missing or extra fields, wrong types or vector lengths, non-finite numbers (outside Bad
quality), and (sid, seq) not newer than the last accepted (replays, old sequence numbers).
`decode` changes no state: the consumer calls `accept(msg)` for the message it acts on, so a
message it drops for its own rule (an action for a step too old or never published) never
moves the replay window. Consumers count their own drops on the same receiver.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import time
from dataclasses import dataclass
from math import isfinite

import msgpack
import numpy as np
import zmq

from hil.bus_auth import TAG_BYTES, channel_key, ensure_private_dir

SCHEMA_VERSION = 1
KINDS = ("obs", "proposal", "action", "command")
HEADER = ("v", "kind", "sid", "seq", "step", "t_s", "wall_ns", "payload")
MAX_MEMBERS = 64  # ensemble members a proposal may carry
MAX_STR = 256
MAX_MESSAGE_BYTES = 1 << 20

QUALITY_GOOD, QUALITY_UNCERTAIN, QUALITY_BAD = 0, 1, 2

DROP_COUNTERS = (
    "dropped_auth",  # no tag, or a tag not made with the run's key for this channel
    "dropped_malformed",  # not msgpack, not a map, missing/extra fields, wrong types
    "dropped_schema",  # wrong schema version or wrong kind for this socket
    "dropped_shape",  # a vector of the wrong length
    "dropped_nonfinite",  # NaN or infinity anywhere (in y: where q is not Bad)
    "dropped_replay",  # (sid, seq) not newer than the last accepted: replay or old seq
    "dropped_too_old",  # answers an observation older than the consumer accepts
)


def payload_schema(kind: str, n_outputs: int, n_inputs: int, n_actions: int) -> dict[str, tuple]:
    """Field -> (type, length) of a payload. Types: vec, optvec, mat, str, bool, num, and for
    observations yvec (non-finite allowed where the quality is Bad) and qual (quality codes)."""
    if kind == "obs":
        return {"y": ("yvec", n_outputs), "q": ("qual", n_outputs), "u": ("vec", n_inputs),
                "lockstep": ("bool", 0)}
    if kind == "proposal":
        return {
            "a": ("vec", n_actions),
            "members": ("mat", n_actions),
            "version": ("str", 0),
            "compute_us": ("num", 0),
        }
    if kind == "action":
        return {
            "a": ("vec", n_actions),
            "source": ("str", 0),
            "mode": ("str", 0),
            "advice": ("optvec", n_actions),
        }
    if kind == "command":
        return {"op": ("str", 0), "version": ("str", 0), "reason": ("str", 0)}
    raise KeyError(f"unknown message kind {kind!r}")


@dataclass(slots=True)
class Message:
    """A validated message; vectors in `payload` are float64 arrays."""

    kind: str
    sid: int
    seq: int
    step: int
    t_s: float
    wall_ns: int
    payload: dict
    raw_len: int = 0


class Sender:
    """Stamps, encodes and signs messages of one kind for one sending session.

    `key`: the run's bus secret; `channel`: the socket's channel (default: the kind; the safety's
    advice copies of actions go out on "advice"). The header map and the msgpack packer are
    kept between messages (no per-message allocation beyond the payload and the bytes)."""

    def __init__(self, kind: str, key: bytes, sid: int | None = None, channel: str | None = None):
        if kind not in KINDS:
            raise KeyError(f"unknown message kind {kind!r}")
        self.kind = kind
        self.sid = time.time_ns() if sid is None else int(sid)
        self.seq = 0
        self._ckey = channel_key(key, channel or kind)
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        self._msg = {"v": SCHEMA_VERSION, "kind": kind, "sid": self.sid, "seq": 0, "step": 0, "t_s": 0.0,
                     "wall_ns": 0, "payload": None}

    def encode(self, step: int, t_s: float, payload: dict) -> bytes:
        """Next message (body + tag); numpy arrays in `payload` must already be lists (see `vec`)."""
        self.seq += 1
        m = self._msg
        m["seq"] = self.seq
        m["step"] = int(step)
        m["t_s"] = float(t_s)
        m["wall_ns"] = time.time_ns()
        m["payload"] = payload
        body = self._packer.pack(m)
        m["payload"] = None
        return body + hashlib.blake2b(body, key=self._ckey, digest_size=TAG_BYTES).digest()


def vec(a) -> list[float]:
    """A float vector as the list msgpack carries."""
    return np.asarray(a, dtype=np.float64).tolist()


class _Bad(Exception):
    def __init__(self, counter: str):
        self.counter = counter


def _is_num(v) -> bool:
    t = type(v)
    return t is float or t is int


_FLOAT_ONLY = {float}


def _check_numbers(value, n: int) -> None:
    """A list of n finite numbers (int or float, not bool), or raise the matching _Bad.

    Fast path (what every hil sender produces): all floats, checked with one set of types,
    and finite when their plain sum is (NaN and infinities propagate through a sum; a sum
    that overflows from finite values falls to the element-wise check)."""
    if type(value) is not list:
        raise _Bad("dropped_malformed")
    if set(map(type, value)) <= _FLOAT_ONLY:
        if len(value) != n:
            raise _Bad("dropped_shape")
        if isfinite(sum(value)):
            return
    finite = True
    for v in value:
        t = type(v)
        if t is float:
            if not isfinite(v):
                finite = False
        elif t is not int:
            raise _Bad("dropped_malformed")
    if len(value) != n:
        raise _Bad("dropped_shape")
    if not finite:
        raise _Bad("dropped_nonfinite")


def _vector(value, n: int) -> np.ndarray:
    _check_numbers(value, n)
    return np.array(value, dtype=np.float64)


_QUALITY_CODES = (QUALITY_GOOD, QUALITY_UNCERTAIN, QUALITY_BAD)
_INT_ONLY = {int}
_HEADER_KEYS = frozenset(HEADER)


def _quality(value, n: int, all_good: list) -> tuple[np.ndarray, bool]:
    """n quality codes (ints 0, 1, 2) as uint8 and whether any is not Good; or raise _Bad."""
    if type(value) is not list:
        raise _Bad("dropped_malformed")
    if value == all_good and set(map(type, value)) <= _INT_ONLY:  # the usual case: C loops only
        return np.zeros(n, dtype=np.uint8), False
    for v in value:
        if type(v) is not int or v not in _QUALITY_CODES:
            raise _Bad("dropped_malformed")
    if len(value) != n:
        raise _Bad("dropped_shape")
    return np.array(value, dtype=np.uint8), True


class Receiver:
    """Authenticates and validates one stream of messages of one kind; counts what it dropped.

    `key`: the run's bus secret; `channel`: the socket's channel (default: the kind)."""

    def __init__(self, kind: str, schema: dict[str, tuple], key: bytes, channel: str | None = None):
        self.kind = kind
        self.schema = schema
        self._ckey = channel_key(key, channel or kind)
        self._all_good = {name: [QUALITY_GOOD] * n for name, (typ, n) in schema.items() if typ == "qual"}
        self._payload_keys = frozenset(schema)
        self.last = (-1, -1)  # (sid, seq) of the last accepted message
        self.counters = {"received": 0, "accepted": 0, "superseded": 0}
        self.counters.update({c: 0 for c in DROP_COUNTERS})

    def count(self, counter: str, n: int = 1) -> None:
        self.counters[counter] += n

    @property
    def dropped(self) -> int:
        return sum(self.counters[c] for c in DROP_COUNTERS)

    def decode(self, raw: bytes) -> Message | None:
        """The authenticated, validated message not older than the last accepted one, or None
        (and one drop counted). Changes no replay state: see `accept`."""
        self.counters["received"] += 1
        n = len(raw)
        if n < TAG_BYTES:
            self.counters["dropped_auth"] += 1
            return None
        view = memoryview(raw)
        body = view[: n - TAG_BYTES]
        if not hmac.compare_digest(hashlib.blake2b(body, key=self._ckey, digest_size=TAG_BYTES).digest(),
                                   view[n - TAG_BYTES:]):
            self.counters["dropped_auth"] += 1
            return None
        try:
            msg = self._parse(body, n)
        except _Bad as bad:
            self.counters[bad.counter] += 1
            return None
        if (msg.sid, msg.seq) <= self.last:
            self.counters["dropped_replay"] += 1
            return None
        return msg

    def accept(self, msg: Message) -> bool:
        """The consumer acts on `msg`: it becomes the last accepted (sid, seq). False (counted as
        a replay) if a message at least as new was accepted since `msg` was decoded."""
        key = (msg.sid, msg.seq)
        if key <= self.last:
            self.counters["dropped_replay"] += 1
            return False
        self.last = key
        self.counters["accepted"] += 1
        return True

    def _parse(self, raw, raw_len: int) -> Message:
        try:
            m = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        except Exception:
            raise _Bad("dropped_malformed") from None
        if type(m) is not dict:
            raise _Bad("dropped_malformed")
        if m.get("v") != SCHEMA_VERSION or type(m.get("v")) is not int:
            raise _Bad("dropped_schema")
        if m.get("kind") != self.kind:
            raise _Bad("dropped_schema")
        if m.keys() != _HEADER_KEYS:
            raise _Bad("dropped_malformed")
        sid, seq, step, t_s, wall_ns, payload = (
            m["sid"], m["seq"], m["step"], m["t_s"], m["wall_ns"], m["payload"]
        )
        if not (type(sid) is int and type(seq) is int and type(step) is int and type(wall_ns) is int):
            raise _Bad("dropped_malformed")
        if seq < 1 or step < -1 or sid < 0:
            raise _Bad("dropped_malformed")
        if not _is_num(t_s):
            raise _Bad("dropped_malformed")
        if not math.isfinite(t_s):
            raise _Bad("dropped_nonfinite")
        if type(payload) is not dict or payload.keys() != self._payload_keys:
            raise _Bad("dropped_malformed")
        out = {}
        loose = None  # a yvec field holding non-finite values: allowed where the quality is Bad
        q_any = False  # a quality other than Good
        for name, (typ, n) in self.schema.items():
            value = payload[name]
            if typ == "vec":
                out[name] = _vector(value, n)
            elif typ == "yvec":
                try:
                    out[name] = _vector(value, n)
                except _Bad as bad:
                    if bad.counter != "dropped_nonfinite":
                        raise
                    out[name] = np.array(value, dtype=np.float64)
                    loose = name
            elif typ == "qual":
                out[name], q_any = _quality(value, n, self._all_good[name])
            elif typ == "optvec":
                out[name] = None if value is None else _vector(value, n)
            elif typ == "mat":
                if type(value) is not list or len(value) > MAX_MEMBERS:
                    raise _Bad("dropped_malformed")
                for row in value:
                    _check_numbers(row, n)
                out[name] = np.array(value, dtype=np.float64).reshape(len(value), n)
            elif typ == "str":
                if type(value) is not str or len(value) > MAX_STR:
                    raise _Bad("dropped_malformed")
                out[name] = value
            elif typ == "bool":
                if type(value) is not bool:
                    raise _Bad("dropped_malformed")
                out[name] = value
            elif typ == "num":
                if not _is_num(value):
                    raise _Bad("dropped_malformed")
                if not math.isfinite(value):
                    raise _Bad("dropped_nonfinite")
                out[name] = float(value)
        if q_any:
            bad = out["q"] == QUALITY_BAD
            if loose is not None and not np.isfinite(out[loose][~bad]).all():
                raise _Bad("dropped_nonfinite")
            out["y"][bad] = np.nan
        elif loose is not None:
            raise _Bad("dropped_nonfinite")
        return Message(self.kind, sid, seq, step, float(t_s), wall_ns, out, raw_len)


# ---- sockets ----


def open_socket(ctx: zmq.Context, socket_type: int, addr: str, bind: bool, hwm: int = 64) -> zmq.Socket:
    """A socket that never lingers; a connecting PUSH queues nothing while not connected."""
    sock = ctx.socket(socket_type)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    if socket_type in (zmq.PULL, zmq.SUB, zmq.REP):
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # a larger message drops its sender
    if not bind:
        sock.setsockopt(zmq.RECONNECT_IVL, 20)  # ms; a peer that starts later is found quickly
        if socket_type in (zmq.PUSH, zmq.PUB, zmq.REQ):
            sock.setsockopt(zmq.IMMEDIATE, 1)
    if bind:
        if addr.startswith("ipc://"):  # a private directory (0700, ours) or a ConfigError
            ensure_private_dir(os.path.dirname(os.path.abspath(addr[6:])))
        sock.bind(addr)
    else:
        sock.connect(addr)
    return sock


def send_nowait(sock: zmq.Socket, data: bytes) -> bool:
    """Send without blocking; False if no peer can take it now (nobody connected, queue full)."""
    try:
        sock.send(data, zmq.NOBLOCK)
        return True
    except zmq.Again:
        return False


def send_retry(sock: zmq.Socket, data: bytes, timeout_s: float) -> bool:
    """Lockstep only: retry a send for up to timeout_s while the peer connects (startup)."""
    deadline = time.monotonic() + timeout_s
    while not send_nowait(sock, data):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def recv_spin(sock: zmq.Socket, spin_ns: int) -> bytes | None:
    """Busy-poll a non-blocking receive for up to spin_ns (perf_counter ns); None if nothing came.

    Saves the wake-up of a sleeping thread (tens of us on a VM) when the answer is due within
    the spin, at the price of one CPU for that long."""
    end = time.perf_counter_ns() + spin_ns
    recv, flag, again, clock = sock.recv, zmq.NOBLOCK, zmq.Again, time.perf_counter_ns
    while True:
        try:
            return recv(flag)
        except again:
            if clock() >= end:
                return None


def drain(sock: zmq.Socket, max_messages: int = 10_000) -> list[bytes]:
    """Every message waiting on `sock`, without blocking."""
    out = []
    while len(out) < max_messages:
        try:
            out.append(sock.recv(zmq.NOBLOCK))
        except zmq.Again:
            break
    return out


# ---- the loop's end ----


class LoopBusEndpoint:
    """Publishes observations and applies actions inside the loop (see hil/runtime.py).

    Action vectors carry `action_input_names` in order; only those inputs whose scenario driver
    is "bus" are written into the loop's command vector (others, e.g. PLC-driven inputs in shadow
    mode, are only logged by the safety process). Watchdog: when no valid action has arrived for
    `watchdog_steps` loop steps, the loop's own fallback acts: it moves each bus input from its
    currently APPLIED value toward the configured fallback action by at most `fallback_rate`
    (units per sim s, the safety's projection rate) times `step_s` per step, inside
    [`fallback_lo`, `fallback_hi`] (the safety's box), and counts it.

    Every message in and out is signed with `key`, the run's bus secret (hil/bus_auth.py).
    """

    def __init__(
        self,
        *,
        obs_addrs: list[str],
        action_addr: str,
        n_outputs: int,
        n_inputs: int,
        action_names: list[str],
        apply_index: np.ndarray,
        apply_pos: np.ndarray,
        fallback: np.ndarray,
        watchdog_steps: int,
        lockstep_timeout_s: float,
        max_action_age_steps: int,
        key: bytes,
        step_s: float = 1.0,
        fallback_rate: np.ndarray | None = None,
        fallback_lo: np.ndarray | None = None,
        fallback_hi: np.ndarray | None = None,
        hwm: int = 64,
        spin_us: float = 0.0,
    ):
        self.action_names = list(action_names)
        self._apply_index = np.asarray(apply_index, dtype=np.intp)
        self._apply_pos = np.asarray(apply_pos, dtype=np.intp)
        n_apply = self._apply_index.size
        inf = np.full(n_apply, np.inf)
        self._fb_lo = inf * -1.0 if fallback_lo is None else np.asarray(fallback_lo, dtype=np.float64)
        self._fb_hi = inf.copy() if fallback_hi is None else np.asarray(fallback_hi, dtype=np.float64)
        self._fallback = np.clip(np.asarray(fallback, dtype=np.float64), self._fb_lo, self._fb_hi)
        rate = inf.copy() if fallback_rate is None else np.asarray(fallback_rate, dtype=np.float64)
        self._fb_max_step = rate * float(step_s)  # units per loop step
        self._applied = np.zeros(n_apply)  # bus inputs as applied in the last step
        self._have_applied = False
        self._fb_work = np.zeros(n_apply)
        self._act_buf = np.zeros(n_apply)
        self.watchdog_steps = int(watchdog_steps)
        self.lockstep_timeout_s = float(lockstep_timeout_s)
        self.max_action_age_steps = int(max_action_age_steps)
        self._spin_ns = int(spin_us * 1000.0)
        self.key = key
        self._key_path: str | None = None  # the key file this endpoint created (build), removed by close
        self._ctx = zmq.Context()
        self._obs_socks = [open_socket(self._ctx, zmq.PUSH, a, bind=True, hwm=hwm) for a in obs_addrs]
        self._action_sock = open_socket(self._ctx, zmq.PULL, action_addr, bind=True, hwm=hwm)
        self._poller = zmq.Poller()
        self._poller.register(self._action_sock, zmq.POLLIN)
        self._sender = Sender("obs", key)
        self._rx = Receiver("action", payload_schema("action", n_outputs, n_inputs, len(action_names)), key)
        self._n_outputs, self._n_inputs = n_outputs, n_inputs
        self._q_good = [QUALITY_GOOD] * n_outputs  # shared by every all-good observation
        self._obs_payload = {"y": None, "q": self._q_good, "u": None, "lockstep": False}
        self._lockstep = False
        self._published_step = -1
        self._pending: list[tuple[int, bytes]] = []  # (socket index, obs) not yet delivered
        self._last_action: np.ndarray | None = None
        self._last_step = -1  # observation step the held action answers
        self._last_arrival_step = -1
        self._lost = False  # lockstep: the chain missed its last answer
        self._in_fallback = True
        self.last_source = "none"
        self.last_mode = "none"
        self.last_advice: np.ndarray | None = None
        self._c = {
            "obs_sent": 0,
            "obs_unsent": 0,
            "obs_bad_quality": 0,
            "actions_applied": 0,
            "fallback_steps": 0,
            "fallback_rate_limited_steps": 0,
            "no_action_steps": 0,
            "watchdog_trips": 0,
            "lockstep_timeouts": 0,
            "dropped_future": 0,
        }

    @classmethod
    def build(cls, section, scenario, spec, key: bytes | None = None) -> "LoopBusEndpoint":
        """The loop's endpoint for a scenario; creates the run's bus secret (hil/bus_auth.py)
        unless `key` is given."""
        from hil.bus_auth import create_run_key
        from hil.bus_config import action_input_names, bus_input_names, loop_fallback_action

        names = action_input_names(scenario, spec)
        driven = set(bus_input_names(scenario, spec))
        pos = [i for i, n in enumerate(names) if n in driven]
        applied_names = [names[i] for i in pos]
        index = [spec.index("inputs", n) for n in applied_names]
        fallback = loop_fallback_action(section, scenario, spec, applied_names)
        lo = np.array([spec.quantity("inputs", n).low for n in applied_names], dtype=np.float64)
        hi = np.array([spec.quantity("inputs", n).high for n in applied_names], dtype=np.float64)
        rate = np.full(len(applied_names), np.inf)
        safety = getattr(scenario, "safety", None)
        if safety is not None:
            for i, n in enumerate(applied_names):
                if n in safety.projection.box:
                    b_lo, b_hi = safety.projection.box[n]
                    lo[i], hi[i] = max(lo[i], b_lo), min(hi[i], b_hi)
                if n in safety.projection.rate:
                    rate[i] = safety.projection.rate[n]
        name = scenario.name
        own_key = key is None
        if own_key:
            key = create_run_key(section, name)
        ep = cls(
            obs_addrs=[section.endpoint("obs_policy", name), section.endpoint("obs_safety", name)],
            action_addr=section.endpoint("action", name),
            n_outputs=spec.n_outputs,
            n_inputs=spec.n_inputs,
            action_names=names,
            apply_index=np.array(index, dtype=np.intp),
            apply_pos=np.array(pos, dtype=np.intp),
            fallback=fallback,
            watchdog_steps=section.watchdog_steps(scenario.loop.step_s),
            lockstep_timeout_s=section.lockstep_timeout_s,
            max_action_age_steps=section.max_action_age_steps,
            key=key,
            step_s=scenario.loop.step_s,
            fallback_rate=rate,
            fallback_lo=lo,
            fallback_hi=hi,
            hwm=section.hwm,
            spin_us=section.spin_us,
        )
        if own_key:
            from hil.bus_auth import KEY_FILE, run_dir

            ep._key_path = os.path.join(run_dir(section, name), KEY_FILE)
        return ep

    # ---- per step ----
    def before_step(self, step: int, t_s: float, u_cmd: np.ndarray, lockstep: bool) -> None:
        """Write the action for this step into u_cmd (bus-driven inputs, plant units)."""
        self._lockstep = lockstep
        if lockstep and self._published_step == step - 1 >= 0 and self._last_step < step - 1:
            self._wait_for(step)  # receives and takes the waiting actions itself
        else:
            self._take(step)
        if self._last_action is not None and step - self._last_arrival_step < self.watchdog_steps:
            np.take(self._last_action, self._apply_pos, out=self._act_buf)  # no per-step array
            u_cmd[self._apply_index] = self._act_buf
            self._in_fallback = False
            self._c["actions_applied"] += 1
            return
        self._fallback_into(u_cmd)
        if self._last_action is None:
            self._c["no_action_steps"] += 1
        else:
            self._c["fallback_steps"] += 1
            if not self._in_fallback:
                self._c["watchdog_trips"] += 1
        self._in_fallback = True
        self.last_source = "loop_fallback"

    def _fallback_into(self, u_cmd: np.ndarray) -> None:
        """The loop's own fallback: from the applied value toward the fallback action, at most
        max_step per step, inside the box."""
        w = self._fb_work
        applied = self._applied if self._have_applied else u_cmd[self._apply_index]
        np.subtract(self._fallback, applied, out=w)
        if (np.abs(w) > self._fb_max_step).any():
            self._c["fallback_rate_limited_steps"] += 1
            np.clip(w, -self._fb_max_step, self._fb_max_step, out=w)
        np.add(applied, w, out=w)
        np.clip(w, self._fb_lo, self._fb_hi, out=w)
        u_cmd[self._apply_index] = w

    def after_step(self, step: int, t_s: float, y_meas: np.ndarray, u_applied: np.ndarray) -> None:
        """Publish the observation of this step to the policy and the safety process; a
        non-finite measured output travels with Bad quality."""
        np.take(u_applied, self._apply_index, out=self._applied)
        self._have_applied = True
        p = self._obs_payload
        y = y_meas.tolist()
        p["y"] = y
        if isfinite(sum(y)):
            p["q"] = self._q_good
        else:
            q = [QUALITY_GOOD if isfinite(v) else QUALITY_BAD for v in y]
            p["q"] = q
            if QUALITY_BAD in q:
                self._c["obs_bad_quality"] += 1
        p["u"] = u_applied.tolist()
        p["lockstep"] = self._lockstep
        data = self._sender.encode(step, t_s, p)
        self._pending.clear()
        for i, sock in enumerate(self._obs_socks):  # the policy's first: the longer path
            if send_nowait(sock, data):
                self._c["obs_sent"] += 1
            else:
                self._c["obs_unsent"] += 1
                if self._lockstep:
                    self._pending.append((i, data))
        self._published_step = step

    # ---- internals ----
    def _take(self, step: int, first: bytes | None = None) -> None:
        """Drain the action socket (after `first`, already received); keep the newest valid action.

        Only the action acted on moves the receiver's replay window (Receiver.accept): a message
        dropped here (never published step, too old) cannot lock out later genuine actions."""
        newest = None
        raws = drain(self._action_sock)
        if first is not None:
            raws.insert(0, first)
        for raw in raws:
            msg = self._rx.decode(raw)
            if msg is None:
                continue
            if msg.step > self._published_step:
                self._c["dropped_future"] += 1  # answers an observation never published
                continue
            if msg.step < step - 1 - self.max_action_age_steps:
                self._rx.count("dropped_too_old")
                continue
            if newest is not None:
                self._rx.count("superseded")
            if newest is None or (msg.step, msg.sid, msg.seq) >= (newest.step, newest.sid, newest.seq):
                newest = msg
        if newest is None or newest.step < self._last_step or not self._rx.accept(newest):
            return
        self._last_action = newest.payload["a"]
        self._last_step = newest.step
        self._last_arrival_step = step
        self.last_source = newest.payload["source"]
        self.last_mode = newest.payload["mode"]
        self.last_advice = newest.payload["advice"]

    def _wait_for(self, step: int) -> None:
        """Lockstep: wait (bounded) for the action answering the observation of step - 1."""
        budget = self.lockstep_timeout_s if not self._lost else min(0.05, self.lockstep_timeout_s)
        deadline = time.monotonic() + budget
        while self._last_step < step - 1:
            if self._pending:
                self._pending = [(i, d) for i, d in self._pending if not send_nowait(self._obs_socks[i], d)]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._c["lockstep_timeouts"] += 1
                self._lost = True
                return
            if self._spin_ns and not self._pending:
                raw = recv_spin(self._action_sock, min(self._spin_ns, int(remaining * 1e9)))
                if raw is not None:
                    self._take(step, raw)
                    continue
            if self._pending:  # startup: a peer not connected yet; retry its send every 2 ms
                if self._poller.poll(max(1, int(min(remaining, 0.002) * 1000.0))):
                    self._take(step)
                continue
            # one blocking receive (one wake-up, fewer syscalls than a poll and a drain)
            self._action_sock.setsockopt(zmq.RCVTIMEO, max(1, math.ceil(remaining * 1000.0)))
            try:
                raw = self._action_sock.recv()
            except zmq.Again:
                continue
            self._take(step, raw)
        self._lost = False

    # ---- status ----
    def counters(self) -> dict[str, int]:
        out = dict(self._c)
        for k, v in self._rx.counters.items():
            out[f"action_{k}"] = v
        return out

    @property
    def in_fallback(self) -> bool:
        return self._in_fallback

    def close(self) -> None:
        for sock in self._obs_socks + [self._action_sock]:
            sock.close(0)
        self._ctx.term()
        if self._key_path:  # the run is over: its secret goes with it
            from hil.bus_auth import remove_run_key

            remove_run_key(self._key_path, self.key)
            self._key_path = None


def process_alive(pid: int) -> bool:
    """True while process `pid` exists (bus peers exit when the process that started them dies)."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
