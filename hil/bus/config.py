"""[bus] section: where the ZeroMQ sockets of the loop, the policy and the safety wrapper live.

Topology (one consumer per endpoint; PUSH/PULL so nothing is lost to a slow joiner):

    loop   --obs_policy-->  policy   --proposal-->  safety  --action-->  loop
    loop   --obs_safety-->  safety   --command--->  policy            (load / roll back a version)
    safety --advice--> (PUB, advisory mode: what the policy would do)
    hil safety status|promote  <--control (REQ/REP)-->  safety

The loop binds obs_policy, obs_safety and action; the safety process binds proposal, command,
advice and control; the policy connects. Every endpoint is derived from `transport`
(`ipc` files in `ipc_dir`, the policy's three in its sub-directory `ipc_dir/policy/`, see
hil/confine.py; or `tcp://127.0.0.1` ports from `tcp_base_port` on) unless named explicitly in
`endpoints`.

Times: `watchdog_s` is simulated seconds (turned into loop steps), the `*_timeout_s` and
`policy_deadline_s` are wall seconds.
"""

from __future__ import annotations

import getpass
import math
import os
import tempfile
from typing import Literal

from pydantic import Field, field_validator

from hil.scenario.config import StrictModel, outside_bounds

ENDPOINT_NAMES = ("obs_policy", "obs_safety", "proposal", "action", "command", "advice", "control",
                  "proposal_loop", "supervisor")
# what the policy process connects to (proposal_loop: [safety] placement = "loop", the shield's inbox)
POLICY_ENDPOINTS = ("obs_policy", "proposal", "command", "proposal_loop")  # what the policy process connects to
IPC_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin


class BusSection(StrictModel):
    enabled: bool = Field(default=True, description="false: the loop runs without a bus")
    transport: Literal["ipc", "tcp"] = Field(default="ipc", description="ipc:// files or tcp://")
    ipc_dir: str = Field(
        default="",
        description="run directory: the ipc sockets and the run's bus key; '' = <tmp>/hil-<user>-<scenario> "
        "(or, if another user holds that, a fresh private one, see hil/run_dirs.py); created 0700, "
        "refused if it exists with another owner or a wider mode",
    )
    tcp_host: str = Field(default="127.0.0.1", description="address bound for tcp transport")
    tcp_base_port: int = Field(
        default=5750, ge=1024, le=65535 - len(ENDPOINT_NAMES), description="first tcp port"
    )
    endpoints: dict[str, str] = Field(
        default_factory=dict, description="explicit zmq addresses per endpoint name (override)"
    )
    watchdog_s: float | None = Field(
        default=None,
        gt=0,
        description="sim s without a valid action before the loop applies its fallback action; "
        "default two loop steps",
    )
    lockstep_timeout_s: float = Field(
        default=2.0, gt=0, le=600, description="wall s the loop waits for an action in lockstep"
    )
    max_action_age_steps: int = Field(
        default=2, ge=0, le=1000, description="drop actions answering observations older than this"
    )
    fallback_action: dict[str, float] = Field(
        default_factory=dict,
        description="loop watchdog action per bus input (plant units); default the input's "
        "configured value, else its nominal",
    )
    policy_deadline_s: float | None = Field(
        default=None,
        gt=0,
        description="wall s the safety waits for the policy's proposal after an observation; "
        "default half a loop period (real time) or half lockstep_timeout_s (lockstep)",
    )
    hwm: int = Field(default=64, ge=1, le=100_000, description="zmq send/receive high-water mark")
    answer_spin_us: float = Field(
        default=0.0,
        ge=0,
        le=10_000,
        description="wall us the loop busy-polls for the action in lockstep before it sleeps "
        "(saves a wake-up, costs a CPU for that long); 0 = sleep at once. Not [loop].spin_us, "
        "the busy-wait before each real-time deadline",
    )

    spin_us: None = Field(default=None, exclude=True, description="renamed answer_spin_us")

    @field_validator("spin_us", mode="before")
    @classmethod
    def _renamed(cls, value):
        raise ValueError("renamed answer_spin_us (the lockstep wait for the action; [loop].spin_us is "
                         "the busy-wait before each real-time deadline)")

    # ---- derived ----
    def resolved_ipc_dir(self, scenario_name: str) -> str:
        if self.ipc_dir:
            return self.ipc_dir
        try:
            user = getpass.getuser()
        except Exception:  # no passwd entry in some containers
            user = str(os.getuid())
        return os.path.join(tempfile.gettempdir(), f"hil-{user}-{scenario_name}")

    def endpoint(self, name: str, scenario_name: str) -> str:
        """zmq address of endpoint `name` (one of ENDPOINT_NAMES)."""
        if name not in ENDPOINT_NAMES:
            raise KeyError(f"unknown bus endpoint {name!r} (known: {', '.join(ENDPOINT_NAMES)})")
        if name in self.endpoints:
            return self.endpoints[name]
        if self.transport == "ipc":
            d = self.resolved_ipc_dir(scenario_name)
            if name in POLICY_ENDPOINTS:  # the policy's own sub-directory (hil/confine.py)
                d = os.path.join(d, "policy")
            return "ipc://" + os.path.join(d, name)
        return f"tcp://{self.tcp_host}:{self.tcp_base_port + ENDPOINT_NAMES.index(name)}"

    def watchdog_steps(self, step_s: float) -> int:
        """Loop steps without a valid action before the loop's fallback acts (>= 1)."""
        if self.watchdog_s is None:
            return 2
        return max(1, int(math.ceil(self.watchdog_s / step_s - 1e-9)))

    def deadline_s(self, period_s: float, lockstep: bool) -> float:
        """Wall s the safety process waits for a proposal before its own fallback acts."""
        if self.policy_deadline_s is not None:
            return self.policy_deadline_s
        return 0.5 * self.lockstep_timeout_s if lockstep else 0.5 * period_s

    # ---- checks that need the plant spec ----
    def validate_against(self, spec, scenario) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        for name, addr in self.endpoints.items():
            path = f"bus.endpoints.{name}"
            if name not in ENDPOINT_NAMES:
                problems.append((path, f"unknown endpoint (known: {', '.join(ENDPOINT_NAMES)})"))
            elif not addr.startswith(("ipc://", "tcp://", "inproc://")):
                problems.append((path, f"{addr!r} is not an ipc://, tcp:// or inproc:// address"))
        # an explicit directory must be usable; an unusable default only moves the run to a fresh
        # private directory (hil/run_dirs.py pin_run_dir)
        if self.enabled and self.ipc_dir and (reason := run_dir_problem(self.ipc_dir)):
            problems.append(("bus.ipc_dir", reason))
        if self.transport == "ipc":
            for name in ENDPOINT_NAMES:
                addr = self.endpoint(name, scenario.name)
                if addr.startswith("ipc://") and len(addr) - 6 > IPC_PATH_MAX:
                    problems.append(
                        ("bus.ipc_dir", f"ipc path {addr[6:]!r} is longer than {IPC_PATH_MAX} bytes")
                    )
                    break
        bus_inputs = [n for n, s in scenario.inputs.items() if s.driver == "bus"]
        names = spec.names("inputs")
        for name, value in self.fallback_action.items():
            path = f"bus.fallback_action.{name}"
            if name not in names:
                problems.append((path, f"{spec.name} has no input {name!r}"))
                continue
            if name not in bus_inputs:
                problems.append((path, f"input {name!r} is not driven by the bus (driver = 'bus')"))
            if reason := outside_bounds(value, spec.quantity("inputs", name)):
                problems.append((path, reason))
        if self.enabled and not bus_inputs and scenario.policy is None:
            problems.append(("bus", "no input has driver = 'bus' and there is no [policy]"))
        return problems


def run_dir_problem(path: str) -> str | None:
    """Why an existing run directory must not be used (None if it is fine or does not exist yet;
    hil.bus.auth.ensure_private_dir creates it and checks again)."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory (a symlink or a file): refusing to use it for the bus"
    if st.st_uid != os.geteuid():
        return (f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): refusing to put "
                "the bus sockets and key there; remove it or set bus.ipc_dir")
    if st.st_mode & 0o066:  # 0711 is fine: traversal only (the confined policy reaches policy/ below)
        return (f"{path} has mode {stat.S_IMODE(st.st_mode):04o}, wider than 0711: refusing to put the bus "
                f"sockets and key there; chmod 700 {path} or remove it")
    return None


def bus_input_names(scenario, spec) -> list[str]:
    """Inputs driven by the bus, in the spec's order."""
    return [n for n in spec.names("inputs") if n in scenario.inputs and scenario.inputs[n].driver == "bus"]


def declared_bus_input_names(scenario, spec) -> list[str]:
    """Inputs driven by the bus, in the order the scenario declares them: [policy].inputs' order
    for those it names, then the [inputs.*] tables' order (the gym env's action order; the bus
    frames keep the spec's order, and every consumer maps by name)."""
    driven = set(bus_input_names(scenario, spec))
    pol = getattr(scenario, "policy", None)
    first = [n for n in (getattr(pol, "inputs", None) or []) if n in driven]
    return first + [n for n in scenario.inputs if n in driven and n not in first]


def action_input_names(scenario, spec) -> list[str]:
    """Inputs an action message carries, in order: [policy].inputs if given, else bus inputs."""
    pol = getattr(scenario, "policy", None)
    if pol is not None and getattr(pol, "inputs", None):
        return list(pol.inputs)
    return bus_input_names(scenario, spec)


def loop_fallback_action(section: BusSection, scenario, spec, names: list[str]):
    """The loop watchdog's action for `names` (plant units)."""
    import numpy as np

    out = np.empty(len(names))
    for i, name in enumerate(names):
        if name in section.fallback_action:
            out[i] = section.fallback_action[name]
        elif name in scenario.inputs and scenario.inputs[name].value is not None:
            out[i] = scenario.inputs[name].value
        else:
            out[i] = spec.quantity("inputs", name).nominal
    return out
