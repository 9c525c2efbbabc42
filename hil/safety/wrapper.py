"""The safety process: observations and proposals in, the action that may act out.

    python -m hil.safety.wrapper SCENARIO.toml [--log PATH] [--status PATH] [--parent-pid PID]

Sockets (see hil/bus/config.py): PULL obs_safety (connect), PULL proposal (bind), PUSH action
(connect), PUSH command (bind; load/rollback orders to the policy), PUB advice (bind; advisory
mode), ROUTER control (bind; REQ clients, `hil safety status|promote|demote|rollback`).

For each newest observation the process waits for the policy's proposal answering it until a
deadline ([bus].policy_deadline_s; default half a loop period in real time, half the lockstep
timeout in lockstep; 50 ms at most after three misses in a row, so a dead policy does not slow
a lockstep run to a crawl); then it decides (hil/safety/core.py) with the proposal or, if none came,
with the baseline controller (the policy is silent), and sends the action. The part of the decision
that needs no proposal (baseline, monitor, Mahalanobis distance) runs when the observation arrives,
while the policy computes, so the round trip carries only the proposal's part. Every decision
that matters is a line of the JSONL decision log; the status file and the control socket show
mode, version, alarms and counters.

Every message is signed and checked with the run's bus secret (hil/bus/auth.py; handed over by
the loop at spawn over an inherited pipe, else read from the run directory's key file). The
process makes itself non-dumpable before it reads the secret (hil/confine.py). On the control
socket, `status` may be asked by anyone who reaches it; promote, demote and rollback are obeyed
only when signed with the secret (`hil safety ...` reads the key file as the run's user).
Observations carry per-output quality (hil/bus/endpoint.py): the quality goes to the core with y.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import msgpack
import numpy as np
import zmq

from hil.bus import (DRAIN_CAP, MAX_CONTROL_BYTES, QUALITY_BAD, QUALITY_UNCERTAIN, Receiver, Sender, drain, open_socket, payload_schema, process_alive,
                     send_nowait, send_retry)
from hil.bus.auth import TAG_BYTES, ControlAuth, channel_key, sign
from hil.bus.wire import peek_step

CONTROL_REQUESTS_PER_WAKE = 16  # operator requests answered per wake-up (the rest wait for the next)


class DecisionLog:
    """JSONL, one record per line, each stamped with wall_ns; flushed at most every 0.2 s wall."""

    URGENT = ("alarm", "rollback", "mode", "fallback_enter", "silent_enter", "stop", "start", "restart")

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1 << 16)
        self._next_flush = 0.0
        self.lines = 0

    def __call__(self, rec: dict) -> None:
        rec.setdefault("wall_ns", time.time_ns())
        self._f.write(json.dumps(rec, separators=(",", ":"), default=_jsonable) + "\n")
        self.lines += 1
        now = time.monotonic()
        if rec.get("event") in self.URGENT or now >= self._next_flush:
            self._f.flush()
            self._next_flush = now + 0.2

    def close(self) -> None:
        self._f.flush()
        self._f.close()


def _jsonable(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def _template(path: str, scenario: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return path.format(scenario=scenario, timestamp=stamp)


class SafetyProcess:
    def __init__(self, scenario, scenario_path: str | None = None, log_path: str | None = None,
                 status_path: str | None = None, key: bytes | None = None):
        """`key`: the run's bus secret (None: a random one, for use without other processes)."""
        from hil.bus.config import action_input_names
        from hil.campaign.process_faults import from_env

        self.fault = from_env("safety")  # a campaign's injected fault (HIL_FAULT_SAFETY), else None
        from hil.policy.loader import policy_store
        from hil.safety.core import SafetyCore

        if scenario.safety is None or scenario.policy is None or scenario.bus is None:
            raise ValueError("the safety process needs [bus], [policy] and [safety] sections")
        self.scenario = scenario
        self.spec = spec = scenario.plant.load().spec
        self.names = action_input_names(scenario, spec)
        store = policy_store(scenario.policy, scenario_path)
        if store is not None:
            version = store.resolve(scenario.policy.version)
        else:
            version = scenario.policy.entry or f"onnx:{scenario.policy.onnx}"
        self.log_path = log_path or _template(scenario.safety.decision_log, scenario.name)
        self.status_path = status_path or scenario.safety.status_path or str(
            Path(self.log_path).with_suffix("").as_posix() + ".status.json")
        self.log = DecisionLog(self.log_path)
        self.core = SafetyCore(scenario, spec, self.names, store, version, log=self.log)
        n_out, n_in, n_act = spec.n_outputs, spec.n_inputs, len(self.names)
        if key is None:
            import secrets

            key = secrets.token_bytes(32)
        self.obs_rx = Receiver("obs", payload_schema("obs", n_out, n_in, n_act), key)
        self.prop_rx = Receiver("proposal", payload_schema("proposal", n_out, n_in, n_act), key)
        self.action_tx = Sender("action", key)
        # [safety] placement = "loop": this process supervises the loop's shield (hil/loop/shield_bus.py)
        self.placement = scenario.safety.placement
        self.sup_tx = Sender("supervisor", key)
        self.every = scenario.policy.every_steps(scenario.loop.step_s)
        self.sup_period_s = 1.0 / scenario.safety.supervisor_rate_hz
        self._sup_last = None  # (step, t_s, allow, lo, hi, mode, reason) last sent
        self._sup_sent_at = 0.0
        self._last_lockstep = False
        n_act = len(self.names)
        self._open_lo, self._open_hi = np.full(n_act, -np.inf), np.full(n_act, np.inf)
        self.command_tx = Sender("command", key)
        self._advice_key = channel_key(key, "advice")
        self.control_auth = ControlAuth(key)
        # the core's quality keyword (hil/safety/core.py); an older core gets y and u only
        self._core_q = "q" in inspect.signature(self.core.decide).parameters
        self._core_q_prepare = "q" in inspect.signature(self.core.prepare).parameters
        self.c = {"actions_sent": 0, "actions_unsent": 0, "obs_unanswered": 0, "deadline_misses": 0,
                  "commands_sent": 0, "control_requests": 0, "control_refused": 0,
                  "control_malformed": 0, "control_unanswered": 0, "proposal_drain_capped": 0,
                  "obs_bad_quality": 0, "obs_uncertain_quality": 0, "decisions_sent": 0, "decisions_unsent": 0,
                  "policy_abstained": 0}
        self.period_s = scenario.loop.period_s
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile (or load from Numba's cache) the projection before anyone waits on us."""
        import numpy as np

        pr = self.core.projector
        y, u = self.spec.nominal("outputs"), self.spec.nominal("inputs")
        mid = 0.5 * (pr.lo + pr.hi)
        pr.project(mid, mid, 1.0, y, u)
        pr.project(pr.hi + 1.0, None, -1.0, y, u, np.full(mid.size, -np.inf), np.full(mid.size, np.inf))
        self.core.gate.disagreement(np.vstack([pr.lo, pr.hi]))

    # ---- one observation ----
    def _decide(self, obs, proposal, socks, silent_reason="no proposal") -> None:
        p = obs.payload
        if proposal is not None and proposal.payload.get("abstain"):
            self.c["policy_abstained"] += 1  # the policy said it will not answer: its silence, at once
            proposal, silent_reason = None, "the policy abstained (its output was invalid)"
        if self._core_q:
            d = self.core.decide(obs.step, obs.t_s, p["y"], p["u"], proposal, silent_reason, defer=True, q=p["q"])
        else:
            d = self.core.decide(obs.step, obs.t_s, p["y"], p["u"], proposal, silent_reason, defer=True)
        retry_s = 0.25 * self.scenario.bus.lockstep_timeout_s if p["lockstep"] else 0.0
        if self.placement == "loop":
            lo, hi = self.core.band
            self._supervise(socks, obs.step, obs.t_s, d.source == "policy", self._open_lo if lo is None else lo,
                            self._open_hi if hi is None else hi, d.mode, d.source, retry_s, always=p["lockstep"])
        else:
            data = self.action_tx.encode_action(obs.step, obs.t_s, d.action, d.source, d.mode, d.advice)
            if send_nowait(socks["action"], data) or (retry_s and send_retry(socks["action"], data, retry_s)):
                self.c["actions_sent"] += 1
            else:
                self.c["actions_unsent"] += 1
        if d.advice is not None:  # the same message, signed for the advice channel only
            send_nowait(socks["advice"], sign(self._advice_key, data[:-TAG_BYTES]))
        if d.command is not None:
            cmd = self.command_tx.encode_command(-1, obs.t_s, "load", d.command,
                                                 "rollback" if self.core.keeper.history else "sync")
            if send_nowait(socks["command"], cmd) or (retry_s and send_retry(socks["command"], cmd, retry_s)):
                self.c["commands_sent"] += 1
        self.core.finish()  # bookkeeping and log, off the round trip

    def _supervise(self, socks, step: int, t_s: float, allow: bool, lo, hi, mode: str, reason: str,
                   retry_s: float = 0.0, always: bool = False) -> None:
        """Send a supervisor decision to the loop's shield when it changed (or `always`: lockstep,
        where the loop waits for the decision on each proposal); `_heartbeat` repeats it."""
        last = self._sup_last
        changed = (last is None or last[2] != allow or last[5] != mode or not np.array_equal(last[3], lo)
                   or not np.array_equal(last[4], hi))
        self._sup_last = (step, t_s, allow, np.array(lo, dtype=float), np.array(hi, dtype=float), mode, reason)
        if changed:  # on record: what the shield enforces from now on (the band: only where one is set)
            band = {n: [float(a), float(b)] for n, a, b in zip(self.names, lo, hi) if np.isfinite(a) or np.isfinite(b)}
            self.log({"event": "supervisor", "step": step, "t_s": t_s, "allow": allow, "mode": mode,
                      "reason": reason, "band": band})
        if changed or always:
            self._send_decision(socks, retry_s)

    def _send_decision(self, socks, retry_s: float = 0.0) -> None:
        step, t_s, allow, lo, hi, mode, reason = self._sup_last
        data = self.sup_tx.encode_supervisor(step, t_s, allow, lo, hi, mode, reason)
        if send_nowait(socks["supervisor"], data) or (retry_s and send_retry(socks["supervisor"], data, retry_s)):
            self.c["decisions_sent"] += 1
        else:
            self.c["decisions_unsent"] += 1
        self._sup_sent_at = time.monotonic()

    def _heartbeat(self, socks, now: float) -> None:
        """Real time, placement = "loop": the last decision again every 1 / supervisor_rate_hz wall s,
        so the loop tells a silent supervisor from an unchanged one."""
        if self._sup_last is not None and now - self._sup_sent_at >= self.sup_period_s:
            self._send_decision(socks)

    def _control(self, req: bytes) -> bytes:
        self.c["control_requests"] += 1
        msg, authed, why = self.control_auth.check(req)
        op = msg.get("op") if msg is not None else None
        t_s = self.core.last_t or 0.0
        if op in ("promote", "demote", "rollback", "acknowledge") and not authed:
            self.c["control_refused"] += 1
            out = {"ok": False, "error": f"{op} refused: {why}; run `hil safety {op}` as the run's user"}
        elif op == "status":
            out = {"ok": True, "status": self.status()}
        elif op == "promote":
            res = self.core.promote(by=str(msg.get("by", "operator")))
            out = {"ok": res["passed"], "gate": res, "mode": self.core.rollout.mode}
        elif op == "demote":
            to = msg.get("to")
            try:
                changed = self.core.demote(t_s, to, str(msg.get("reason", "operator")))
                out = {"ok": True, "changed": changed, "mode": self.core.rollout.mode}
            except ValueError as exc:
                out = {"ok": False, "error": str(exc)}
        elif op == "rollback":
            new = self.core.rollback(t_s, "operator: " + str(msg.get("reason", "manual rollback")))
            out = {"ok": True, "version": new}
        elif op == "acknowledge":
            out = {"ok": True, "acknowledged": self.core.acknowledge(t_s, str(msg.get("by", "operator")))}
        else:
            out = {"ok": False, "error": f"unknown op {op!r} (status, promote, demote, rollback, acknowledge)"}
        self._write_status()
        return msgpack.packb(out, use_bin_type=True, default=_jsonable)

    def _serve_control(self, sock: zmq.Socket, max_requests: int = CONTROL_REQUESTS_PER_WAKE) -> None:
        """Answer the control requests waiting on the ROUTER socket, whatever their frames.

        A REQ client's request arrives as [identity, b"", body]; anything else (more or fewer
        parts, no empty delimiter, a DEALER's bare frames) is counted (control_malformed) and
        answered with an error when it has an envelope to answer to. The reply is sent without
        blocking (a client that does not read loses its reply, the socket never stalls). No
        frame sequence can put this socket in a state where it stops serving (a REP socket
        raised EFSM after a two-part request and killed the process)."""
        for _ in range(max_requests):
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            if len(parts) == 3 and parts[1] == b"":
                reply = self._control(parts[2])
            else:
                self.c["control_malformed"] += 1
                if len(parts) < 2:
                    continue  # no envelope: nobody to answer
                reply = msgpack.packb({"ok": False, "error": "a control request is one frame (a zmq REQ socket)"},
                                      use_bin_type=True)
            try:
                sock.send_multipart([parts[0], b"", reply], zmq.NOBLOCK)
            except zmq.ZMQError:  # the client is gone or does not read: its loss
                self.c["control_unanswered"] += 1

    def status(self) -> dict:
        s = self.core.status()
        s["counters"].update(self.c)
        s["counters"].update({f"obs_{k}": v for k, v in self.obs_rx.counters.items()})
        s["counters"].update({f"proposal_{k}": v for k, v in self.prop_rx.counters.items()})
        s["decision_log"] = self.log_path
        s["pid"] = os.getpid()
        s["placement"] = self.placement
        if self.placement == "loop" and self._sup_last is not None:  # what the loop's shield enforces
            step, t_s, allow, lo, hi, mode, reason = self._sup_last
            s["supervisor"] = {"step": step, "t_s": t_s, "allow_policy": allow, "mode": mode, "reason": reason,
                               "band": {n: [float(a), float(b)] for n, a, b in zip(self.names, lo, hi)
                                        if np.isfinite(a) or np.isfinite(b)}}
        return s

    def _write_status(self) -> None:
        tmp = self.status_path + ".tmp"
        Path(tmp).parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(self.status(), f, default=_jsonable)
        os.replace(tmp, self.status_path)

    # ---- the process loop ----
    def run(self, parent_pid: int | None = None, stop: list | None = None) -> None:
        """Serve until SIGTERM/SIGINT (or `stop` gets an item: a warm process's caller installs
        the handlers that fill it, hil/campaign/reset.py) or the parent is gone."""
        bus, name = self.scenario.bus, self.scenario.name
        ctx = zmq.Context()
        ep = lambda n: bus.endpoint(n, name)  # noqa: E731
        socks = {
            "obs": open_socket(ctx, zmq.PULL, ep("obs_safety"), bind=False, hwm=bus.hwm,
                               max_bytes=self.obs_rx.max_bytes),
            "proposal": open_socket(ctx, zmq.PULL, ep("proposal"), bind=True, hwm=bus.hwm,
                                    max_bytes=self.prop_rx.max_bytes),
            # placement = "process": every step's action to the loop; "loop": supervisor decisions
            **({"supervisor": open_socket(ctx, zmq.PUSH, ep("supervisor"), bind=False, hwm=bus.hwm)}
               if self.placement == "loop" else
               {"action": open_socket(ctx, zmq.PUSH, ep("action"), bind=False, hwm=bus.hwm)}),
            "command": open_socket(ctx, zmq.PUSH, ep("command"), bind=True, hwm=bus.hwm),
            "advice": open_socket(ctx, zmq.PUB, ep("advice"), bind=True, hwm=bus.hwm),
            "control": open_socket(ctx, zmq.ROUTER, ep("control"), bind=True, hwm=bus.hwm,
                                   max_bytes=MAX_CONTROL_BYTES),
        }
        poller = zmq.Poller()
        for key in ("obs", "proposal", "control"):
            poller.register(socks[key], zmq.POLLIN)
        if stop is None:
            stop = []
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.append(1))
        pending = None  # (obs message, wall deadline)
        early: dict[int, object] = {}  # proposals that arrived before their observation
        misses = 0  # consecutive observations the policy did not answer in time
        next_status = 0.0
        self._write_status()
        obs_sock, prop_sock, ctl_sock = socks["obs"], socks["proposal"], socks["control"]
        obs_decode, obs_accept = self.obs_rx.decode, self.obs_rx.accept
        prop_decode, prop_accept = self.prop_rx.decode, self.prop_rx.accept
        core, c, poll, monotonic = self.core, self.c, poller.poll, time.monotonic
        deadline_of = {ls: bus.deadline_s(self.period_s, ls) for ls in (False, True)}  # s, by lockstep
        in_loop, every = self.placement == "loop", self.every
        if in_loop and bus.policy_deadline_s is None:  # the shield holds a proposal this long anyway
            deadline_of[False] = max(deadline_of[False], self.scenario.policy.max_age_steps(
                self.scenario.loop.step_s) * self.period_s)
        try:
            while not stop:
                now = monotonic()
                timeout_ms = 200.0 if pending is None else max(0.0, (pending[1] - now) * 1000.0)
                if in_loop and self._sup_last is not None:  # wake for the heartbeat
                    timeout_ms = min(timeout_ms, max(0.0, (self._sup_sent_at + self.sup_period_s - now) * 1000.0))
                events = dict(poll(timeout_ms if timeout_ms >= 1.0 else (1 if timeout_ms > 0 else 0)))
                if obs_sock in events:
                    newest = None
                    for raw in drain(obs_sock, ready=True):
                        if in_loop and every > 1 and (peek_step(raw) or 0) % every:
                            continue  # off the policy's rate: not even decoded (hil/bus/wire.py peek_step)
                        msg = obs_decode(raw)
                        if msg is not None and in_loop and msg.step % every:
                            continue  # no proposal answers it ([policy] rate_hz): nothing to decide
                        if msg is not None and (newest is None or msg.step > newest.step):
                            if newest is not None:
                                self.obs_rx.count("superseded")
                            newest = msg
                    if newest is not None and newest.step > core.last_step and obs_accept(newest):
                        if self.fault is not None:
                            self.fault.on_observation(newest.t_s)
                        p = newest.payload
                        self._last_lockstep = p["lockstep"]
                        q = p["q"]
                        if q.any():
                            c["obs_bad_quality"] += bool((q == QUALITY_BAD).any())
                            c["obs_uncertain_quality"] += bool((q == QUALITY_UNCERTAIN).any())
                        if pending is not None:
                            c["obs_unanswered"] += 1
                        deadline = deadline_of[p["lockstep"]]
                        if misses >= 3:  # a dead policy must not slow a lockstep run to a crawl
                            deadline = min(deadline, 0.05)
                        pending = (newest, monotonic() + deadline)
                        if early:
                            early = {k: v for k, v in early.items() if k >= newest.step}
                        if newest.step in early:
                            self._decide(newest, early.pop(newest.step), socks)
                            pending = None
                            misses = 0
                        elif self._core_q_prepare:  # the proposal-free part now, while the policy computes
                            core.prepare(newest.step, newest.t_s, p["y"], p["u"], q=q)
                        else:
                            core.prepare(newest.step, newest.t_s, p["y"], p["u"])
                if prop_sock in events:
                    raws = drain(prop_sock, ready=True)
                    if len(raws) == DRAIN_CAP:  # a flood: the rest waits, observations and deadlines go on
                        c["proposal_drain_capped"] += 1
                    for raw in raws:
                        msg = prop_decode(raw)
                        if msg is None:
                            continue
                        if pending is not None and msg.step == pending[0].step:
                            if prop_accept(msg):
                                self._decide(pending[0], msg, socks)
                                pending = None
                                misses = 0
                        elif msg.step > (pending[0].step if pending is not None else core.last_step):
                            if len(early) < 8 and prop_accept(msg):
                                early[msg.step] = msg
                        else:
                            self.prop_rx.count("dropped_too_old")
                if ctl_sock in events:
                    self._serve_control(ctl_sock)
                now = monotonic()
                if pending is not None and now >= pending[1]:
                    c["deadline_misses"] += 1
                    misses += 1
                    ms = (now - pending[1]) * 1e3 + deadline_of[pending[0].payload["lockstep"]] * 1e3
                    self._decide(pending[0], None, socks, f"no valid proposal within {ms:.1f} ms")
                    pending = None
                if in_loop and not self._last_lockstep:
                    self._heartbeat(socks, now)
                if now >= next_status:
                    next_status = now + 0.5
                    self._write_status()
                    if parent_pid and not process_alive(parent_pid):
                        break
        finally:
            self.log({"event": "stop", "t_s": self.core.last_t, "counters": self.status()["counters"]})
            self._write_status()
            self.log.close()
            for s in socks.values():
                s.close(0)
            ctx.term()


def main(argv=None) -> int:
    from hil.confine import set_non_dumpable
    from hil.errors import ConfigError
    from hil.safety.launch import read_bootstrap

    set_non_dumpable()  # first: before the secret is in memory, no same-uid process may read it
    ap = argparse.ArgumentParser(prog="python -m hil.safety.wrapper", description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--log", default=None, help="decision log (JSONL); default [safety].decision_log")
    ap.add_argument("--status", default=None, help="status file (JSON); default beside the log")
    ap.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    ap.add_argument("--scenario-json", default=None, help="validated scenario as JSON")
    ap.add_argument("--bootstrap-fd", type=int, default=None,
                    help="inherited pipe carrying the scenario and the bus secret (from hil.safety.launch)")
    args = ap.parse_args(argv)
    try:
        boot = read_bootstrap(args.bootstrap_fd)
        warm = boot.pop("warm", None)
        proc = _build(boot, args, args.log, args.status)
    except (ConfigError, ValueError) as exc:
        print(f"safety: {exc}", file=sys.stderr)
        return 2
    if warm is None:
        proc.run(args.parent_pid)
        return 0
    return _serve_warm(proc, warm, args)


def _build(boot: dict, args, log: str | None, status: str | None) -> SafetyProcess:
    """A safety process's per-run state from its bootstrap map: receivers and replay windows,
    senders (a new session), the core (monitor, gate, rollout at the scenario's start mode), the
    decision log at `log`, counters; the global RNGs reseeded with the run's seed."""
    from hil.bus.auth import child_key
    from hil.campaign.reset import seed_run
    from hil.safety.launch import load_child_scenario

    scenario = load_child_scenario(args.config, args.scenario_json, boot.get("scenario"))
    seed_run(scenario)
    proc = SafetyProcess(scenario, args.config, log, status,
                         key=child_key(scenario.bus, scenario.name, boot) if scenario.bus is not None else None)
    if boot.get("resume"):  # a restart after a death (hil/safety/watch.py): never above that mode
        proc.core.resume(boot["resume"].get("mode", "shadow"))
    boot.clear()
    print(f"safety: mode {proc.core.rollout.mode}, policy {proc.core.version}, log {proc.log_path}",
          file=sys.stderr, flush=True)
    return proc


def _serve_warm(proc: SafetyProcess, warm: dict, args) -> int:
    """A process kept alive across a campaign's runs (hil/campaign/reset.py): serve a run until
    SIGUSR1 (park: the decision log closed, the final status written) or SIGTERM (exit), report
    parked, wait for the next signed reset (its boot names the run's decision log and status
    file), build every per-run object again, acknowledge, serve."""
    from hil.campaign.reset import serve_kept

    def serving(p: SafetyProcess):
        return lambda stop: p.run(args.parent_pid, stop=stop)

    return serve_kept(warm, "safety", serving(proc),
                      lambda boot: serving(_build(boot, args, boot.get("log"), boot.get("status"))))


if __name__ == "__main__":
    sys.exit(main())
