"""The policy process: observations in, proposals out, over the bus.

    python -m hil.policy.runner SCENARIO.toml [--version vN] [--parent-pid PID]

Receives observations (PULL, connects to bus.obs_policy), answers each newest one with a
proposal (PUSH, connects to bus.proposal) and obeys commands from the safety process (PULL,
connects to bus.command: {"op": "load", "version": "vN"} = switch version, e.g. a rollback).
Commands are handled before observations, so a rollback applies to the next observation
(and at least every 0.2 s while no observation comes).

A policy that raises, returns non-finite values or an action of the wrong shape is silent for
that observation (counted): the safety process then applies its fallback. In lockstep the silence
is said (an abstention frame, hil/bus/wire.py FLAG_ABSTAIN, to the safety process only), so the
safety does not wait its deadline on the wall clock for a proposal that will not come: the same
decision, at once (a policy that died or hangs still costs the deadline).
An observation with Bad quality (hil/bus/endpoint.py) reaches the policy with NaN in the Bad outputs;
the same rule applies to what the policy makes of it.

Messages are signed and checked with the run's bus keys (hil/bus/auth.py: the keys of obs,
proposal and command only, from the bootstrap pipe of the process that started this one, else
the run directory's key file). Started by hil.safety.launch (through hil/policy/process.py), the
process is confined before numpy and the policy are loaded (hil/confine.py: its own uid,
Landlock, capabilities dropped as root). The status file
(--status) is rewritten at least every 0.5 s while the process is responsive: its age is the
heartbeat hil.safety.launch's supervisor watches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import struct
import sys
import time

import numpy as np
import zmq

from hil.atomic import write_json_atomic
from hil.bus import (QUALITY_BAD, Receiver, Sender, drain, open_socket, payload_schema, process_alive,
                     send_nowait, send_retry)
from hil.bus.config import action_input_names
from hil.bus.wire import peek_step
from hil.confine import confine_self  # noqa: F401  (the policy process's confinement; was defined here)
from hil.policy.features import FeatureMap
from hil.policy.loader import LoadedPolicy, load_policy


class PolicyRunner:
    """Socket-free core (`answer`) plus the process loop (`run`)."""

    def __init__(self, scenario, scenario_path: str | None = None, version: str | None = None,
                 key: bytes | None = None):
        """`key`: the run's bus secret, or the policy's channel keys (hil.bus.auth.channel_keys;
        what hil.safety.launch hands over); None: a random secret, for use without other processes."""
        import secrets


        if scenario.policy is None or scenario.bus is None:
            raise ValueError("the policy process needs [policy] and [bus] sections")
        self.scenario = scenario
        self.scenario_path = scenario_path
        self.spec = scenario.plant.load().spec
        self.action_names = action_input_names(scenario, self.spec)
        self.n_act = len(self.action_names)
        self.key = secrets.token_bytes(32) if key is None else key
        self.obs_rx = Receiver("obs", payload_schema("obs", self.spec.n_outputs, self.spec.n_inputs, self.n_act),
                               self.key)
        self.cmd_rx = Receiver("command", payload_schema("command", 0, 0, 0), self.key)
        self.sender = Sender("proposal", self.key)
        from hil.campaign.process_faults import from_env

        self.fault = from_env("policy")  # a campaign's injected fault (HIL_FAULT_POLICY), else None
        self.counters = {"proposals": 0, "proposals_unsent": 0, "policy_errors": 0, "policy_invalid": 0,
                         "obs_superseded": 0, "obs_bad_quality": 0, "commands": 0, "command_errors": 0,
                         "version_switches": 0, "obs_skipped_rate": 0, "proposals_unsent_loop": 0,
                         "abstentions": 0}
        self.abstain = False  # the last observation answered: silent by the policy's own output
        self.last_error = ""
        self.policy: LoadedPolicy
        self._install(load_policy(scenario.policy, scenario_path, version, self.spec))
        self._warm_up()

    def _warm_up(self) -> None:
        """One call on the nominal observation (imports, caches) before anyone waits on us."""
        try:
            x = FeatureMap(self.spec, self.policy.features).build(self.spec.nominal("outputs"),
                                                                  self.spec.nominal("inputs"))
            self.policy.act(x)
        except Exception:
            pass
        if self.policy.residual is not None:  # the warm-up call ran its PID: start afresh
            self.policy.residual.reset()

    def _install(self, pol: LoadedPolicy) -> None:
        actions = pol.actions or self.action_names
        if sorted(actions) != sorted(self.action_names):
            raise ValueError(f"policy {pol.version} acts on {actions}, the scenario on {self.action_names}")
        self.perm = np.array([actions.index(n) for n in self.action_names], dtype=np.intp)
        self.features = FeatureMap(self.spec, pol.features)
        if hasattr(pol.target, "period_s"):  # an entry policy that integrates in time: the sim s between its calls
            pol.target.period_s = self.scenario.policy.every_steps(self.scenario.loop.step_s) * self.scenario.loop.step_s
        self.policy = pol

    @property
    def version(self) -> str:
        return self.policy.version

    def command(self, raw: bytes) -> None:
        msg = self.cmd_rx.decode(raw)
        if msg is None or not self.cmd_rx.accept(msg):
            return
        self.counters["commands"] += 1
        if msg.payload["op"] != "load":
            self.counters["command_errors"] += 1
            return
        wanted = msg.payload["version"]
        if wanted == self.policy.version:
            return
        try:
            self._install(load_policy(self.scenario.policy, self.scenario_path, wanted, self.spec))
            self.counters["version_switches"] += 1
            print(f"policy: switched to {wanted} ({msg.payload['reason']})", file=sys.stderr, flush=True)
        except Exception as exc:  # keep the current version; the safety keeps refusing it
            self.counters["command_errors"] += 1
            self.last_error = f"cannot load {wanted}: {exc}"
            print(f"policy: {self.last_error}", file=sys.stderr, flush=True)

    def answer(self, msg) -> bytes | None:
        """The proposal answering observation `msg`, or None if the policy is silent."""
        t0 = time.perf_counter_ns()
        self.abstain = False  # set where the policy is silent by its own output (not a hang)
        if self.fault is not None and self.fault.on_observation(msg.t_s):
            return None  # injected hang: unanswered
        p = msg.payload
        q = p["q"]
        if q.any() and (q == QUALITY_BAD).any():
            self.counters["obs_bad_quality"] += 1  # y holds NaN there: the policy sees it
        pol = self.policy
        try:
            x = self.features.build(p["y"], p["u"])
            if pol.residual is not None:  # its PID block runs once per observation, as in the gym env
                pol.residual.observe(p["y"], p["u"], msg.step)
            members = None
            if pol.act_members is not None:
                members = np.asarray(pol.act_members(x), dtype=np.float64)
            if pol.action_is_member_mean and members is not None:
                if members.ndim != 2 or members.shape[1] != self.n_act or not _finite(members):
                    self.counters["policy_invalid"] += 1
                    self.abstain = True
                    return None
                # the mean over members, as ndarray.mean computes it (add.reduce, then a true divide
                # by the count), without its Python wrappers: the same bits
                a = np.add.reduce(members, axis=0) / members.shape[0]
            else:
                a = np.asarray(pol.act(x), dtype=np.float64)
            if self.fault is not None:
                a = self.fault.corrupt(msg.t_s, a)
        except Exception as exc:
            self.counters["policy_errors"] += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.abstain = True
            return None
        if a.size != self.n_act or a.ndim > 2 or not _finite(a):
            self.counters["policy_invalid"] += 1
            self.abstain = True
            return None
        a = a.reshape(-1)[self.perm]
        m_arr = None
        if members is not None:
            if members.ndim == 2 and members.shape[1] == self.n_act and _finite(members):
                m_arr = members[:, self.perm]
            else:
                self.counters["policy_invalid"] += 1
                self.abstain = True
                return None
        compute_us = (time.perf_counter_ns() - t0) * 1e-3
        try:
            return self.sender.encode_proposal(msg.step, msg.t_s, a, m_arr, pol.version, compute_us)
        except (ValueError, struct.error) as exc:  # e.g. more members than a frame counts: silent
            self.counters["policy_invalid"] += 1
            self.last_error = f"cannot encode the proposal: {exc}"
            self.abstain = True
            return None

    # ---- process ----
    def run(self, parent_pid: int | None = None, status_path: str | None = None, stop: list | None = None) -> None:
        """Serve until SIGTERM/SIGINT (or `stop` gets an item: a warm process's caller installs
        the handlers that fill it, hil/campaign/reset.py) or the parent is gone."""
        bus, name = self.scenario.bus, self.scenario.name
        ctx = zmq.Context()
        obs = open_socket(ctx, zmq.PULL, bus.endpoint("obs_policy", name), bind=False, hwm=bus.hwm,
                          max_bytes=self.obs_rx.max_bytes)
        out = open_socket(ctx, zmq.PUSH, bus.endpoint("proposal", name), bind=False, hwm=bus.hwm)
        sec = self.scenario.safety
        # [safety] placement = "loop": the same proposal to the loop's shield first (the shorter path to
        # the actuator), then to the supervisor; answered at [policy] rate_hz
        to_loop = (open_socket(ctx, zmq.PUSH, bus.endpoint("proposal_loop", name), bind=False, hwm=bus.hwm)
                   if sec is not None and sec.placement == "loop" else None)
        every = self.scenario.policy.every_steps(self.scenario.loop.step_s)
        cmd = open_socket(ctx, zmq.PULL, bus.endpoint("command", name), bind=False, hwm=bus.hwm,
                          max_bytes=self.cmd_rx.max_bytes)
        obs.setsockopt(zmq.RCVTIMEO, 200)  # ms: housekeeping (parent alive, status) while idle
        if stop is None:
            stop = []
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.append(1))
        next_check = time.monotonic() + 0.5
        if status_path:
            write_json_atomic(status_path, self.status())
        decode, accept, answer, counters = self.obs_rx.decode, self.obs_rx.accept, self.answer, self.counters
        cmd_ready = cmd.getsockopt  # ZMQ_EVENTS: a command waiting (cheaper than a receive that fails)
        from hil.bus.endpoint import POLLIN, ZMQ_EVENTS  # plain ints (no IntFlag arithmetic per observation)
        retry_lockstep_s = 0.25 * bus.lockstep_timeout_s
        try:
            while not stop:
                # one blocking receive per observation: a single wake-up and the fewest zmq calls
                try:
                    first = obs.recv()
                except zmq.Again:
                    first = None
                # commands first (a rollback applies to this observation already)
                if cmd_ready(ZMQ_EVENTS) & POLLIN:
                    for raw in drain(cmd, ready=True):
                        self.command(raw)
                if first is not None:
                    # observations that queued while we computed: the newest one the policy answers at
                    # its rate wins (every step without [policy] rate_hz)
                    newest = None
                    for raw in [first, *drain(obs)]:
                        if every > 1 and (peek_step(raw) or 0) % every:  # off our rate: not decoded
                            counters["obs_skipped_rate"] += 1
                            continue
                        msg = decode(raw)
                        if msg is None:
                            continue
                        if msg.step % every:
                            counters["obs_skipped_rate"] += 1
                            continue
                        if newest is not None:
                            counters["obs_superseded"] += 1
                        newest = msg
                    if newest is not None and accept(newest):
                        data = answer(newest)
                        if data is None and self.abstain and newest.payload["lockstep"]:
                            # said, not left to the safety's deadline (to the safety only: the
                            # in-loop shield holds the last proposal by its age anyway)
                            gone = self.sender.encode_abstain(newest.step, newest.t_s, self.n_act,
                                                              self.policy.version, 0.0)
                            if send_nowait(out, gone) or send_retry(out, gone, retry_lockstep_s):
                                counters["abstentions"] += 1
                        if data is not None:
                            # lockstep: the safety waits for us; wait for the connection at startup
                            retry_s = retry_lockstep_s if newest.payload["lockstep"] else 0.0
                            if to_loop is not None and not (send_nowait(to_loop, data) or
                                                             (retry_s and send_retry(to_loop, data, retry_s))):
                                counters["proposals_unsent_loop"] += 1
                            if send_nowait(out, data) or (retry_s and send_retry(out, data, retry_s)):
                                counters["proposals"] += 1
                            else:
                                counters["proposals_unsent"] += 1
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + 0.5
                    if parent_pid and not process_alive(parent_pid):
                        break
                    if status_path:
                        write_json_atomic(status_path, self.status())
        finally:
            for s in (obs, out, cmd, to_loop):
                if s is not None:
                    s.close(0)
            ctx.term()
            if status_path:
                write_json_atomic(status_path, self.status())
            print("policy: " + json.dumps(self.status()), file=sys.stderr, flush=True)

    confinement: dict | None = None  # what confine_self obtained (main), for the status file

    def status(self) -> dict:
        return {"version": self.version, "confinement": self.confinement, "counters": {**self.counters, **{f"obs_{k}": v for k, v in
                                                                              self.obs_rx.counters.items()}},
                "last_error": self.last_error}


def _finite(a: np.ndarray) -> bool:
    """Every element finite: a finite sum proves it in one call (NaN and infinities propagate);
    a sum that overflowed from finite terms is checked element-wise."""
    return math.isfinite(a.sum()) or bool(np.isfinite(a).all())


def main(argv=None, boot: dict | None = None, confinement: dict | None = None) -> int:
    """`boot`, `confinement`: the bootstrap message already read and the confinement already
    applied by the process's entry (hil/policy/process.py, before numpy started its threads);
    None: read and apply them here (a runner started by hand)."""
    from hil.errors import ConfigError
    from hil.safety.launch import read_bootstrap

    ap = argparse.ArgumentParser(prog="python -m hil.policy.runner", description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--version", default=None, help="policy version (default: [policy].version)")
    ap.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    ap.add_argument("--status", default=None, help="JSON status file, rewritten every 0.5 s")
    ap.add_argument("--scenario-json", default=None, help="validated scenario as JSON")
    ap.add_argument("--bootstrap-fd", type=int, default=None,
                    help="inherited pipe carrying the scenario, the channel keys and the confinement")
    args = ap.parse_args(argv)
    try:
        if boot is None:
            boot = read_bootstrap(args.bootstrap_fd)
            confinement = confine_self(boot.get("confine"))  # before the policy is loaded
        if boot.get("confine", {}).get("kind") == "landlock" and not confinement["landlock"].startswith("ABI"):
            print(f"policy: Landlock {confinement['landlock']}: refusing to run unconfined", file=sys.stderr)
            return 2
        if boot.get("confine", {}).get("kind") == "landlock" and confinement.get("threads", 1) != 1:
            print(f"policy: confined with {confinement['threads']} threads running (Landlock does not reach the "
                  "others): start it as `python -m hil.policy.process`; refusing to run", file=sys.stderr)
            return 2
        if confinement.get("capabilities", "dropped") != "dropped":
            print(f"policy: root's capabilities not dropped ({confinement['capabilities']}): refusing to run",
                  file=sys.stderr)
            return 2
        warm = boot.pop("warm", None)
        runner = _build(boot, args, confinement)
    except (ConfigError, ValueError) as exc:
        print(f"policy: {exc}", file=sys.stderr)
        return 2
    if warm is None:
        runner.run(args.parent_pid, args.status)
        return 0
    return _serve_warm(runner, warm, args, confinement)


def _build(boot: dict, args, confinement: dict) -> PolicyRunner:
    """A runner for one run from its bootstrap map (scenario, channel keys): every per-run
    object new (receivers and their replay windows, sender session, policy state, counters),
    the global RNGs reseeded with the run's seed (hil/campaign/reset.py seed_run)."""
    from hil.bus.auth import child_key
    from hil.campaign.reset import seed_run
    from hil.safety.launch import load_child_scenario

    scenario = load_child_scenario(args.config, args.scenario_json, boot.get("scenario"))
    key = child_key(scenario.bus, scenario.name, boot) if scenario.bus is not None else None
    seed_run(scenario)
    runner = PolicyRunner(scenario, args.config, args.version, key=key)
    runner.confinement = confinement
    print(f"policy: {runner.version} ({runner.policy.kind}) on {', '.join(runner.action_names)}",
          file=sys.stderr, flush=True)
    return runner


def _serve_warm(runner: PolicyRunner, warm: dict, args, confinement: dict) -> int:
    """A process kept alive across a campaign's runs (hil/campaign/reset.py): serve a run until
    SIGUSR1 (park) or SIGTERM (exit), report parked, wait for the next signed reset, build
    every per-run object again from it, acknowledge, serve."""
    from hil.campaign.reset import serve_kept

    def serving(r: PolicyRunner):
        return lambda stop: r.run(args.parent_pid, args.status, stop=stop)

    return serve_kept(warm, "policy", serving(runner), lambda boot: serving(_build(boot, args, confinement)))


if __name__ == "__main__":
    sys.exit(main())
