"""A campaign worker keeps its policy and safety processes alive across runs.

    keeper = ProcessKeeper()            # in a warm pool worker (hil/campaign/executors.py)
    launch.KEEPER = keeper              # hil/safety/launch.py start/stop go through it
    ... runs ...                        # each policy run: its bus in keeper.ipc_dir
    keeper.close()

Without it every policy run started two Python processes (imports of numpy, zmq, Numba, the
plant, the policy's kernel) and stopped them: most of a policy run's helper start and stop
time. With it, `launch.start` asks `acquire(plan)`:

- a kept pair whose processes are alive and whose spawn-time facts equal the run's (commands
  except the per-run log and status paths, the policy's confinement, working directory and
  environment but for the injected-fault variables, the bus's run directory) is *reset*: each
  process gets one signed message (hil/campaign/reset.py: its own reset key, a run number and
  a fresh nonce) carrying the run's bootstrap map (scenario with its seed, the run's bus keys,
  the decision log and status paths, the injected process fault) and the run's stderr file
  (a descriptor), rebuilds every per-run
  object from it and acknowledges that nonce; then both must write their status files (their
  sockets open), as a fresh process would;
- anything else (no pair, a process that died or was restarted by the run's supervisor, other
  spawn-time facts, a reset refused or not acknowledged within RESET_MAX_S / not ready within
  it) kills the pair and spawns a fresh one, cold: a process in an unknown state is never
  reused.

`launch.stop` hands the pair back (`release`): SIGUSR1 to both, each ends its run (the final
status written, the decision log closed) and answers "parked" within PARK_MAX_S, else both
are killed. A run's outcome is the same either way: its recording, criteria and verdict equal
those of a run in fresh processes (tests/integration/test_campaign_warm.py).

The bus of every policy run of this worker lives in one directory (`ipc_dir`): the kept
processes' sockets have fixed paths. Each run still has its own bus secret (the loop creates
it), so a frame of an earlier run fails every receiver's tag check (dropped_auth).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time

from hil.campaign import reset as rp
from hil.campaign.process_faults import ENV as FAULT_ENV

RESET_MAX_S = 60.0  # wall s for a reset to be acknowledged and both processes ready (a loaded machine: ~1 s)
PARK_MAX_S = 30.0  # wall s for both to end their run and answer "parked" (their receive timeout: 0.2 s)


KEEPER_DIR_PREFIX = "hilw-"  # <tmp>/hilw-<worker pid>-<random>: a keeper's bus directory


def sweep_dead_keeper_dirs(tmp_dir: str | None = None) -> list[str]:
    """Remove this user's keeper bus directories (`<tmp>/hilw-<pid>-*`) whose worker is dead
    (killed with its node: its atexit handler never ran; its kept processes ended with it). Returns
    the paths removed."""
    from hil.processes import process_alive

    tmp_dir = tmp_dir or tempfile.gettempdir()
    removed = []
    for name in os.listdir(tmp_dir):
        m = re.fullmatch(re.escape(KEEPER_DIR_PREFIX) + r"(\d+)-[A-Za-z0-9_]+", name)
        if m is None:
            continue
        path = os.path.join(tmp_dir, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or process_alive(int(m.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed


class _Kept:
    """One kept process: its Popen, the worker's end of its socket pair, its reset key."""

    def __init__(self, role: str, proc: subprocess.Popen, sock: socket.socket, key: bytes):
        self.role, self.proc, self.sock, self.key = role, proc, sock, key
        self.run = 0
        self.sent = b""
        self.parked: dict = {}  # its last "parked" answer (the reset gate's counters)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, msg: dict, fds: tuple = ()) -> None:
        self.sent = rp.encode(self.key, self.role, msg)  # the last frame (tests replay it: refused as stale)
        rp.send_frame(self.sock, self.sent, fds)

    def answer(self, deadline: float) -> dict | None:
        """The next answer (tag checked), None at EOF, timeout or a bad tag."""
        try:
            raw, fds = rp.recv_frame(self.sock, max(0.0, deadline - time.monotonic()))
        except (ValueError, OSError):
            return None
        rp.close_all(fds)  # a child sends none
        return None if raw is None else rp.verify(self.key, self.role, raw)

    def close(self) -> None:
        self.sock.close()


def _spawn_kept(role: str, cmd: list, boot: dict, kw: dict) -> _Kept:
    from hil.safety.launch import spawn

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    key = secrets.token_bytes(32)
    try:
        proc = spawn(cmd, {**boot, "warm": {"fd": theirs.fileno(), "key": key.hex()}},
                     extra_fds=(theirs.fileno(),), **kw)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return _Kept(role, proc, ours, key)


def spawn_facts(plan) -> str:
    """What a kept pair must share with a run to serve it (JSON text): everything fixed when a
    process is spawned and not sent by a reset."""
    def cmd_without_paths(cmd: list) -> list:
        out, skip = [], False
        for a in cmd:
            if skip:
                skip = False
                continue
            if a in ("--log", "--status"):
                skip = True
                out.append(a)
                continue
            out.append(a)
        return out

    def env_of(kw: dict) -> dict:
        return {k: v for k, v in (kw.get("env") or {}).items() if k not in FAULT_ENV.values()}

    pk = {k: v for k, v in plan.policy_kw.items() if k != "env"}
    sk = {k: v for k, v in plan.safety_kw.items() if k != "env"}
    return json.dumps([plan.policy_cmd, cmd_without_paths(plan.safety_cmd), plan.policy_boot.get("confine"),
                       plan.run_dir, env_of(plan.policy_kw), env_of(plan.safety_kw), repr(sorted(pk.items())),
                       repr(sorted(sk.items()))], sort_keys=True, default=str)


class ProcessKeeper:
    """Keeps one policy + safety pair between the runs of a worker (see the module doc).
    `counters`: spawned (pairs started cold), resets (runs served by a kept pair), parked,
    cold_after_death, cold_after_refusal, cold_after_timeout, cold_other_facts; `last`: how
    the last run got its processes ("reset" or "spawned") and why a kept pair was not used."""

    def __init__(self, seed_numba_cache: bool = True):
        # named after this worker: a worker killed without its exit handlers (a Ray node lost) leaves it,
        # and the next task on the machine removes it (sweep_dead_keeper_dirs)
        self.ipc_dir = tempfile.mkdtemp(prefix=f"{KEEPER_DIR_PREFIX}{os.getpid()}-")
        self.seed_numba_cache = seed_numba_cache
        self._policy: _Kept | None = None
        self._safety: _Kept | None = None
        self._facts = ""
        self.counters = {"spawned": 0, "resets": 0, "parked": 0, "cold_after_death": 0, "cold_after_refusal": 0,
                         "cold_after_timeout": 0, "cold_other_facts": 0}
        self.last: dict = {}
        self.numba_cache = False  # the kept policy process started with the worker's Numba cache
        self._lost = ""  # why the last pair was discarded

    # ---- for hil/safety/launch.py ----
    def acquire(self, plan) -> tuple[subprocess.Popen, subprocess.Popen]:
        """The run's (policy, safety) processes: the kept pair reset, else a fresh pair (not yet
        ready: launch waits for it as for any start)."""
        why = self._why_not_kept(plan)
        if why is None:
            why = self._reset(plan)
            if why is None:
                self.counters["resets"] += 1
                self.last = {"processes": "reset", "run": self._policy.run, "pids": self.pids()}
                return self._policy.proc, self._safety.proc
        if self._policy is not None:
            self.discard(why)
        numba = False
        if self.seed_numba_cache:
            from hil.campaign.warm import seed_policy_cache

            numba = seed_policy_cache(plan.run_dir, plan.policy_section, replace=True)
        self._safety = _spawn_kept("safety", plan.safety_cmd, plan.safety_boot, plan.safety_kw)
        self._policy = _spawn_kept("policy", plan.policy_cmd, plan.policy_boot, plan.policy_kw)
        self._facts = spawn_facts(plan)
        self.numba_cache = numba
        self._lost = ""
        self.counters["spawned"] += 1
        self.last = {"processes": "spawned", "why": why, "pids": self.pids()}
        return self._policy.proc, self._safety.proc

    def release(self, handles) -> bool:
        """Park the run's processes for the next run; True if both are parked. False (nothing
        kept) if they are not this keeper's (restarted during the run) or did not park: the
        caller stops them as usual."""
        pol, saf = self._policy, self._safety
        if pol is None or handles.policy is not pol.proc or handles.safety is not saf.proc:
            if pol is not None:
                self.counters["cold_after_death"] += 1
                self.discard("a kept process was restarted during the last run")
            return False
        if not (pol.alive() and saf.alive()):
            self.counters["cold_after_death"] += 1
            self.discard("a kept process died during the last run")
            return False
        for k in (pol, saf):
            k.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + PARK_MAX_S
        for k in (pol, saf):
            ans = k.answer(deadline)
            while ans is not None and ans.get("op") != "parked":  # e.g. the answer to a refused frame
                ans = k.answer(deadline)
            if ans is None:
                self.counters["cold_after_timeout"] += 1
                self.discard(f"the {k.role} process did not park within {PARK_MAX_S:g} s")
                return False
            k.parked = ans
        self.counters["parked"] += 1
        return True

    # ---- internals ----
    def _why_not_kept(self, plan) -> str | None:
        if self._policy is None:
            return self._lost or "no kept processes"
        if not (self._policy.alive() and self._safety.alive()):
            self.counters["cold_after_death"] += 1
            return "a kept process died"
        if spawn_facts(plan) != self._facts:
            self.counters["cold_other_facts"] += 1
            return "the run's spawn-time facts differ from the kept processes'"
        return None

    def _reset(self, plan) -> str | None:
        """Send both resets, wait for their acknowledgements and both status files; None when
        both serve the run, else why not (the caller starts fresh processes)."""
        fault_env = {v: os.environ.get(v) for v in FAULT_ENV.values()}
        boots = {"policy": {**plan.policy_boot, "fault_env": fault_env},
                 "safety": {**plan.safety_boot, "fault_env": fault_env, "log": plan.log, "status": plan.status}}
        deadline = time.monotonic() + RESET_MAX_S
        nonces = {}
        for k in (self._safety, self._policy):
            k.run += 1
            nonces[k.role] = secrets.token_hex(16)
            try:
                # with the run's stderr (this worker's fd 2, the run's stderr.log): the child's from now on
                k.send({"op": "reset", "run": k.run, "nonce": nonces[k.role], "boot": boots[k.role]}, fds=(2,))
            except OSError as exc:
                self.counters["cold_after_death"] += 1
                return f"reset of the {k.role} process not delivered: {exc}"
        for k in (self._safety, self._policy):
            while True:
                ans = k.answer(deadline)
                if ans is None:
                    self.counters["cold_after_timeout"] += 1
                    return f"the {k.role} process did not acknowledge its reset within {RESET_MAX_S:g} s"
                if ans.get("op") == "reset" and ans.get("nonce") == nonces[k.role]:
                    break  # an earlier answer (e.g. to a refused frame) is skipped
            if not ans.get("ok"):
                self.counters["cold_after_refusal"] += 1
                return f"the {k.role} process refused its reset: {ans.get('why')}"
        while not (os.path.exists(plan.status) and os.path.exists(plan.policy_status)):
            if not (self._policy.alive() and self._safety.alive()):
                self.counters["cold_after_death"] += 1
                return "a kept process died during its reset"
            if time.monotonic() > deadline:
                self.counters["cold_after_timeout"] += 1
                return f"the kept processes were not ready within {RESET_MAX_S:g} s of their reset"
            time.sleep(0.005)
        return None

    def discard(self, why: str = "") -> None:
        """Stop the kept pair (SIGTERM, SIGKILL after 5 s) and forget it; `why` is what the next
        run's `last` says."""
        self._lost = why
        kept = [k for k in (self._policy, self._safety) if k is not None]
        self._policy = self._safety = None
        for k in kept:
            k.close()  # a parked process sees its socket pair close and exits
            if k.alive():
                try:
                    k.proc.terminate()
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5.0
        for k in kept:
            try:
                k.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                k.proc.kill()
                k.proc.wait(5)

    def close(self) -> None:
        """The worker is done: the pair stopped, the bus directory removed."""
        self.discard()
        shutil.rmtree(self.ipc_dir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [k.proc.pid for k in (self._policy, self._safety) if k is not None]
