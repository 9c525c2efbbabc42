"""Start and stop the policy and safety processes of a scenario.

    handles = start(scenario, scenario_path, key=bus.key)   # before the loop raises its priority
    ...                                                     # run the loop (LoopBusEndpoint talks to them)
    supervise(handles)                                      # every status tick: policy dead or hung?
    stop(handles)

Both run as `python -m hil.policy.process` (the runner, confined before numpy loads) /
`python -m hil.safety.wrapper` children that get the
validated scenario plus the scenario file's path (relative policy paths resolve against it),
and exit on their own if this process dies. The scenario and the run's bus keys reach them over
an inherited pipe (`spawn`, `--bootstrap-fd`), never in their environment or on the command
line: the safety gets the secret whole, the policy only the keys of its channels, and runs
confined (hil/confine.py: under its own uid when hil runs as root, Landlock otherwise).

Supervision (`supervise`, wall time): a policy process that exited is a death, one whose status
file (its heartbeat, rewritten every 0.5 s) is older than `[policy] restart.hang_s` is hung
(killed when restarts are allowed). Both raise an alarm (`PolicySupervisor.alarms`). With
`[policy] restart` the process is started again after backoff_s, doubling per restart up to
backoff_max_s, at most max_restarts times per run; the new process signs with the same secret.
Without it (the default) the policy stays dead and the safety's baseline holds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HANG_S_DEFAULT = 5.0  # wall s without a heartbeat: hung (when [policy] restart does not say)
# a (re)started policy process has to write its first heartbeat while it makes progress (its CPU
# time moves at least every readiness.STALL_S wall s) and within readiness.MAX_S in any case


@dataclass
class Handles:
    policy: subprocess.Popen
    safety: subprocess.Popen
    decision_log: str
    status_path: str
    policy_status_path: str
    workdir: str
    files: list = field(default_factory=list)
    policy_cmd: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    popen_kw: dict = field(default_factory=dict)
    supervisor: "PolicySupervisor | None" = None
    policy_boot: dict = field(default_factory=dict)  # what a (re)started policy gets on its bootstrap pipe
    confinement: dict = field(default_factory=dict)  # hil.confine.Confinement of the policy process
    priority: int = 0  # SCHED_FIFO priority of both children in real time (set_priority), 0 = normal
    loop_cpu: int = -1  # the CPU the loop is pinned to (a restarted policy is kept off it), -1 = none
    safety_cmd: list = field(default_factory=list)  # how a (re)started safety process is spawned
    safety_boot: dict = field(default_factory=dict)
    safety_kw: dict = field(default_factory=dict)
    safety_mode: str = "shadow"  # the configured [safety] mode: a restart never resumes above it


def scenario_to_json(scenario) -> str:
    """The validated scenario as JSON text (infinities kept as Infinity, which json reads back)."""
    return json.dumps(scenario.model_dump(mode="python"), default=_plain)


def _plain(v):
    if hasattr(v, "model_dump"):
        return v.model_dump(mode="python")
    if isinstance(v, (set, frozenset, tuple)):
        return list(v)
    raise TypeError(f"cannot serialize {type(v).__name__}")


def load_child_scenario(config: str, scenario_json: str | None, data: dict | None = None):
    """What a child process runs: the scenario from its bootstrap pipe (`data`), else the JSON
    file, else the TOML file."""
    from hil.scenario.config import load_scenario, parse_scenario

    if data is not None:
        return parse_scenario(data, source=config)
    if scenario_json:
        return parse_scenario(json.loads(Path(scenario_json).read_text()), source=config)
    return load_scenario(config)


def read_bootstrap(fd: int | None) -> dict:
    """In a child: the bootstrap message its parent wrote to the inherited pipe `fd` (the
    scenario, the bus keys, the confinement), read whole, the pipe closed. {} without one."""
    if fd is None:
        return {}
    chunks = []
    with os.fdopen(fd, "rb", closefd=True) as f:
        while chunk := f.read(1 << 16):
            chunks.append(chunk)
    return json.loads(b"".join(chunks).decode())


def spawn(cmd: list, boot: dict, extra_fds: tuple = (), **popen_kw) -> subprocess.Popen:
    """Start `cmd` with `--bootstrap-fd N` and write `boot` (JSON) into that inherited pipe: the
    way keys reach a child (an environment block stays readable in /proc/<pid>/environ; an
    argument in /proc/<pid>/cmdline). The write runs in a thread (a scenario can exceed the
    pipe's buffer before the child reads). `extra_fds`: further descriptors the child inherits
    (a warm process's reset pipes, hil/campaign/reset.py)."""
    import threading

    r, w = os.pipe()
    try:
        proc = subprocess.Popen(cmd + ["--bootstrap-fd", str(r)], pass_fds=(r, *extra_fds), **popen_kw)
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    data = json.dumps(boot, default=_plain).encode()

    def feed():
        try:
            with os.fdopen(w, "wb") as f:
                f.write(data)
        except OSError:  # the child died first: its exit is what the supervisor sees
            pass

    threading.Thread(target=feed, name="hil-bootstrap", daemon=True).start()
    return proc


def _policy_view(scenario, pdir: str, conf):
    """The scenario as the policy process gets it: under its own uid, the policy's files are
    copied into its directory (the operator's own may be private to them)."""
    from hil.confine import copy_for_policy

    pol = scenario.policy
    if conf.kind != "uid" or not (pol.directory or pol.onnx):
        return scenario
    key = "directory" if pol.directory else "onnx"
    src = getattr(pol, key)
    if not os.path.isabs(src):
        return scenario  # resolved against the scenario file by the child, as before
    copy = copy_for_policy(src, pdir, conf)
    return scenario.model_copy(update={"policy": pol.model_copy(update={key: copy})})


def start(scenario, scenario_path: str, log_dir: str | None = None, stderr=None,
          policy_version: str | None = None, ready_timeout_s: float | None = None,
          key: bytes | None = None) -> Handles:
    """Start the safety and policy processes and wait until both have their sockets open
    (readiness by handshake, hil/readiness.py: as long as they are alive and using CPU, up to
    ready_timeout_s wall s, default readiness.MAX_S; a child that exits fails at once).
    `log_dir`: where the decision log and the safety's status file go (default: [safety].decision_log). `stderr`: a file for both children's stderr. `key`: the
    run's bus secret (default: read from the run directory, where the loop's endpoint created it).
    The policy process is confined (hil/confine.py: its own uid as root, Landlock otherwise);
    its status file lives in its own directory `<run dir>/policy/`.
    Raises RuntimeError if a child exits or does not come up (after stopping both)."""
    from hil.bus.auth import POLICY_CHANNELS, bootstrap_keys, child_env, ensure_private_dir, read_run_key, run_dir
    from hil.confine import policy_confinement, prepare_policy_dir
    from hil.safety.wrapper import _template

    if scenario.policy is None or scenario.safety is None or scenario.bus is None:
        raise ValueError("launching the policy needs [bus], [policy] and [safety] sections")
    workdir = tempfile.mkdtemp(prefix="hil-launch-")
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        log = os.path.join(log_dir, "safety-decisions.jsonl")
    else:
        log = _template(scenario.safety.decision_log, scenario.name)
    if log_dir:
        status = os.path.join(log_dir, "safety-status.json")
    else:
        status = scenario.safety.status_path or str(Path(log).with_suffix("")) + ".status.json"
    conf = policy_confinement(scenario.policy)
    rdir = ensure_private_dir(run_dir(scenario.bus, scenario.name))
    if scenario.bus.transport == "ipc" and not scenario.bus.ipc_dir:
        # the children get the run directory itself: a default one is derived from the temporary
        # directory, and the policy's TMPDIR is its own directory (below)
        scenario = scenario.model_copy(update={"bus": scenario.bus.model_copy(update={"ipc_dir": rdir})})
    pdir = prepare_policy_dir(rdir, conf)
    pol_status = os.path.join(pdir, "policy-status.json")
    for stale in (status, pol_status):
        if os.path.exists(stale):
            os.remove(stale)
    me = str(os.getpid())
    secret = read_run_key(scenario.bus, scenario.name) if key is None else key
    sc_data = json.loads(scenario_to_json(scenario))
    common = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, close_fds=True,
                  env=child_env())
    # the safety: every channel (it signs actions, commands, advice)
    safety_cmd = [sys.executable, "-m", "hil.safety.wrapper", scenario_path or "scenario.toml",
                  "--log", log, "--status", status, "--parent-pid", me]
    safety_boot = {"scenario": sc_data, **bootstrap_keys(secret)}
    cmd = [sys.executable, "-m", "hil.policy.process", scenario_path or "scenario.toml",
           "--status", pol_status, "--parent-pid", me]
    if policy_version:
        cmd += ["--version", policy_version]
    # the policy: only the keys of obs, proposal and command (it cannot sign an action), confined
    pol_boot = {"scenario": json.loads(scenario_to_json(_policy_view(scenario, pdir, conf))),
                **bootstrap_keys(secret, POLICY_CHANNELS),
                "confine": {**conf.as_dict(), "hidden_dir": rdir, "writable_dir": pdir}}
    # the policy works in its own directory; a `[policy] entry = "module:Class"` still imports as
    # from where hil was started (`python -m` puts the working directory first on sys.path)
    py_path = os.pathsep.join(p for p in (os.getcwd(), common["env"].get("PYTHONPATH", "")) if p)
    pol_env = {**common["env"], "HOME": pdir, "NUMBA_CACHE_DIR": os.path.join(pdir, "numba-cache"),
               "TMPDIR": pdir, "PYTHONPATH": py_path}
    pol_kw = {**common, "env": pol_env, "cwd": pdir}
    if conf.kind == "uid":
        pol_kw.update(user=conf.uid, group=conf.gid, extra_groups=[])
    if KEEPER is not None:  # a campaign's warm worker: its kept processes, reset for this run
        policy, safety = KEEPER.acquire(LaunchPlan(cmd, pol_boot, pol_kw, safety_cmd, safety_boot, common, log,
                                                   status, pol_status, rdir, scenario.policy))
    else:
        safety = spawn(safety_cmd, safety_boot, **common)
        policy = spawn(cmd, pol_boot, **pol_kw)
    handles = Handles(policy, safety, log, status, pol_status, workdir, policy_cmd=cmd, env=pol_env,
                      popen_kw=pol_kw, policy_boot=pol_boot, confinement=conf.as_dict(),
                      safety_cmd=safety_cmd, safety_boot=safety_boot, safety_kw=common,
                      safety_mode=scenario.safety.mode)
    handles.supervisor = PolicySupervisor(handles, scenario.policy.restart)
    why = wait_ready(handles, ready_timeout_s)
    if why is not None:
        codes = stop(handles)
        raise RuntimeError(f"policy/safety processes did not come up: {why} (exit codes {codes}); see their stderr")
    return handles


@dataclass
class LaunchPlan:
    """How `start` would spawn a run's two children: what a process keeper
    (hil/campaign/warm_procs.py) compares with the processes it keeps, and sends them instead."""

    policy_cmd: list
    policy_boot: dict
    policy_kw: dict
    safety_cmd: list
    safety_boot: dict
    safety_kw: dict
    log: str  # the run's decision log
    status: str  # the safety's status file
    policy_status: str
    run_dir: str  # the bus's run directory (sockets, key, the policy's directory)
    policy_section: object = None  # the scenario's [policy] (its confinement)


# A campaign worker's process keeper (hil/campaign/warm_procs.py), or None: `start` asks it for
# the run's policy and safety processes (kept ones, reset by a signed message, or fresh ones),
# `stop` hands them back to it (parked between runs instead of stopped).
KEEPER = None


def resume_mode(handles: Handles) -> str:
    """The mode a restarted safety process starts in: the lower of the configured mode and the
    mode its predecessor last wrote in its status file; shadow if that cannot be read (a restart
    never promotes)."""
    from hil.safety.config import MODES

    try:
        last = json.loads(Path(handles.status_path).read_text()).get("mode")
    except (OSError, ValueError, AttributeError):
        last = None
    if last not in MODES:
        return MODES[0]
    return MODES[min(MODES.index(last), MODES.index(handles.safety_mode))]


def respawn_safety(handles: Handles, mode: str) -> subprocess.Popen:
    """Start a new safety process in place of a dead one (hil/safety/watch.py): the same command
    and run secret (over its bootstrap pipe), resuming at `mode`; its predecessor's status file is
    removed first, so its first heartbeat is its own. At the children's priority, off the loop's
    CPU (it inherits both from the loop thread that spawns it)."""
    try:
        os.remove(handles.status_path)
    except OSError:
        pass
    proc = spawn(handles.safety_cmd, {**handles.safety_boot, "resume": {"mode": mode}}, **handles.safety_kw)
    if handles.priority:
        _fifo_all_threads(proc.pid, handles.priority)
    if handles.loop_cpu >= 0:
        from hil.loop.rt import keep_off_cpu

        keep_off_cpu([proc.pid], handles.loop_cpu)
    return proc


def _fifo_all_threads(pid: int, priority: int) -> str | None:
    """SCHED_FIFO `priority` for every thread of process `pid` (zmq's I/O threads included)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))
        except ProcessLookupError:
            continue
        except OSError as exc:
            return f"policy/safety processes: SCHED_FIFO {priority} not permitted ({exc.strerror or exc})"
    return None


def set_priority(handles: Handles | None, priority: int) -> list[str]:
    """Real time: the policy and safety processes at SCHED_FIFO `priority` (every thread; a
    restarted policy gets it too). They are on the control path: at normal priority a busy
    machine delays their wake-ups by milliseconds (bus_latency: hil p99.9 of 1-4 ms at normal
    priority vs 0.5-1.05 ms with all processes at SCHED_FIFO, 2 loaded CPUs). Warnings, if any."""
    if handles is None or priority <= 0:
        return []
    handles.priority = priority
    warns = [w for p in (handles.policy, handles.safety) if (w := _fifo_all_threads(p.pid, priority))]
    return warns[:1]


def alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def wait_ready(handles: Handles, max_s: float | None = None) -> str | None:
    """Wait until both children are up (the safety's status file exists, the policy's too):
    None, or why they never will be (one exited; no CPU progress for readiness.STALL_S; max_s
    wall s, default readiness.MAX_S, passed). No fixed short bound: a loaded machine is slow,
    not wrong."""
    from hil import readiness

    return readiness.wait_ready(
        lambda: os.path.exists(handles.status_path) and os.path.exists(handles.policy_status_path),
        [handles.policy.pid, handles.safety.pid], lambda: alive(handles.policy) and alive(handles.safety),
        max_s=readiness.MAX_S if max_s is None else max_s)


def stop(handles: Handles | None, timeout_s: float = 5.0) -> dict:
    """SIGTERM both children, SIGKILL what is left after timeout_s; their exit codes."""
    if handles is None:
        return {}
    if handles.supervisor is not None:
        handles.supervisor.tick(observe_only=True)  # the policy's state as the run ends
    if KEEPER is not None and KEEPER.release(handles):  # parked for the next run, its final status written
        shutil.rmtree(handles.workdir, ignore_errors=True)
        return {"policy": None, "safety": None}
    procs = {"policy": handles.policy, "safety": handles.safety}
    for p in procs.values():
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout_s
    for p in procs.values():
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    shutil.rmtree(handles.workdir, ignore_errors=True)
    return {k: p.returncode for k, p in procs.items()}


class PolicySupervisor:
    """Watches the policy process from the loop's status tick; restarts it if allowed.

    Counters (the run summary's "policy" entry): policy_deaths (exited), policy_hangs (no
    heartbeat for hang_s), policy_restarts, policy_restart_failures (a restart that did not come
    up: no CPU progress for readiness.STALL_S, or not up within readiness.MAX_S). `alarms`: one line per death or hang, with the wall time since start."""

    def __init__(self, handles: Handles, restart=None):
        self.h = handles
        self.restart = restart  # hil.safety.config.RestartSection or None
        self.hang_s = restart.hang_s if restart is not None else HANG_S_DEFAULT
        self.counters = {"policy_deaths": 0, "policy_hangs": 0, "policy_restarts": 0, "policy_restart_failures": 0}
        self.alarms: list[str] = []
        self.events: list[str] = []
        self._t0 = time.monotonic()
        self._state = "starting"  # starting | up | hung | down | gave_up
        self._spawned_wall = time.time()
        self._spawned = self._t0
        self._progress = None  # readiness.Progress of the starting policy process
        self._restart_at = 0.0
        self._killed = False

    @property
    def state(self) -> str:
        return self._state

    def tick(self, now: float | None = None, observe_only: bool = False) -> list[str]:
        """One check (cheap: a poll and a stat). Returns the alarm/event lines raised now.
        `observe_only`: note the state, kill and start nothing (the last look before stop)."""
        now = time.monotonic() if now is None else now
        new: list[str] = []
        proc = self.h.policy
        if observe_only:
            if self._state == "starting" and proc.poll() is None and self._heartbeat_age() is not None:
                self._state = "up"
            return new
        if self._state in ("starting", "up", "hung"):
            rc = proc.poll()
            if rc is not None:
                if not self._killed:
                    self.counters["policy_deaths"] += 1
                    new.append(self._alarm(now, f"policy process {proc.pid} died (exit code {rc})"))
                self._schedule(now, new)
            elif self._state == "starting":
                if self._heartbeat_age() is not None:
                    self._state = "up"
                    if self.counters["policy_restarts"]:
                        new.append(self._event(now, f"policy process {proc.pid} is up again"))
                elif (why := self._startup_failed(now)) is not None:
                    self.counters["policy_restart_failures"] += 1
                    new.append(self._alarm(now, f"policy process {proc.pid} did not come up: {why}"))
                    self._kill()
            elif self._state == "up":
                age = self._heartbeat_age()
                if age is not None and age > self.hang_s:
                    self.counters["policy_hangs"] += 1
                    new.append(self._alarm(now, f"policy process {proc.pid} hung: no heartbeat for {age:.1f} s"))
                    if self.restart is not None:
                        self._kill()
                    else:
                        self._state = "hung"
            elif self._state == "hung" and (age := self._heartbeat_age()) is not None and age <= self.hang_s:
                self._state = "up"
                new.append(self._event(now, f"policy process {proc.pid} answers again"))
        elif self._state == "down" and now >= self._restart_at:
            if proc.poll() is None:  # killed, not reaped yet: next tick
                return new
            self._spawn(now, new)
        return new

    def _heartbeat_age(self) -> float | None:
        """Wall s since the policy process last wrote its status file; None before its first."""
        try:
            mtime = os.stat(self.h.policy_status_path).st_mtime
        except OSError:
            return None
        if mtime < self._spawned_wall - 1.0:  # a previous life's file
            return None
        return max(0.0, time.time() - mtime)

    def _kill(self) -> None:
        self._killed = True
        try:
            self.h.policy.kill()
        except ProcessLookupError:
            pass
        self._state = "hung"  # until poll() sees it gone: then _schedule

    def _schedule(self, now: float, new: list[str]) -> None:
        r = self.restart
        n = self.counters["policy_restarts"]
        if r is None:
            self._state = "gave_up"
            new.append(self._event(now, "policy not restarted ([policy] restart not configured)"))
        elif n >= r.max_restarts:
            self._state = "gave_up"
            new.append(self._alarm(now, f"policy not restarted: max_restarts = {r.max_restarts} reached"))
        else:
            self._state = "down"
            self._restart_at = now + min(r.backoff_s * 2.0 ** n, r.backoff_max_s)

    def _startup_failed(self, now: float) -> str | None:
        """Why a starting policy process counts as failed (None: still coming up)."""
        from hil import readiness

        if self._progress is None or self._progress.pids != [self.h.policy.pid]:
            self._progress = readiness.Progress([self.h.policy.pid], self._spawned)
        if now - self._spawned > readiness.MAX_S:
            return f"not up after {now - self._spawned:.0f} s"
        if self._progress.stalled_s(now) > readiness.STALL_S:
            return f"no progress for {readiness.STALL_S:g} s (its CPU time did not move): stuck"
        return None

    def _spawn(self, now: float, new: list[str]) -> None:
        try:
            os.remove(self.h.policy_status_path)
        except OSError:
            pass
        self._spawned_wall, self._spawned, self._killed = time.time(), now, False
        self._progress = None
        try:
            self.h.policy = spawn(self.h.policy_cmd, self.h.policy_boot, **self.h.popen_kw)
        except OSError as exc:
            self.counters["policy_restart_failures"] += 1
            new.append(self._alarm(now, f"policy restart failed: {exc}"))
            self._schedule(now, new)
            return
        if self.h.priority:  # it inherited the loop's priority: back to the children's
            _fifo_all_threads(self.h.policy.pid, self.h.priority)
        if self.h.loop_cpu >= 0:  # it inherited the loop's pinning too: off the loop's CPU
            from hil.loop.rt import keep_off_cpu

            keep_off_cpu([self.h.policy.pid], self.h.loop_cpu)
        self.counters["policy_restarts"] += 1
        self._state = "starting"
        new.append(self._event(now, f"policy restarted (#{self.counters['policy_restarts']}, "
                                    f"pid {self.h.policy.pid})"))

    def _alarm(self, now: float, text: str) -> str:
        line = f"t_wall+{now - self._t0:.1f}s ALARM {text}"
        self.alarms.append(line)
        self.events.append(line)
        return line

    def _event(self, now: float, text: str) -> str:
        line = f"t_wall+{now - self._t0:.1f}s {text}"
        self.events.append(line)
        return line

    def summary(self) -> dict:
        return {**self.counters, "state": self._state, "alarms": list(self.alarms), "events": list(self.events),
                "confinement": self.confinement()}

    def confinement(self) -> dict:
        """What the policy process obtained: the launch's plan plus what the process itself
        reported (Landlock taken or why not, its uid), from its status file."""
        out = dict(self.h.confinement)
        try:
            reported = json.loads(Path(self.h.policy_status_path).read_text()).get("confinement") or {}
        except (OSError, ValueError):
            reported = {}
        out.update({k: v for k, v in reported.items() if k in ("landlock", "euid", "dumpable", "capabilities", "threads")})
        return out


def supervise(handles: Handles | None) -> list[str]:
    """The loop's status tick: check the policy process (see PolicySupervisor); new lines."""
    if handles is None or handles.supervisor is None:
        return []
    return handles.supervisor.tick()


def supervision_summary(handles: Handles | None) -> dict:
    if handles is None or handles.supervisor is None:
        return {}
    return handles.supervisor.summary()
