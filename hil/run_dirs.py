"""Where a scenario's run directory is when its default cannot be used, and how the
operator's commands find it again.

The default run directory `<tmp>/hil-<user>-<scenario>` (hil/bus/config.py) is predictable
so that `hil safety status|promote|demote|rollback SCENARIO` find a run by the scenario
alone. Predictable also means another local user can create it first (or a file, or a
symlink, or a directory with loose permissions): hil never puts sockets or a key there
(hil.bus.config.run_dir_problem), and before this module such a squatter blocked every run
of the scenario. Now:

- `pin_run_dir(scenario)` (the runtime, before anything is bound): when `[bus] ipc_dir` is
  not set and the default is unusable, the run gets a fresh private directory
  (`tempfile.mkdtemp`, 0700, `<tmp>/hil-<user>-<scenario>-XXXXXXXX`), pinned into the
  scenario (so the safety and policy processes use it too) and recorded in this user's
  run index; the reason is returned for the run's warnings. An explicit `ipc_dir` is used
  as given (its problems stay configuration errors).
- `locate(scenario)` (operator commands): the scenario pinned to its live run's directory
  from the index, when it has no explicit `ipc_dir` and such a run is recorded.
- `release(directory)` (the runtime, at the end): the index entry and the fallback
  directory are removed.

The index is `$XDG_RUNTIME_DIR/hil/runs.json` when XDG_RUNTIME_DIR names a directory of
this user, else `~/.cache/hil/runs.json`: {scenario name: {"dir", "pid", "default",
"reason"}}, 0600 in a 0700 directory, read-modified-written under an flock of the file.
Entries whose pid is gone are ignored and pruned.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager

from hil.processes import process_alive

INDEX_NAME = "runs.json"


def index_path() -> str:
    """This user's run index (see module docstring)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg) and os.stat(xdg).st_uid == os.geteuid():
        return os.path.join(xdg, "hil", INDEX_NAME)
    return os.path.join(os.path.expanduser("~"), ".cache", "hil", INDEX_NAME)
    return True


@contextmanager
def _locked_index():
    """The index as a dict, locked; written back (dead runs pruned) when the block ends."""
    path = index_path()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = b""
        while chunk := os.read(fd, 1 << 16):
            raw += chunk
        try:
            runs = json.loads(raw) if raw.strip() else {}
        except ValueError:
            runs = {}  # a damaged index only loses the way to runs; it never stops one
        if not isinstance(runs, dict):
            runs = {}
        yield runs
        live = {k: v for k, v in runs.items()
                if isinstance(v, dict) and isinstance(v.get("pid"), int) and process_alive(v["pid"])}
        data = json.dumps(live, indent=1).encode()
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, data)
    finally:
        os.close(fd)


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return str(os.getuid())


def pin_run_dir(scenario):
    """(scenario, reason): the scenario with `[bus] ipc_dir` pinned to a fresh private directory
    when its default run directory is unusable (reason says why and where), else (scenario, None)."""
    from hil.bus.config import run_dir_problem

    bus = getattr(scenario, "bus", None)
    if bus is None or not bus.enabled or bus.transport != "ipc" or bus.ipc_dir:
        return scenario, None
    default = bus.resolved_ipc_dir(scenario.name)
    problem = run_dir_problem(default)
    if problem is None:
        return scenario, None
    from hil.bus.config import IPC_PATH_MAX

    prefix = f"hil-{_user()}-{scenario.name}-"
    if len(default) + 9 + len("/policy/obs_policy") > IPC_PATH_MAX:  # keep ipc paths short enough
        prefix = "hil-"
    d = tempfile.mkdtemp(prefix=prefix)  # 0700, ours
    with _locked_index() as runs:
        runs[scenario.name] = {"dir": d, "pid": os.getpid(), "default": default, "reason": problem}
    reason = (f"run directory {default} unusable ({problem}); this run uses {d}, recorded in "
              f"{index_path()} for `hil safety status`")
    pinned = scenario.model_copy(update={"bus": bus.model_copy(update={"ipc_dir": d})})
    return pinned, reason


def locate(scenario):
    """The scenario pinned to the run directory of its live run in this user's index, if it has
    no explicit `[bus] ipc_dir` and one is recorded; else the scenario unchanged."""
    bus = getattr(scenario, "bus", None)
    if bus is None or bus.ipc_dir or bus.transport != "ipc" or not os.path.exists(index_path()):
        return scenario
    with _locked_index() as runs:
        entry = runs.get(scenario.name)
    if not isinstance(entry, dict) or not isinstance(entry.get("pid"), int) or not process_alive(entry["pid"]):
        return scenario
    return scenario.model_copy(update={"bus": bus.model_copy(update={"ipc_dir": entry["dir"]})})


def release(scenario_name: str, directory: str) -> None:
    """End of a run that `pin_run_dir` moved: drop its index entry, remove its directory."""
    try:
        with _locked_index() as runs:
            entry = runs.get(scenario_name)
            if isinstance(entry, dict) and entry.get("dir") == directory and entry.get("pid") == os.getpid():
                del runs[scenario_name]
    except OSError:
        pass
    shutil.rmtree(directory, ignore_errors=True)
