"""The reset protocol between a campaign worker and the policy / safety processes it keeps warm.

A warm child (hil/campaign/warm_procs.py spawns it) holds one end of a Unix socket pair
besides its bootstrap pipe (the worker holds the other: nobody else can reach it). Between runs
the child is *parked*: its run's sockets, receivers, senders, monitor and decision log are
closed and it blocks reading the pair. The worker then writes one signed message:

    frame = uint32 LE length of body + tag, body (UTF-8 JSON), tag (16 bytes)
    tag   = BLAKE2b(body, key = reset key, person = b"hil:reset:" + role, digest_size = 16)
    body  = {"op": "reset", "run": N, "nonce": hex, "boot": {...}}    or {"op": "exit"}

The reset key is 32 random bytes the worker draws per process and hands over on the process's
bootstrap pipe: the safety's key never reaches the policy process (which could otherwise forge
a reset of the safety: put it back to the scenario's start mode mid-run), and the role is in
the tag's personalisation, so a frame made for one role is never valid for the other.
`boot` is what a fresh process would get on its bootstrap pipe (the run's scenario and bus
keys, for the safety its decision log and status paths) plus the run's injected process fault.
With a reset travels one descriptor (SCM_RIGHTS, on the frame's first byte): the run's stderr
file, which the child puts in place of its own stderr, as a fresh process inherits it; a
descriptor that comes with a refused frame is closed.

The child refuses (and counts, and answers with ok = false and the reason) a frame whose tag
is wrong (`forged`), whose run number is not above the last one it accepted or whose nonce it
has seen (`stale`: a replay of an earlier reset), or that is malformed. It stays parked after a
refusal. An accepted reset builds every per-run object again from `boot` and answers
{"nonce": the reset's nonce, "ok": true, "pid"} (answers are signed the same way); the worker
waits for exactly that nonce, so a late answer to an earlier reset is never taken for this one.

End of a run: the worker sends SIGUSR1; the child's run loop stops at its next wake-up (at
most its 0.2 s receive timeout), closes everything of the run, writes its final status and
answers {"op": "parked", "run": N}. SIGTERM still means exit. A closed pair (the worker died)
ends the child.

The pair belongs to the worker and the one child: the signature is a second line of defence
(a descriptor leaked to another process), the nonce and run number guard against a worker bug
replaying an old frame.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import socket
import struct
import time
from hmac import compare_digest

TAG_BYTES = 16
MAX_FRAME_BYTES = 16 << 20  # a scenario as JSON is tens of kB; anything near this is not ours
_LEN = struct.Struct("<I")
ROLES = ("policy", "safety")
PARK_SIGNAL = "SIGUSR1"


def _tag(key: bytes, role: str, body: bytes) -> bytes:
    if role not in ROLES:
        raise KeyError(f"unknown warm process role {role!r} (known: {', '.join(ROLES)})")
    return hashlib.blake2b(body, key=key, person=b"hil:reset:" + role.encode(), digest_size=TAG_BYTES).digest()


def encode(key: bytes, role: str, msg: dict) -> bytes:
    """One frame: length, JSON body, tag."""
    body = json.dumps(msg, separators=(",", ":")).encode()
    return _LEN.pack(len(body) + TAG_BYTES) + body + _tag(key, role, body)


def send_frame(sock: socket.socket, frame: bytes, fds: tuple = ()) -> None:
    """The whole frame; `fds` travel with its first byte (SCM_RIGHTS)."""
    if fds:
        n = socket.send_fds(sock, [frame], list(fds))
        frame = frame[n:]
    sock.sendall(frame)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None, fds: list) -> bytes | None:
    """n bytes; descriptors that come with them appended to `fds`. None at EOF or when the
    monotonic deadline passes first."""
    out = bytearray()
    while len(out) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                return None
        data, got, _flags, _addr = socket.recv_fds(sock, n - len(out), 4)
        fds.extend(got)
        if not data:
            return None
        out += data
    return bytes(out)


def recv_frame(sock: socket.socket, timeout_s: float | None = None) -> tuple[bytes | None, list[int]]:
    """(the next frame's body + tag, the descriptors that came with it); (None, fds) at EOF or
    after timeout_s wall s (None: no bound). ValueError for a length no frame has."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    fds: list[int] = []
    head = _recv_exact(sock, _LEN.size, deadline, fds)
    if head is None:
        return None, fds
    (n,) = _LEN.unpack(head)
    if not TAG_BYTES < n <= MAX_FRAME_BYTES:
        close_all(fds)
        raise ValueError(f"reset frame of {n} bytes (legal: {TAG_BYTES + 1}..{MAX_FRAME_BYTES})")
    return _recv_exact(sock, n, deadline, fds), fds


def close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def verify(key: bytes, role: str, raw: bytes) -> dict | None:
    """The JSON map of a frame whose tag is right, else None."""
    body, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
    if not compare_digest(_tag(key, role, body), tag):
        return None
    try:
        msg = json.loads(body)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


class ResetGate:
    """The child's side: which resets it obeys. Counters: resets (accepted), refused_forged,
    refused_stale, refused_malformed."""

    def __init__(self, key: bytes, role: str):
        self.key, self.role = key, role
        self.last_run = 0
        self._nonces: set[str] = set()
        self.counters = {"resets": 0, "refused_forged": 0, "refused_stale": 0, "refused_malformed": 0}

    def check(self, raw: bytes) -> tuple[dict | None, str]:
        """(message, "") if it is to be obeyed, else (None or the unsigned map, why refused)."""
        msg = verify(self.key, self.role, raw)
        if msg is None:
            self.counters["refused_forged"] += 1
            return None, "forged: the tag is not the worker's reset key for this role"
        op = msg.get("op")
        if op == "exit":
            return msg, ""
        run, nonce = msg.get("run"), msg.get("nonce")
        if op != "reset" or type(run) is not int or type(nonce) is not str or not isinstance(msg.get("boot"), dict):
            self.counters["refused_malformed"] += 1
            return None, "malformed: a reset needs op, run (int), nonce (str) and boot (map)"
        if run <= self.last_run or nonce in self._nonces:
            self.counters["refused_stale"] += 1
            return None, f"stale: run {run} after run {self.last_run} (or a nonce seen before)"
        self.last_run = run
        self._nonces.add(nonce)
        self.counters["resets"] += 1
        return msg, ""


class ChildLink:
    """A warm child's end of the socket pair (from its bootstrap message's "warm" entry)."""

    def __init__(self, warm: dict, role: str):
        try:
            fd = int(warm["fd"])
            key = bytes.fromhex(warm["key"])
        except (KeyError, TypeError, ValueError):
            raise ValueError("bootstrap.warm needs fd (int) and key (hex)") from None
        self.sock = socket.socket(fileno=fd)
        self.role = role
        self.gate = ResetGate(key, role)
        self.run = 0
        self.nonce = None

    def answer(self, msg: dict) -> None:
        send_frame(self.sock, encode(self.gate.key, self.role, {**msg, "pid": os.getpid()}))

    def parked(self) -> None:
        self.answer({"op": "parked", "run": self.run, "gate": dict(self.gate.counters)})

    def next_reset(self) -> dict | None:
        """Block until a reset this child obeys (its boot map), None on exit or a closed pair.
        Refused frames are answered (ok = false, why) and waited past. The descriptor a reset
        brings (the run's stderr) replaces this process's stderr."""
        while True:
            try:
                raw, fds = recv_frame(self.sock)
            except ValueError as exc:
                self.gate.counters["refused_malformed"] += 1
                self.answer({"ok": False, "why": f"malformed: {exc}"})
                return None  # the stream is out of step: nothing after it can be trusted
            if raw is None:
                close_all(fds)
                return None
            msg, why = self.gate.check(raw)
            if msg is None or msg["op"] == "exit" or len(fds) > 1:
                close_all(fds)
                if msg is None:
                    self.answer({"ok": False, "why": why, "nonce": None})
                    continue
                if msg["op"] == "exit":
                    return None
                self.answer({"ok": False, "why": "malformed: more than one descriptor", "nonce": None})
                continue
            if fds:
                import sys

                sys.stderr.flush()
                os.dup2(fds[0], 2)
                os.close(fds[0])
            self.run = msg["run"]
            self.nonce = msg["nonce"]
            return msg["boot"]

    def acknowledge(self, ok: bool, why: str = "") -> None:
        self.answer({"op": "reset", "run": self.run, "nonce": self.nonce, "ok": ok, "why": why})


def apply_fault_env(boot: dict, role: str) -> None:
    """The run's injected process fault (hil/campaign/process_faults.py) into this process's
    environment, where the runner reads it; removed when the run has none."""
    from hil.campaign.process_faults import ENV

    value = (boot.get("fault_env") or {}).get(ENV[role])
    if value:
        os.environ[ENV[role]] = value
    else:
        os.environ.pop(ENV[role], None)


def seed_run(scenario) -> None:
    """Every process of a run draws from the run's seed ([loop] seed): the global RNGs of numpy
    and `random` reseeded, cold start or reset alike, so a policy that uses them draws the same
    numbers in a warm process as in a fresh one."""
    import random

    import numpy as np

    seed = int(getattr(scenario.loop, "seed", 0) or 0)
    random.seed(seed)
    np.random.seed(seed % (1 << 32))


def serve_kept(warm: dict, role: str, serve, rebuild) -> int:
    """The cycle of a process kept alive across a campaign's runs (the policy's and the safety's):
    `serve(stop)` runs one run until SIGUSR1 (park) or SIGTERM/SIGINT (exit) appends to `stop`;
    on park, report parked, wait for the next signed reset, apply its fault environment,
    `rebuild(boot)` every per-run object (returns the new `serve`), acknowledge, serve again.
    Returns the process's exit code: 0 on exit or a closed link, 2 when a rebuild failed (the
    worker then starts a fresh process)."""
    import signal

    link = ChildLink(warm, role)
    stop: list = []
    signal.signal(signal.SIGUSR1, lambda *_: stop.append("park"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append("exit"))
    while True:
        serve(stop)
        if "park" not in stop or "exit" in stop:
            return 0
        link.parked()
        boot = link.next_reset()
        if boot is None or "exit" in stop:
            return 0
        stop.clear()
        try:
            apply_fault_env(boot, role)
            serve = rebuild(boot)
        except Exception as exc:  # noqa: BLE001  (refused: the worker starts a fresh process)
            link.acknowledge(False, f"{type(exc).__name__}: {exc}")
            return 2
        link.acknowledge(True)
