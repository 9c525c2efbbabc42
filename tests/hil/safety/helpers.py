"""Scenario building for the safety and policy tests: configs/bioreactor_policy.toml + changes."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

from hil.scenario.config import parse_scenario

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "bioreactor_policy.toml"
POLICIES = ROOT / "policies" / "bioreactor"


def base_dict() -> dict:
    data = tomllib.loads(CONFIG.read_text())
    data["policy"]["directory"] = str(POLICIES)
    return data


def merge(dst: dict, changes: dict) -> dict:
    for k, v in changes.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)
    return dst


def scenario(changes: dict | None = None, drop: tuple = ()):
    """The policy scenario with nested `changes` merged in (and dotted keys in `drop` removed)."""
    data = merge(base_dict(), changes or {})
    for key in drop:
        node = data
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node.pop(last, None)
    return parse_scenario(data)


# ---- running the three-process chain (integration tests) ----

IPC_DIRS: list[str] = []  # made by chain_changes; remove_ipc_dirs() cleans them up


def remove_ipc_dirs() -> None:
    import shutil

    while IPC_DIRS:
        shutil.rmtree(IPC_DIRS.pop(), ignore_errors=True)


ENDPOINTS = ("obs_policy", "obs_safety", "proposal", "action", "command", "advice", "control")


def free_tcp_ports(n: int) -> list[int]:
    import socket

    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def chain_changes(tmp_path, transport: str = "ipc", **extra) -> dict:
    """Scenario changes for a chain run in tmp_path: bus endpoints, decision log, status."""
    import tempfile

    bus: dict = {"transport": transport}
    if transport == "ipc":
        bus["ipc_dir"] = tempfile.mkdtemp(prefix="hb", dir="/tmp")  # short: sun_path is 108 bytes
        IPC_DIRS.append(bus["ipc_dir"])
    else:
        bus["endpoints"] = {n: f"tcp://127.0.0.1:{p}" for n, p in zip(ENDPOINTS, free_tcp_ports(len(ENDPOINTS)))}
    changes = {"bus": bus, "safety": {"decision_log": str(tmp_path / "decisions.jsonl"),
                                      "status_path": str(tmp_path / "safety-status.json")},
               "loop": {"status_interval_s": 0.02}}
    return merge(changes, extra)


def read_log(path) -> list[dict]:
    import json

    return [json.loads(line) for line in open(path)]


def copy_policies(tmp_path, extra_known_good: bool = False):
    """A private copy of the shipped versions; optionally v3 = v1 again (known-good), so a
    rollback from v3 must skip the bad candidate v2."""
    import json
    import shutil

    dst = tmp_path / "policies"
    shutil.copytree(POLICIES, dst)
    if extra_known_good:
        shutil.copytree(dst / "v1", dst / "v3")
        meta = json.loads((dst / "v3" / "meta.json").read_text())
        meta.update(version="v3", notes="v1 re-released as v3 (test)")
        (dst / "v3" / "meta.json").write_text(json.dumps(meta))
    return dst
