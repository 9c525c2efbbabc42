"""The ZeroMQ bus: its sockets and the loop's end of the bus (LoopBusEndpoint).

Messages are fixed binary frames signed with a keyed BLAKE2b tag: the format, its encoding and
its checks live in hil/bus/wire.py (re-exported here); the keys in hil/bus/auth.py. Only
processes holding the run's secret (or the channel's key) can produce a frame any receiver
accepts, and a receiver checks the tag before it parses a byte.
"""

from __future__ import annotations

import math
import os
import time
from math import isfinite

import numpy as np
import zmq

from hil.bus.auth import ensure_private_dir
from hil.processes import process_alive  # noqa: F401  (re-exported: bus peers watch their parent)
from hil.bus.wire import (  # noqa: F401  (the bus's public names)
    DROP_COUNTERS,
    HEADER,
    HEADER_BYTES,
    KIND_CODES,
    KINDS,
    MAX_MEMBERS,
    MAX_CONTROL_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_STR,
    NUMPY_PACK_MIN,
    QUALITY_BAD,
    QUALITY_GOOD,
    QUALITY_UNCERTAIN,
    SCHEMA_VERSION,
    Message,
    Receiver,
    Sender,
    pack_frame,
    max_frame_bytes,
    pack_str,
    payload_schema,
    vec,
)


# ---- sockets ----


DRAIN_CAP = 256  # messages a consumer reads from one socket per wake-up / loop step (the rest wait)
# pyzmq's constants as plain ints for the per-message paths: `int & zmq.POLLIN` builds an IntFlag
# member (enum machinery, ~2 us a time in Python), `int & POLLIN` is one machine operation
POLLIN, NOBLOCK, ZMQ_EVENTS = int(zmq.POLLIN), int(zmq.NOBLOCK), int(zmq.EVENTS)


def open_socket(ctx: zmq.Context, socket_type: int, addr: str, bind: bool, hwm: int = 64,
                max_bytes: int | None = None) -> zmq.Socket:
    """A socket that never lingers; a connecting PUSH queues nothing while not connected.
    `max_bytes`: the largest message a receiving socket takes (ZMQ_MAXMSGSIZE: a larger one
    drops its sender's connection before it is buffered); give the largest legal frame of the
    socket's kind (hil.bus.wire.max_frame_bytes). Receiving sockets default to MAX_MESSAGE_BYTES."""
    sock = ctx.socket(socket_type)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    if socket_type in (zmq.PULL, zmq.SUB, zmq.REP, zmq.ROUTER, zmq.PUSH, zmq.PUB):
        # every socket: a PUSH or PUB peer can send nothing we read, but an unbounded frame
        # would still be buffered by zmq before it is dropped
        sock.setsockopt(zmq.MAXMSGSIZE, max_bytes or MAX_MESSAGE_BYTES)
    if not bind:
        sock.setsockopt(zmq.RECONNECT_IVL, 20)  # ms; a peer that starts later is found quickly
        if socket_type in (zmq.PUSH, zmq.PUB, zmq.REQ):
            sock.setsockopt(zmq.IMMEDIATE, 1)
    if bind:
        owner = None
        if addr.startswith("ipc://"):  # a private directory (ours; or the policy's, below ours) or a ConfigError
            owner = ensure_socket_dir(os.path.dirname(os.path.abspath(addr[6:])))
        sock.bind(addr)
        if addr.startswith("ipc://"):
            _own_socket_file(addr[6:], owner)
    else:
        sock.connect(addr)
    return sock


def ensure_socket_dir(d: str) -> int:
    """The uid that may connect to sockets bound in directory `d`: this user's for a private run
    directory (hil.bus.auth.ensure_private_dir), the policy's uid for `<run dir>/policy` (made by
    hil.confine.prepare_policy_dir; created 0700 and ours if missing). ConfigError otherwise."""
    from hil.confine import POLICY_SUBDIR, policy_dir_owner

    if os.path.basename(d) == POLICY_SUBDIR:
        ensure_private_dir(os.path.dirname(d))
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        owner = policy_dir_owner(d)
        if owner is None:
            from hil.errors import ConfigError

            raise ConfigError("bus.ipc_dir", f"{d} is not a 0700 directory under a private run directory")
        return owner
    ensure_private_dir(d)
    return os.geteuid()


def _own_socket_file(path: str, uid: int | None) -> None:
    """An ipc socket file just bound: mode 0600, owned by `uid` (who may connect to it)."""
    try:
        os.chmod(path, 0o600)
        if uid is not None and uid != os.geteuid():
            os.chown(path, uid, -1)
    except OSError:
        pass


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


def drain(sock: zmq.Socket, max_messages: int = DRAIN_CAP, ready: bool = False) -> list[bytes]:
    """The messages waiting on `sock` (at most max_messages), without blocking.

    Between receives it asks the socket's event state (ZMQ_EVENTS), which costs less in Python
    than a non-blocking receive that raises zmq.Again on an empty queue (the usual last call).
    `ready`: a poll just said a message is waiting, so the first call is the receive itself."""
    out = []
    events, recv, again = sock.getsockopt, sock.recv, zmq.Again
    if not ready and not events(ZMQ_EVENTS) & POLLIN:
        return out
    while len(out) < max_messages:
        try:
            out.append(recv(NOBLOCK))
        except again:
            break
        if not events(ZMQ_EVENTS) & POLLIN:
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

    Every message in and out is signed with `key`, the run's bus secret (hil/bus/auth.py).
    """

    def __init__(
        self,
        *,
        obs_addrs: list[str],
        action_addr: str | None,
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
        self._poller = zmq.Poller()
        self._action_sock = None  # none when the shield decides in the loop (hil/loop/shield_bus.py)
        if action_addr is not None:
            self._action_sock = open_socket(self._ctx, zmq.PULL, action_addr, bind=True, hwm=hwm,
                                            max_bytes=max_frame_bytes("action", n_outputs, n_inputs, len(action_names)))
            self._poller.register(self._action_sock, zmq.POLLIN)
        self._sender = Sender("obs", key)
        self._rx = Receiver("action", payload_schema("action", n_outputs, n_inputs, len(action_names)), key)
        self._n_outputs, self._n_inputs = n_outputs, n_inputs
        self._q_work = np.zeros(n_outputs, dtype=np.uint8)  # quality, when an output is not finite
        self._rcvtimeo_ms = -1  # the action socket's receive timeout as last set
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
            "action_drain_capped_steps": 0,
        }

    @classmethod
    def build(cls, section, scenario, spec, key: bytes | None = None) -> "LoopBusEndpoint":
        """The loop's endpoint for a scenario; creates the run's bus secret (hil/bus/auth.py)
        unless `key` is given."""
        from hil.bus.auth import create_run_key
        from hil.bus.config import action_input_names, bus_input_names, loop_fallback_action

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
            from hil.confine import set_non_dumpable

            set_non_dumpable()  # before it holds the secret: no same-uid process reads its memory
            key = create_run_key(section, name)
        if getattr(scenario, "policy", None) is not None:
            from hil.bus.auth import run_dir
            from hil.confine import policy_confinement, prepare_policy_dir

            prepare_policy_dir(ensure_private_dir(run_dir(section, name)), policy_confinement(scenario.policy))
        ep = cls(
            obs_addrs=[section.endpoint("obs_policy", name), section.endpoint("obs_safety", name)],
            action_addr=cls._action_endpoint(section, name),
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
            spin_us=section.answer_spin_us,
        )
        if own_key:
            from hil.bus.auth import KEY_FILE, run_dir

            ep._key_path = os.path.join(run_dir(section, name), KEY_FILE)
        try:
            ep._configure(section, scenario, spec)
        except BaseException:
            ep.close()
            raise
        return ep

    def _configure(self, section, scenario, spec) -> None:
        """What a subclass adds once the sockets and the key exist (hil/loop/shield_bus.py)."""

    @staticmethod
    def _action_endpoint(section, name: str) -> str | None:
        """Where the safety process's actions arrive (None: no action socket)."""
        return section.endpoint("action", name)

    # ---- per step ----
    def before_step(self, step: int, t_s: float, u_cmd: np.ndarray, lockstep: bool) -> None:
        """Write the action for this step into u_cmd (bus-driven inputs, plant units)."""
        self._lockstep = lockstep
        if lockstep and self._published_step == step - 1 >= 0 and self._last_step < step - 1:
            self._wait_for(step)  # receives and takes the waiting actions itself
        else:
            self._take(step)
        if self._last_action is not None and step - self._last_arrival_step < self.watchdog_steps:
            u_cmd[self._apply_index] = self._act_buf  # the bus inputs of the held action (see _take)
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
        q = None
        # small: a list (the frame packs one), its plain sum the finiteness test; large (a grid):
        # the array itself, summed by numpy (the frame copies it with numpy)
        y = y_meas.tolist() if y_meas.size <= NUMPY_PACK_MIN else y_meas
        if not isfinite(sum(y) if type(y) is list else float(y.sum())):  # NaN/inf (or a sum that overflowed)
            bad = ~np.isfinite(y_meas)
            if bad.any():
                q = self._q_work
                np.multiply(bad, QUALITY_BAD, out=q, casting="unsafe")
                self._c["obs_bad_quality"] += 1
        data = self._sender.encode_obs(step, t_s, y, u_applied, q, self._lockstep)
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
        if len(raws) == DRAIN_CAP:  # a flood: the rest waits for the next step, the step goes on
            self._c["action_drain_capped_steps"] += 1
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
        np.take(self._last_action, self._apply_pos, out=self._act_buf)  # once per action, not per step
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
            timeo = max(1, math.ceil(remaining * 1000.0))
            if timeo != self._rcvtimeo_ms:  # a setsockopt per wait only when the timeout changes
                self._action_sock.setsockopt(zmq.RCVTIMEO, timeo)
                self._rcvtimeo_ms = timeo
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

    def _sockets(self) -> list:
        return self._obs_socks + ([self._action_sock] if self._action_sock is not None else [])

    def close(self) -> None:
        for sock in self._sockets():
            sock.close(0)
        self._ctx.term()
        if self._key_path:  # the run is over: its secret goes with it
            from hil.bus.auth import release_run_dir, remove_run_key

            remove_run_key(self._key_path, self.key)
            release_run_dir(os.path.dirname(self._key_path))
            self._key_path = None
