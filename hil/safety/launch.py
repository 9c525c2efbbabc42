"""Start and stop the policy and safety processes of a scenario.

    handles = start(scenario, scenario_path)      # before the loop raises its priority
    ...                                           # run the loop (LoopBusEndpoint talks to them)
    stop(handles)

Both run as `python -m hil.policy.runner` / `python -m hil.safety.wrapper` children that get the
validated scenario as JSON (so `--set` overrides reach them) plus the scenario file's path
(relative policy paths resolve against it), and exit on their own if this process dies.
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


@dataclass
class Handles:
    policy: subprocess.Popen
    safety: subprocess.Popen
    decision_log: str
    status_path: str
    policy_status_path: str
    workdir: str
    files: list = field(default_factory=list)


def scenario_to_json(scenario) -> str:
    """The validated scenario as JSON text (infinities kept as Infinity, which json reads back)."""
    return json.dumps(scenario.model_dump(mode="python"), default=_plain)


def _plain(v):
    if hasattr(v, "model_dump"):
        return v.model_dump(mode="python")
    if isinstance(v, (set, frozenset, tuple)):
        return list(v)
    raise TypeError(f"cannot serialize {type(v).__name__}")


def load_child_scenario(config: str, scenario_json: str | None):
    """What a child process runs: the JSON scenario if given, else the TOML file."""
    from hil.config import load_scenario, parse_scenario

    if scenario_json:
        return parse_scenario(json.loads(Path(scenario_json).read_text()), source=config)
    return load_scenario(config)


def start(scenario, scenario_path: str, log_dir: str | None = None, stderr=None,
          policy_version: str | None = None, ready_timeout_s: float = 30.0) -> Handles:
    """Start the safety and policy processes and wait (up to ready_timeout_s) until both have
    their sockets open. `log_dir`: where the decision log and the status files go (default:
    [safety].decision_log). `stderr`: a file for both children's stderr. Raises RuntimeError
    if a child exits or does not come up (after stopping both)."""
    from hil.safety.wrapper import _template

    if scenario.policy is None or scenario.safety is None or scenario.bus is None:
        raise ValueError("launching the policy needs [bus], [policy] and [safety] sections")
    workdir = tempfile.mkdtemp(prefix="hil-launch-")
    sc_json = os.path.join(workdir, "scenario.json")
    Path(sc_json).write_text(scenario_to_json(scenario))
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        log = os.path.join(log_dir, "safety-decisions.jsonl")
    else:
        log = _template(scenario.safety.decision_log, scenario.name)
    if log_dir:
        status = os.path.join(log_dir, "safety-status.json")
    else:
        status = scenario.safety.status_path or str(Path(log).with_suffix("")) + ".status.json"
    pol_status = os.path.join(log_dir or workdir, "policy-status.json")
    for stale in (status, pol_status):
        if os.path.exists(stale):
            os.remove(stale)
    me = str(os.getpid())
    common = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, close_fds=True)
    safety = subprocess.Popen(
        [sys.executable, "-m", "hil.safety.wrapper", scenario_path or "scenario.toml", "--scenario-json", sc_json,
         "--log", log, "--status", status, "--parent-pid", me], **common)
    cmd = [sys.executable, "-m", "hil.policy.runner", scenario_path or "scenario.toml", "--scenario-json", sc_json,
           "--status", pol_status, "--parent-pid", me]
    if policy_version:
        cmd += ["--version", policy_version]
    policy = subprocess.Popen(cmd, **common)
    handles = Handles(policy, safety, log, status, pol_status, workdir)
    if not wait_ready(handles, ready_timeout_s):
        codes = stop(handles)
        raise RuntimeError(f"policy/safety processes did not come up (exit codes {codes}); see their stderr")
    return handles


def alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def wait_ready(handles: Handles, timeout_s: float = 20.0) -> bool:
    """Wait until both children are up (the safety's status file exists, the policy's too)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not (alive(handles.policy) and alive(handles.safety)):
            return False
        if os.path.exists(handles.status_path) and os.path.exists(handles.policy_status_path):
            return True
        time.sleep(0.02)
    return False


def stop(handles: Handles | None, timeout_s: float = 5.0) -> dict:
    """SIGTERM both children, SIGKILL what is left after timeout_s; their exit codes."""
    if handles is None:
        return {}
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
