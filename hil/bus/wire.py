"""The bus's wire format: fixed binary frames, their encoding (`Sender`) and checking (`Receiver`).

A frame is a fixed 48-byte header, a kind-specific body, then a 16-byte keyed BLAKE2b tag over
header + body (hil/bus/auth.py). Every number is little-endian.

    header (struct "<BBHHHqqqdq", 48 bytes)
      v        uint8    schema version (SCHEMA_VERSION); anything else is dropped
      kind     uint8    1 obs (loop -> policy, safety), 2 proposal (policy -> safety),
                        3 action (safety -> loop), 4 command (safety -> policy)
      flags    uint16   obs: bit 0 lockstep; action: bit 0 advice present; proposal: bit 0
                        abstain (the policy will not answer this observation: its action is zeros
                        and no member, and the safety's fallback acts at once); others: 0
      n0, n1   uint16   counts: obs n_outputs, n_inputs; proposal n_actions, n_members;
                        action n_actions, 0; command 0, 0
      sid      int64    sender session: time.time_ns() when the sender started, so a restarted
                        sender is newer than its previous life and a replay of an old one older
      seq      int64    per-session sequence number, strictly increasing from 1
      step     int64    loop step of the observation the message is about (obs: its own step;
                        proposal / action: the observation they answer; command: -1)
      t_s      float64  simulated time of that observation (s)
      wall_ns  int64    time.time_ns() at send
    body, per kind (vectors are float64 in plant units, in the scenario's order)
      obs       y[n0], u[n1] float64, then q[n0] uint8 (quality: 0 Good, 1 Uncertain, 2 Bad)
      proposal  compute_us float64, a[n0], members[n1 x n0] float64 (row-major), str version
      action    a[n0] float64, advice[n0] float64 if flags bit 0, str source, str mode
      command   str op, str version, str reason
    str: uint16 byte length (at most MAX_STR) + UTF-8 bytes. The frame ends exactly there.

A receiver reads the floats straight out of the frame (struct.unpack_from, np.frombuffer) and
copies only what it hands out. A non-finite y is allowed only where q is Bad (a dropout travels
as Bad, it does not drop the whole observation); receivers hand out y with NaN wherever q is Bad.

`Receiver.decode` drops and counts, never acts on, in this order: a length outside the legal
frame lengths of its kind for the scenario's counts (`dropped_size`, checked before any byte is
hashed or copied; the socket's ZMQ_MAXMSGSIZE already refuses what is longer), a missing or wrong tag
(`dropped_auth`, checked before any byte is parsed), a frame shorter than its header
(`dropped_malformed`), a wrong schema version or kind (`dropped_schema`), bad header values or
flags (`dropped_malformed`), counts that are not the scenario's (`dropped_shape`), a length
that does not match the counts, bad quality codes, strings that are too long or not UTF-8
(`dropped_malformed`), non-finite numbers outside Bad quality (`dropped_nonfinite`), and (sid,
seq) not newer than the last accepted (`dropped_replay`). `decode` changes no replay state: the
consumer calls `accept(msg)` for the message it acts on, so a message it drops for its own rule
(an action for a step too old or never published) never moves the replay window.
"""

from __future__ import annotations

import hashlib
import struct
import time
from dataclasses import dataclass
from hmac import compare_digest
from math import isfinite

import numpy as np

from hil.bus.auth import TAG_BYTES, channel_key

SCHEMA_VERSION = 2  # 1 was the msgpack map format
KINDS = ("obs", "proposal", "action", "command", "supervisor")
KIND_CODES = {"obs": 1, "proposal": 2, "action": 3, "command": 4, "supervisor": 5}
HEADER = struct.Struct("<BBHHHqqqdq")
HEADER_BYTES = HEADER.size  # 48
_STEP_AT = struct.calcsize("<BBHHHqq")  # 24: the header's step field
_STEP = struct.Struct("<q")
MAX_MEMBERS = 64  # ensemble members a proposal may carry
MAX_STR = 256  # bytes of UTF-8
MAX_MESSAGE_BYTES = 1 << 20  # a ceiling for sockets whose frames are not the bus's (not used by the bus sockets)
MAX_CONTROL_BYTES = 64 << 10  # an operator request (a small msgpack map + tag)
FLAG_LOCKSTEP = 1  # obs
FLAG_ADVICE = 1  # action
FLAG_ABSTAIN = 1  # proposal: the policy is silent on this observation by its own decision (lockstep)
FLAG_ALLOW_POLICY = 1  # supervisor: the policy's proposals may act (else the shield's fallback law)

QUALITY_GOOD, QUALITY_UNCERTAIN, QUALITY_BAD = 0, 1, 2

DROP_COUNTERS = (
    "dropped_size",  # longer or shorter than any legal frame of this kind (checked before the tag)
    "dropped_auth",  # no tag, or a tag not made with the run's key for this channel
    "dropped_malformed",  # truncated or overlong frame, bad header values, flags, strings, quality codes
    "dropped_schema",  # wrong schema version or wrong kind for this socket
    "dropped_shape",  # vector counts that are not the scenario's
    "dropped_nonfinite",  # NaN or infinity anywhere (in y: where q is not Bad)
    "dropped_replay",  # (sid, seq) not newer than the last accepted: replay or old seq
    "dropped_too_old",  # answers an observation older than the consumer accepts
)

NUMPY_PACK_MIN = 64  # floats in an observation above which numpy packs and checks them (below: struct)
_F8 = np.dtype("<f8")
_U1 = np.dtype("u1")
_LEN = struct.Struct("<H")
_F64 = struct.Struct("<d")
_INT64_MAX = (1 << 63) - 1


def payload_schema(kind: str, n_outputs: int, n_inputs: int, n_actions: int) -> dict[str, tuple]:
    """Field -> (type, length) of a payload, as Receiver hands it out. Types: vec, optvec, mat,
    str, bool, num, and for observations yvec (NaN where the quality is Bad) and qual (uint8)."""
    if kind == "obs":
        return {"y": ("yvec", n_outputs), "q": ("qual", n_outputs), "u": ("vec", n_inputs),
                "lockstep": ("bool", 0)}
    if kind == "proposal":
        return {"a": ("vec", n_actions), "members": ("mat", n_actions), "version": ("str", 0),
                "compute_us": ("num", 0)}
    if kind == "action":
        return {"a": ("vec", n_actions), "source": ("str", 0), "mode": ("str", 0), "advice": ("optvec", n_actions)}
    if kind == "command":
        return {"op": ("str", 0), "version": ("str", 0), "reason": ("str", 0)}
    if kind == "supervisor":  # the safety process's decision for the in-loop shield (hil/loop/shield_bus.py)
        return {"allow": ("bool", 0), "lo": ("bandvec", n_actions), "hi": ("bandvec", n_actions),
                "mode": ("str", 0), "reason": ("str", 0)}
    raise KeyError(f"unknown message kind {kind!r}")


def max_frame_bytes(kind: str, n_outputs: int, n_inputs: int, n_actions: int) -> int:
    """The largest legal frame of `kind` for the scenario's counts, tag included (bytes): what
    each receiving socket allows (ZMQ_MAXMSGSIZE) and `Receiver.decode` checks before hashing."""
    if kind == "obs":
        return HEADER_BYTES + 8 * (n_outputs + n_inputs) + n_outputs + TAG_BYTES
    if kind == "proposal":
        return HEADER_BYTES + 8 * (1 + n_actions * (1 + MAX_MEMBERS)) + 2 + MAX_STR + TAG_BYTES
    if kind == "action":
        return HEADER_BYTES + 8 * 2 * n_actions + 2 * (2 + MAX_STR) + TAG_BYTES
    if kind == "command":
        return HEADER_BYTES + 3 * (2 + MAX_STR) + TAG_BYTES
    if kind == "supervisor":
        return HEADER_BYTES + 8 * 2 * n_actions + 2 * (2 + MAX_STR) + TAG_BYTES
    raise KeyError(f"unknown message kind {kind!r}")


def peek_step(raw) -> int | None:
    """The header's step field of a frame, UNCHECKED (no tag, no schema): only for skipping a
    frame the caller would not act on whatever it holds, before paying for `Receiver.decode`
    (an observation off the policy's rate: the policy and the supervisor answer one observation
    in `every`, and decoding the others cost each process ~40 us a frame on a loaded machine,
    1000 a second at 1 kHz). A frame acted on is always decoded; a forged frame skipped this
    way is counted as skipped instead of dropped_auth, and nothing acts on it either way.
    None for a frame shorter than a header."""
    if len(raw) < HEADER_BYTES:
        return None
    return _STEP.unpack_from(raw, _STEP_AT)[0]


@dataclass(slots=True)
class Message:
    """A validated message; vectors in `payload` are float64 arrays (quality: uint8), owned by it."""

    kind: str
    sid: int
    seq: int
    step: int
    t_s: float
    wall_ns: int
    payload: dict
    raw_len: int = 0


def pack_frame(kind_code: int, *, sid: int, seq: int, step: int, t_s: float, wall_ns: int, flags: int = 0,
               n0: int = 0, n1: int = 0, body: bytes = b"", version: int = SCHEMA_VERSION) -> bytes:
    """Header + body, unsigned (tests and tools build any frame with it; `Sender` signs)."""
    return HEADER.pack(version, kind_code, flags, n0, n1, sid, seq, step, t_s, wall_ns) + body


def pack_str(text: str) -> bytes:
    """A string field: uint16 byte length + UTF-8 bytes; ValueError beyond MAX_STR bytes."""
    b = text.encode("utf-8")
    if len(b) > MAX_STR:
        raise ValueError(f"a bus string has at most {MAX_STR} UTF-8 bytes, got {len(b)}: {text[:40]!r}...")
    return _LEN.pack(len(b)) + b


def _f8_bytes(a, n: int | None = None) -> bytes:
    arr = np.ascontiguousarray(a, dtype=_F8)
    if n is not None and arr.size != n:
        raise ValueError(f"expected {n} values, got {arr.size}")
    return arr.tobytes()


class Sender:
    """Stamps, encodes and signs messages of one kind for one sending session.

    `key`: the run's bus secret (or a dict of channel keys); `channel`: the socket's channel
    (default: the kind; the safety's advice copies of actions go out on "advice"). The fast
    paths `encode_obs`, `encode_proposal`, `encode_action` take numpy arrays; `encode` takes a
    payload map (lists or arrays) as `payload_schema` names its fields."""

    def __init__(self, kind: str, key, sid: int | None = None, channel: str | None = None):
        if kind not in KINDS:
            raise KeyError(f"unknown message kind {kind!r}")
        self.kind = kind
        self._code = KIND_CODES[kind]
        self.sid = time.time_ns() if sid is None else int(sid)
        if not 0 <= self.sid <= _INT64_MAX:
            raise ValueError(f"a session id is in 0..2**63-1, got {self.sid}")
        self.seq = 0
        self._hasher = hashlib.blake2b(key=channel_key(key, channel or kind), digest_size=TAG_BYTES)
        self._strs: dict[str, bytes] = {}  # encoded string fields (source, mode, version: few values)
        self._obs_shape = (-1, -1)

    def _sign(self, frame) -> bytes:
        h = self._hasher.copy()  # the keyed state, computed once
        h.update(frame)
        return h.digest()

    def _str(self, text: str) -> bytes:
        b = self._strs.get(text)
        if b is None:
            b = pack_str(text)
            if len(self._strs) < 64:
                self._strs[text] = b
        return b

    def _header(self, step: int, t_s: float, flags: int, n0: int, n1: int) -> bytes:
        self.seq += 1
        return HEADER.pack(SCHEMA_VERSION, self._code, flags, n0, n1, self.sid, self.seq, step, t_s, time.time_ns())

    # ---- fast paths ----
    def encode_obs(self, step: int, t_s: float, y, u, q: np.ndarray | None = None, lockstep: bool = False) -> bytes:
        """An observation frame; y, u float vectors (arrays or lists), q uint8 quality per output
        (None: all Good). Packed with one struct call into a buffer kept between messages."""
        ny, nu = len(y), len(u)
        if self._obs_shape != (ny, nu):
            self._obs_shape = (ny, nu)
            self._obs_struct = struct.Struct(HEADER.format + f"{ny + nu}d")
            self._obs_q_at = self._obs_struct.size
            self._obs_end = self._obs_q_at + ny
            self._obs_buf = bytearray(self._obs_end + TAG_BYTES)
            self._obs_mv = memoryview(self._obs_buf)
            self._q_good = bytes(ny)
            # large vectors (a grid's thousands of outputs): copied by numpy into the buffer, ~10x
            # cheaper than a list and one struct call per float
            self._obs_f = (np.frombuffer(self._obs_buf, _F8, ny + nu, HEADER_BYTES)
                           if ny + nu > NUMPY_PACK_MIN else None)
        self.seq += 1
        buf, end, q_at = self._obs_buf, self._obs_end, self._obs_q_at
        flags = FLAG_LOCKSTEP if lockstep else 0
        f = self._obs_f
        if f is not None:
            HEADER.pack_into(buf, 0, SCHEMA_VERSION, 1, flags, ny, nu, self.sid, self.seq, step, t_s, time.time_ns())
            f[:ny] = y
            f[ny:] = u
        else:
            if type(y) is not list:
                y = y.tolist()
            if type(u) is not list:
                u = u.tolist()
            self._obs_struct.pack_into(buf, 0, SCHEMA_VERSION, 1, flags, ny, nu, self.sid, self.seq, step, t_s,
                                       time.time_ns(), *y, *u)
        if q is None:
            buf[q_at:end] = self._q_good
        else:
            qb = np.ascontiguousarray(q, dtype=_U1).tobytes()
            if len(qb) != ny:
                raise ValueError(f"q has {len(qb)} codes for {ny} outputs")
            buf[q_at:end] = qb
        mv = self._obs_mv
        mv[end:] = self._sign(mv[:end])
        return bytes(buf)

    def encode_proposal(self, step: int, t_s: float, a: np.ndarray, members: np.ndarray | None, version: str,
                        compute_us: float) -> bytes:
        """A proposal frame: action a[n], members (m x n, or None for none), policy version."""
        n = len(a)
        if members is None or len(members) == 0:
            m, mb = 0, b""
        else:
            members = np.ascontiguousarray(members, dtype=_F8)
            if members.ndim != 2 or members.shape[1] != n:
                raise ValueError(f"members must be (m, {n}), got {members.shape}")
            m, mb = members.shape[0], members.tobytes()
        frame = b"".join((self._header(step, t_s, 0, n, m), _F64.pack(compute_us), _f8_bytes(a), mb,
                          self._str(version)))
        return frame + self._sign(frame)

    def encode_abstain(self, step: int, t_s: float, n_actions: int, version: str, compute_us: float) -> bytes:
        """An abstention: the policy answers observation `step` with no action (its output was
        invalid or it raised), so the receiver need not wait for a proposal that will not come.
        Same frame length as a proposal without members; the action is zeros."""
        frame = b"".join((self._header(step, t_s, FLAG_ABSTAIN, n_actions, 0), _F64.pack(compute_us),
                          bytes(8 * n_actions), self._str(version)))
        return frame + self._sign(frame)

    def encode_action(self, step: int, t_s: float, a: np.ndarray, source: str, mode: str,
                      advice: np.ndarray | None = None) -> bytes:
        """An action frame: a[n], source, mode, and the advice vector (advisory mode) or None."""
        n = len(a)
        parts = [self._header(step, t_s, 0 if advice is None else FLAG_ADVICE, n, 0), _f8_bytes(a)]
        if advice is not None:
            parts.append(_f8_bytes(advice, n))
        parts += (self._str(source), self._str(mode))
        frame = b"".join(parts)
        return frame + self._sign(frame)

    def encode_command(self, step: int, t_s: float, op: str, version: str, reason: str) -> bytes:
        frame = self._header(step, t_s, 0, 0, 0) + pack_str(op) + pack_str(version) + pack_str(reason)
        return frame + self._sign(frame)

    def encode_supervisor(self, step: int, t_s: float, allow: bool, lo: np.ndarray, hi: np.ndarray, mode: str,
                          reason: str) -> bytes:
        """A supervisor decision (the safety process to the loop's shield): whether the policy may
        act, the envelope band [lo, hi] per action input (plant units; +-inf: no band), the
        rollout mode and why (answers observation `step`)."""
        n = len(lo)
        frame = b"".join((self._header(step, t_s, FLAG_ALLOW_POLICY if allow else 0, n, 0), _f8_bytes(lo),
                          _f8_bytes(hi, n), self._str(mode), pack_str(reason)))
        return frame + self._sign(frame)

    def encode(self, step: int, t_s: float, payload: dict) -> bytes:
        """Next message from a payload map (the fields of `payload_schema`; vectors as lists or
        arrays). ValueError for a payload the format cannot carry (a sender's bug)."""
        p, kind = payload, self.kind
        if kind == "obs":
            y = np.asarray(p["y"], dtype=_F8)
            q = np.asarray(p["q"], dtype=_U1)
            if q.shape != y.shape:
                raise ValueError(f"q has {q.size} codes for {y.size} outputs")
            return self.encode_obs(step, t_s, y, np.asarray(p["u"], dtype=_F8), q, bool(p["lockstep"]))
        if kind == "proposal":
            members = p["members"]
            mem = None if members is None or len(members) == 0 else np.asarray(members, dtype=_F8)
            return self.encode_proposal(step, t_s, np.asarray(p["a"], dtype=_F8), mem, p["version"],
                                        float(p["compute_us"]))
        if kind == "action":
            adv = p["advice"]
            return self.encode_action(step, t_s, np.asarray(p["a"], dtype=_F8), p["source"], p["mode"],
                                      None if adv is None else np.asarray(adv, dtype=_F8))
        if kind == "supervisor":
            return self.encode_supervisor(step, t_s, bool(p["allow"]), np.asarray(p["lo"], dtype=_F8),
                                          np.asarray(p["hi"], dtype=_F8), p["mode"], p["reason"])
        return self.encode_command(step, t_s, p["op"], p["version"], p["reason"])


def vec(a) -> list[float]:
    """A float vector as a list (for JSON and logs; the wire carries arrays)."""
    return np.asarray(a, dtype=np.float64).tolist()


class _Bad(Exception):
    def __init__(self, counter: str):
        self.counter = counter


def _finite_values(vals: tuple) -> bool:
    """Every float finite: a finite plain sum proves it (NaN and infinities propagate); a sum
    that overflowed from finite terms falls to the element-wise check."""
    return isfinite(sum(vals)) or all(map(isfinite, vals))


def _strings(raw, pos: int, end: int, k: int) -> list[str]:
    """k string fields from pos, ending exactly at end; or raise _Bad."""
    out = []
    for _ in range(k):
        if pos + 2 > end:
            raise _Bad("dropped_malformed")
        n = raw[pos] | (raw[pos + 1] << 8)
        pos += 2
        if n > MAX_STR or pos + n > end:
            raise _Bad("dropped_malformed")
        try:
            out.append(str(raw[pos:pos + n], "utf-8"))
        except UnicodeDecodeError:
            raise _Bad("dropped_malformed") from None
        pos += n
    if pos != end:
        raise _Bad("dropped_malformed")
    return out


class Receiver:
    """Authenticates and validates one stream of frames of one kind; counts what it dropped.

    `key`: the run's bus secret (or channel keys); `channel`: the socket's channel (default: the
    kind); `schema`: `payload_schema(kind, ...)`, whose lengths the frames must carry."""

    def __init__(self, kind: str, schema: dict[str, tuple], key, channel: str | None = None):
        if kind not in KINDS:
            raise KeyError(f"unknown message kind {kind!r}")
        self.kind = kind
        self.schema = schema
        self._code = KIND_CODES[kind]
        self._hasher = hashlib.blake2b(key=channel_key(key, channel or kind), digest_size=TAG_BYTES)
        if kind == "obs":
            self._n0, self._n1 = schema["y"][1], schema["u"][1]
            self._nf = self._n0 + self._n1
            self._q_at = HEADER_BYTES + 8 * self._nf
            self._obs_end = self._q_at + self._n0
            self._obs_floats = struct.Struct(f"<{self._nf}d")
            self._q_good = bytes(self._n0)  # every quality Good
        elif kind in ("proposal", "action"):
            self._n0, self._n1 = schema["a"][1], 0
        elif kind == "supervisor":
            self._n0, self._n1 = schema["lo"][1], 0
        else:
            self._n0 = self._n1 = 0
        self._floats: dict[int, struct.Struct] = {}  # count -> struct of that many float64
        if kind == "obs":  # fixed length: exactly this many bytes
            self.min_bytes = self.max_bytes = self._obs_end + TAG_BYTES
        else:
            self.min_bytes = HEADER_BYTES + TAG_BYTES
            self.max_bytes = max_frame_bytes(kind, 0, 0, self._n0)
        self._body = {"obs": self._obs, "proposal": self._proposal, "action": self._action,
                      "command": self._command, "supervisor": self._supervisor}[kind]
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
        c = self.counters
        c["received"] += 1
        n = len(raw)
        end = n - TAG_BYTES
        if end < 0:
            c["dropped_auth"] += 1
            return None
        if n > self.max_bytes or n < self.min_bytes:  # before hashing: a flood of big frames costs nothing
            c["dropped_size"] += 1
            return None
        h = self._hasher.copy()  # the keyed state, computed once
        h.update(raw[:end])
        if not compare_digest(h.digest(), raw[end:]):
            c["dropped_auth"] += 1
            return None
        try:
            if end < HEADER_BYTES:
                raise _Bad("dropped_malformed")
            v, code, flags, n0, n1, sid, seq, step, t_s, wall_ns = HEADER.unpack_from(raw)
            if v != SCHEMA_VERSION or code != self._code:
                raise _Bad("dropped_schema")
            if seq < 1 or step < -1 or sid < 0:
                raise _Bad("dropped_malformed")
            if not isfinite(t_s):
                raise _Bad("dropped_nonfinite")
            payload = self._body(raw, end, flags, n0, n1)
        except _Bad as bad:
            c[bad.counter] += 1
            return None
        if (sid, seq) <= self.last:
            c["dropped_replay"] += 1
            return None
        return Message(self.kind, sid, seq, step, t_s, wall_ns, payload, n)

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

    # ---- bodies (raise _Bad) ----
    def _f8(self, raw, offset: int, n: int) -> tuple:
        st = self._floats.get(n)
        if st is None:
            st = self._floats[n] = struct.Struct(f"<{n}d")
        return st.unpack_from(raw, offset)

    def _obs(self, raw, end: int, flags: int, n0: int, n1: int) -> dict:
        if flags & ~FLAG_LOCKSTEP:
            raise _Bad("dropped_malformed")
        if n0 != self._n0 or n1 != self._n1:
            raise _Bad("dropped_shape")
        if end != self._obs_end:
            raise _Bad("dropped_malformed")
        q_at = self._q_at
        if raw[q_at:end] == self._q_good:  # the usual case: every output Good, every value finite
            if n0 + n1 > NUMPY_PACK_MIN:
                f = np.frombuffer(raw, _F8, n0 + n1, HEADER_BYTES).copy()
                if not np.isfinite(f).all():
                    raise _Bad("dropped_nonfinite")
            else:
                if not _finite_values(self._obs_floats.unpack_from(raw, HEADER_BYTES)):
                    raise _Bad("dropped_nonfinite")
                f = np.frombuffer(raw, _F8, n0 + n1, HEADER_BYTES).copy()
            q = np.zeros(n0, _U1)
        else:
            q = np.frombuffer(raw, _U1, n0, q_at).copy()
            if q.max() > QUALITY_BAD:
                raise _Bad("dropped_malformed")
            f = np.frombuffer(raw, _F8, n0 + n1, HEADER_BYTES).copy()
            bad = q == QUALITY_BAD
            f[:n0][bad] = 0.0  # whatever a Bad output carries is not checked ...
            if not np.isfinite(f).all():
                raise _Bad("dropped_nonfinite")
            f[:n0][bad] = np.nan  # ... and is handed out as NaN
        return {"y": f[:n0], "q": q, "u": f[n0:], "lockstep": flags == FLAG_LOCKSTEP}

    def _proposal(self, raw, end: int, flags: int, n0: int, n1: int) -> dict:
        if flags & ~FLAG_ABSTAIN or (flags and n1):
            raise _Bad("dropped_malformed")
        if n0 != self._n0:
            raise _Bad("dropped_shape")
        if n1 > MAX_MEMBERS:
            raise _Bad("dropped_malformed")
        nf = 1 + n0 * (1 + n1)
        pos = HEADER_BYTES + 8 * nf
        if pos > end:
            raise _Bad("dropped_malformed")
        (version,) = _strings(raw, pos, end, 1)
        if not _finite_values(self._f8(raw, HEADER_BYTES, nf)):
            raise _Bad("dropped_nonfinite")
        f = np.frombuffer(raw, _F8, nf, HEADER_BYTES).copy()
        return {"a": f[1:1 + n0], "members": f[1 + n0:].reshape(n1, n0), "version": version,
                "compute_us": float(f[0]), "abstain": flags == FLAG_ABSTAIN}

    def _action(self, raw, end: int, flags: int, n0: int, n1: int) -> dict:
        if flags & ~FLAG_ADVICE or n1:
            raise _Bad("dropped_malformed")
        if n0 != self._n0:
            raise _Bad("dropped_shape")
        nf = 2 * n0 if flags else n0
        pos = HEADER_BYTES + 8 * nf
        if pos > end:
            raise _Bad("dropped_malformed")
        source, mode = _strings(raw, pos, end, 2)
        if not _finite_values(self._f8(raw, HEADER_BYTES, nf)):
            raise _Bad("dropped_nonfinite")
        f = np.frombuffer(raw, _F8, nf, HEADER_BYTES).copy()
        return {"a": f[:n0], "source": source, "mode": mode, "advice": f[n0:] if flags else None}

    def _command(self, raw, end: int, flags: int, n0: int, n1: int) -> dict:
        if flags or n0 or n1:
            raise _Bad("dropped_malformed")
        op, version, reason = _strings(raw, HEADER_BYTES, end, 3)
        return {"op": op, "version": version, "reason": reason}

    def _supervisor(self, raw, end: int, flags: int, n0: int, n1: int) -> dict:
        if flags & ~FLAG_ALLOW_POLICY or n1:
            raise _Bad("dropped_malformed")
        if n0 != self._n0:
            raise _Bad("dropped_shape")
        pos = HEADER_BYTES + 16 * n0
        if pos > end:
            raise _Bad("dropped_malformed")
        mode, reason = _strings(raw, pos, end, 2)
        f = np.frombuffer(raw, _F8, 2 * n0, HEADER_BYTES).copy()
        lo, hi = f[:n0], f[n0:]
        if np.isnan(f).any() or (lo == np.inf).any() or (hi == -np.inf).any():
            raise _Bad("dropped_nonfinite")  # a band may be open (-inf, inf), never NaN or empty at infinity
        if (lo > hi).any():
            raise _Bad("dropped_malformed")
        return {"allow": bool(flags & FLAG_ALLOW_POLICY), "lo": lo, "hi": hi, "mode": mode, "reason": reason}
