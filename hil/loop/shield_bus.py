"""The loop's end of the bus when the shield decides in the loop ([safety] placement = "loop").

Runtime assurance with the switch next to the actuator (issue 22). What crosses the bus:

    loop -> policy, safety     observations, every step (as with placement = "process")
    policy -> loop             proposals (channel "proposal", socket proposal_loop), at the
                               policy's own rate ([policy] rate_hz); the policy sends the same
                               proposal to the safety process
    safety -> loop             supervisor decisions (channel "supervisor", a key only the loop and
                               the safety process hold): whether the policy may act, the rollout
                               mode, the limited-mode envelope band; enforced until superseded

Per step k the loop takes the newest authenticated proposal and decision, and the compiled
shield (hil/loop/shield.py `shield_kernel`) writes the bus inputs: the proposal projected on the
envelope (box, rate on the applied value, the plant's state-dependent rows, the supervisor's
band), or the fallback law (hold, fixed, joint PD) when the proposal is late (older than
[policy] max_age_s after the observation it answers), the supervisor does not allow it, it is
not finite, or a limit cannot be computed. No supervisor decision for [safety]
supervisor_silence_s: the fallback acts ("fallback:supervisor_silent"), the runtime raises an
alarm, until a decision arrives again (fail closed; also before the first decision).

Each step's source is the recording's column `shield.source` (codes: SOURCE_NAMES) and a
counter of the summary's `bus` section.

Who made a fallback step (the summary's `bus` counters): a step on "fallback:late" or
"fallback:supervisor_silent" is the sender's fault when nothing that would have prevented it had
been SENT by the time the loop looked (the header's wall_ns: time.time_ns() at encode, the same
clock on one machine), and the transport's when it had (in flight, queued in the socket, or
waiting for the loop's next look: the loop takes decisions every `every` steps). The steps of
a late (silent) spell are classified when the next proposal (decision) is taken: transport if
that message answers an observation recent enough to have been valid at the step
(k - max_age_steps <= its step <= k) and was sent before the loop's look at that step, else the
policy (supervisor). A spell no message ends (the run stops) is the sender's.

    shield_late_policy_steps, shield_late_transport_steps          (sum: fallback_late steps)
    shield_silent_supervisor_steps, shield_silent_transport_steps  (after the first decision;
                                                                    before it: startup)
    proposal_transit_us_max / supervisor_transit_us_max            wall_ns at send to the loop's
                                                                   take, of the messages applied Per-step actions no longer cross the bus; a forged or
replayed proposal or decision is dropped and counted by its Receiver like every bus message.

Lockstep: before step k, when a proposal is due for observation k-1 (every
`[policy] rate_hz` period), the loop waits (bounded by [bus] lockstep_timeout_s) for the
supervisor's decision on it and, if the decision lets the policy act, for the proposal: the run
is reproducible. In real time nothing waits.

The decide stage's cost per step (real time, 1 kHz, configs/panda_policy.toml, perf_counter_ns
timers around each part, load average 5-7 on 2 cores, mean us): before_step 62 = proposals 29
(the socket's event check every step, and Receiver.decode, ~40 us a message at that load, one
message every 4 steps) + supervisor decisions 26 every 4th step (decode) + the shield 19 (the
compiled kernel and its call: `BoundShield`, one jitclass argument and three scalars instead of
45 arguments) + ~7 of bookkeeping. The decoding (hil/bus/wire.py: the keyed hash, the payload
dict and its arrays) is the largest part left.
"""

from __future__ import annotations

import os
import time

import numpy as np
import zmq

from hil.bus import DRAIN_CAP, LoopBusEndpoint, drain, open_socket
from hil.bus.wire import Receiver, max_frame_bytes, payload_schema
from hil.loop.shield import FALLBACK_LATE, FALLBACK_MODE, FALLBACK_UNKNOWN, SOURCE_NAMES as KERNEL_SOURCES, Shield

FALLBACK_SILENT = len(KERNEL_SOURCES)  # the supervisor is silent (or has not spoken yet)
SOURCE_NAMES = (*KERNEL_SOURCES, "fallback:supervisor_silent")
SOURCE_COLUMN = "shield.source"
_SPELL_CAP = 4096  # fallback steps of one spell kept for classification (beyond: the sender's)


def fifo_io_threads(priority: int) -> tuple[int, str | None]:
    """SCHED_FIFO `priority` for this process's zmq I/O threads (named "ZMQbg/IO/<n>" by libzmq):
    (threads raised, warning or None). The loop raises only its own thread to SCHED_FIFO
    (hil/loop/rt.py), while every proposal and supervisor decision reaches the loop's sockets
    through the context's I/O thread: left at normal priority on a loaded machine it waits for
    a CPU for milliseconds (25 ms seen: configs/panda_policy.toml, load 7, 125 of 314 late
    steps with the proposal already sent). The policy and safety processes raise all their
    threads already (hil/safety/launch.py)."""
    raised = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError as exc:
        return 0, f"shield: the zmq I/O threads could not be listed ({exc.strerror or exc})"
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith("ZMQbg/IO"):
                    continue
            os.sched_setscheduler(int(tid), os.SCHED_FIFO, os.sched_param(priority))
            raised += 1
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended
        except OSError as exc:
            return raised, f"shield: SCHED_FIFO {priority} for the zmq I/O threads refused ({exc.strerror or exc})"
    return raised, None


def _by_step(msg) -> tuple:
    return msg.step, msg.sid, msg.seq


def _by_session(msg) -> tuple:
    return msg.sid, msg.seq


def _counter(name: str) -> str:
    return "shield_" + name.replace(":", "_") + "_steps"


class ShieldBusEndpoint(LoopBusEndpoint):
    """The loop's bus endpoint with the in-loop shield (module docstring). Built by
    `ShieldBusEndpoint.build(section, scenario, spec)` like LoopBusEndpoint; `attach(y, u)`
    gives it the loop's measured outputs and applied inputs (the step's own arrays)."""

    @staticmethod
    def _action_endpoint(section, name: str) -> None:
        return None  # no per-step actions: proposals and supervisor decisions instead

    def _configure(self, section, scenario, spec) -> None:
        name = scenario.name
        pol, sec = scenario.policy, scenario.safety
        self.step_s = step_s = scenario.loop.step_s
        n = len(self.action_names)
        self.every = pol.every_steps(step_s)
        self.max_age_steps = pol.max_age_steps(step_s)
        self.silence_steps = max(1, int(np.ceil(sec.supervisor_silence_s / step_s - 1e-9)))
        self.shield = Shield(scenario, spec, self.action_names, plant=scenario.plant.load(),
                             max_age_steps=self.max_age_steps)
        self._prop_sock = open_socket(self._ctx, zmq.PULL, section.endpoint("proposal_loop", name), bind=True,
                                      hwm=section.hwm, max_bytes=max_frame_bytes("proposal", 0, 0, n))
        self._sup_sock = open_socket(self._ctx, zmq.PULL, section.endpoint("supervisor", name), bind=True,
                                     hwm=section.hwm, max_bytes=max_frame_bytes("supervisor", 0, 0, n))
        self._prop_rx = Receiver("proposal", payload_schema("proposal", spec.n_outputs, spec.n_inputs, n), self.key)
        self._sup_rx = Receiver("supervisor", payload_schema("supervisor", spec.n_outputs, spec.n_inputs, n),
                                self.key)
        self._wait_poller = zmq.Poller()
        self._wait_poller.register(self._prop_sock, zmq.POLLIN)
        self._wait_poller.register(self._sup_sock, zmq.POLLIN)
        self.proposal = np.full(n, np.nan)
        self.proposal_step = -(1 << 62)  # none yet: late by any bound
        self.allow = False
        self.mode = "none"
        self.decision_step = -1
        self._decision_arrival = None  # loop step the newest decision arrived at (None: never)
        self.silent = True
        self._prev = np.zeros(n)
        self._out = np.zeros(n)
        self.last_code = FALLBACK_SILENT
        self.code_counts = [0] * len(SOURCE_NAMES)  # steps per source (a list: cheaper per step than numpy)
        self._look_ns = 0  # time.time_ns() when this step's sockets were looked at (drained)
        self._late_spell: list = []    # (k the shield checked, look ns) of the fallback:late steps not yet classified
        self._silent_spell: list = []  # look ns of the supervisor-silent steps (after a first decision) not classified
        self._blame = {"late_policy": 0, "late_transport": 0, "silent_supervisor": 0, "silent_transport": 0,
                       "silent_startup": 0}
        self._transit_max_ns = {"proposal": 0, "supervisor": 0}
        self._io_checked = False  # the zmq I/O threads' scheduling looked at (first real-time step)
        self.io_threads_fifo = 0
        self.io_warning = None
        self._y = self._u = None
        self._c.update({"supervisor_decisions": 0, "supervisor_silences": 0,
                        "lockstep_proposal_timeouts": 0})

    def attach(self, y_meas: np.ndarray, u_app: np.ndarray, u_cmd: np.ndarray | None = None) -> None:
        """The loop's arrays the shield reads every step: the last measured outputs (the state
        its limits and the joint PD use), the applied inputs (rate limits, hold) and the
        commanded inputs it writes (the loop's u_cmd; bound again if before_step gets another)."""
        self._y, self._u = y_meas, u_app
        self._bind(u_app.copy() if u_cmd is None else u_cmd)

    def _bind(self, u_cmd: np.ndarray) -> None:
        """The shield bound to the loop's arrays and this endpoint's proposal buffer
        (hil/loop/shield.py BoundShield): a step passes the step numbers and the verdict only.
        The first bind compiles; it runs nothing, so the shield's state is as it was."""
        self._bound = self.shield.bind(self.proposal, self._y, self._u, self._prev, self.step_s, self._out, u_cmd,
                                       self._apply_index, self._apply_pos)
        self._bound_u_cmd = u_cmd

    def warm_up(self) -> None:
        """Compile and bind the shield (attach does; kept for callers that re-warm)."""
        self._bind(self._bound_u_cmd)

    # ---- per step ----
    def before_step(self, step: int, t_s: float, u_cmd: np.ndarray, lockstep: bool) -> None:
        """Write the shield's action for this step into u_cmd (bus-driven inputs, plant units)."""
        self._lockstep = lockstep
        if not self._io_checked and not lockstep:
            self._raise_io_threads()
        self._look_ns = time.time_ns()
        self._take_proposals()
        if step % self.every == 0 or self.silent:  # decisions come at the policy's rate at most
            self._take_decisions(step)
        due = step - 1  # the observation a proposal for this step answers
        if lockstep and due >= 0 and due % self.every == 0 and self._published_step >= due:
            self._wait_lockstep(step, due)
        age_ok = self._decision_arrival is not None and step - self._decision_arrival <= self.silence_steps
        if self.silent == age_ok:  # entering or leaving silence
            self.silent = not age_ok
            if self.silent:
                self._c["supervisor_silences"] += 1
        if u_cmd is not self._bound_u_cmd:
            self._bind(u_cmd)
        code = self._bound.step(step - 1, self.proposal_step, self.allow and not self.silent)
        if code == FALLBACK_MODE and self.silent:
            code = FALLBACK_SILENT
        elif code == FALLBACK_UNKNOWN and self.shield.refresh is not None:
            self.shield.refresh(self._y)  # the family's precomputed terms, if its fill flagged them stale (a trip)
        self.last_code = code
        self.code_counts[code] += 1
        if code == FALLBACK_LATE:
            self._spell(self._late_spell, (step - 1, self._look_ns), "late_policy")
        elif code == FALLBACK_SILENT:
            if self._decision_arrival is None:
                self._blame["silent_startup"] += 1
            else:
                self._spell(self._silent_spell, self._look_ns, "silent_supervisor")
        self._in_fallback = code > 1

    def _raise_io_threads(self) -> None:
        """Once, at the first real-time step (the loop has its scheduling by then): when the loop
        thread runs at SCHED_FIFO p, the zmq I/O threads get p - 1 (`fifo_io_threads`)."""
        self._io_checked = True
        try:
            if os.sched_getscheduler(0) != os.SCHED_FIFO:
                return
            prio = os.sched_getparam(0).sched_priority
        except (AttributeError, OSError):
            return
        self.io_threads_fifo, self.io_warning = fifo_io_threads(max(1, prio - 1))

    def _spell(self, spell: list, entry, sender_key: str) -> None:
        """One more step of a fallback spell, classified when the next message is taken (a spell
        longer than _SPELL_CAP steps: the sender is silent, the rest is its)."""
        if len(spell) < _SPELL_CAP:
            spell.append(entry)
        else:
            self._blame[sender_key] += 1

    def _end_late_spell(self, msg) -> None:
        """A proposal was taken: the late steps it would have served had the loop had it."""
        s, sent = msg.step, msg.wall_ns
        transport = 0
        for k, look in self._late_spell:
            if k - self.max_age_steps <= s <= k and sent <= look:
                transport += 1
        self._blame["late_transport"] += transport
        self._blame["late_policy"] += len(self._late_spell) - transport
        self._late_spell.clear()

    def _end_silent_spell(self, msg) -> None:
        """A decision was taken: the silent steps it would have ended had the loop had it."""
        sent = msg.wall_ns
        transport = sum(1 for look in self._silent_spell if sent <= look)
        self._blame["silent_transport"] += transport
        self._blame["silent_supervisor"] += len(self._silent_spell) - transport
        self._silent_spell.clear()

    def _transit(self, which: str, msg) -> None:
        dt = time.time_ns() - msg.wall_ns
        if dt > self._transit_max_ns[which]:
            self._transit_max_ns[which] = dt

    @property
    def last_source(self) -> str:
        return SOURCE_NAMES[self.last_code]

    @last_source.setter
    def last_source(self, value) -> None:  # LoopBusEndpoint's constructor sets it; the code decides
        pass

    @property
    def last_mode(self) -> str:
        return self.mode

    @last_mode.setter
    def last_mode(self, value) -> None:
        pass

    def _newest(self, sock, rx, order, count_cap: bool = False):
        """The newest valid message waiting on `sock` (by `order(msg)`) that answers a published
        observation, or None; the others are counted (superseded, dropped_future). Only the
        caller's `rx.accept` of the one it acts on moves the replay window."""
        newest = None
        raws = drain(sock)
        if count_cap and len(raws) == DRAIN_CAP:
            self._c["action_drain_capped_steps"] += 1
        for raw in raws:
            msg = rx.decode(raw)
            if msg is None:
                continue
            if msg.step > self._published_step:
                self._c["dropped_future"] += 1
                continue
            if newest is not None:
                rx.count("superseded")
            if newest is None or order(msg) >= order(newest):
                newest = msg
        return newest

    def _take_proposals(self) -> None:
        """The newest valid proposal answering a published observation."""
        newest = self._newest(self._prop_sock, self._prop_rx, _by_step, count_cap=True)
        if newest is None or newest.step < self.proposal_step or not self._prop_rx.accept(newest):
            return
        self.proposal[:] = newest.payload["a"]
        self.proposal_step = newest.step
        self._transit("proposal", newest)
        if self._late_spell:
            self._end_late_spell(newest)

    def _take_decisions(self, step: int) -> None:
        """The newest valid supervisor decision (its band goes into the shield's envelope)."""
        newest = self._newest(self._sup_sock, self._sup_rx, _by_session)
        if newest is None or not self._sup_rx.accept(newest):
            return
        p = newest.payload
        self.allow, self.mode = p["allow"], p["mode"]
        self.shield.band_lo[:] = p["lo"]
        self.shield.band_hi[:] = p["hi"]
        self.decision_step = max(self.decision_step, newest.step)
        self._decision_arrival = step
        self._c["supervisor_decisions"] += 1
        self._transit("supervisor", newest)
        if self._silent_spell:
            self._end_silent_spell(newest)

    def _wait_lockstep(self, step: int, due: int) -> None:
        """Lockstep: wait (bounded) for the supervisor's decision on observation `due` and, when
        it lets the policy act, the proposal answering it."""
        budget = self.lockstep_timeout_s if not self._lost else min(0.05, self.lockstep_timeout_s)
        deadline = time.monotonic() + budget
        while self.decision_step < due or (self.allow and self.proposal_step < due):
            if self._pending:
                from hil.bus import send_nowait

                self._pending = [(i, d) for i, d in self._pending if not send_nowait(self._obs_socks[i], d)]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._c["lockstep_timeouts"] += 1
                if self.decision_step >= due:
                    self._c["lockstep_proposal_timeouts"] += 1
                self._lost = True
                return
            wait_ms = min(remaining, 0.002) if self._pending else remaining
            if self._wait_poller.poll(max(1, int(wait_ms * 1000.0))):
                self._take_proposals()
                self._take_decisions(step)
        self._lost = False

    # ---- status ----
    def counters(self) -> dict[str, int]:
        out = super().counters()
        for i, name in enumerate(SOURCE_NAMES):
            out[_counter(name)] = self.code_counts[i]
        out["proposals_applied"] = self.code_counts[0] + self.code_counts[1]
        b = self._blame  # spells still open: no message ended them, the sender's
        out["shield_late_policy_steps"] = b["late_policy"] + len(self._late_spell)
        out["shield_late_transport_steps"] = b["late_transport"]
        out["shield_silent_supervisor_steps"] = b["silent_supervisor"] + len(self._silent_spell)
        out["shield_silent_transport_steps"] = b["silent_transport"]
        out["shield_silent_startup_steps"] = b["silent_startup"]
        out["proposal_transit_us_max"] = self._transit_max_ns["proposal"] // 1000
        out["zmq_io_threads_fifo"] = self.io_threads_fifo
        out["supervisor_transit_us_max"] = self._transit_max_ns["supervisor"] // 1000
        for k, v in self._prop_rx.counters.items():
            out[f"proposal_{k}"] = v
        for k, v in self._sup_rx.counters.items():
            out[f"supervisor_{k}"] = v
        return out

    def shield_status(self) -> dict:
        """The shield's state for the status snapshot (`hil safety status`, the dashboard)."""
        return {"steps": dict(zip(SOURCE_NAMES, self.code_counts)), "last_source": self.last_source,
                "supervisor": {"mode": self.mode, "allow_policy": self.allow, "silent": self.silent,
                               "decision_step": self.decision_step},
                "proposal_step": self.proposal_step if self.proposal_step >= 0 else None,
                "every_steps": self.every, "max_age_steps": self.max_age_steps,
                "zmq_io_threads_fifo": self.io_threads_fifo, "zmq_io_warning": self.io_warning}

    def _sockets(self) -> list:
        extra = [s for s in (getattr(self, "_prop_sock", None), getattr(self, "_sup_sock", None)) if s is not None]
        return super()._sockets() + extra
