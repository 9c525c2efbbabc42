"""Paths in a scenario: one rule.

Every relative path IN a scenario file resolves against the directory of that file (so a
scenario loads the same from any working directory); a path given on the command line
(`--set recording.path=...`, `--record`, `--out`) resolves against the working directory,
as any command-line path does. Scenarios built in code (`parse_scenario(data)` without
base_dir) keep their paths as given (relative to the cwd). Defaults count as written in the
file: `recording.path` "runs/{scenario}-{timestamp}" lands beside the scenario file.
PATH_KEYS lists every such key ("*" = any table key); a section adding a path adds it here.
`hil.scenario.config.load_scenario` applies the rule; `hil.scenario.config` re-exports these names.
"""

from __future__ import annotations

import os
from pathlib import Path

PATH_KEYS: tuple[str, ...] = (
    "recording.path", "plant.residual_model",
    "modbus.request_log", "modbus.client_stats",
    "opcua.security.certificate", "opcua.security.private_key", "opcua.security.trusted_clients_dir",
    "softplc.record",
    "bus.ipc_dir",
    "policy.directory", "policy.onnx",
    "safety.decision_log", "safety.status_path",
    "gaps.latency.observation.*.file", "gaps.latency.actuation.*.file", "gaps.randomize.table.file",
)
TEMPLATE_KEYS = frozenset({"recording.path", "safety.decision_log"})  # str.format templates


def resolve_against(path: str, base_dir: str | Path | None, template: bool = False) -> str:
    """`path` made absolute against `base_dir` (unchanged if absolute, empty or base_dir is None);
    `~` is expanded. In a str.format template, braces of base_dir are escaped."""
    if not path or base_dir is None:
        return path
    p = Path(path).expanduser()
    if p.is_absolute():
        return str(p)
    base = str(Path(base_dir).resolve())
    if template:
        base = base.replace("{", "{{").replace("}", "}}")
    return os.path.normpath(os.path.join(base, p))


def resolve_path(path: str, scenario_path: str | None = None) -> Path:
    """A path from a scenario: absolute as is, relative against the scenario file's directory
    (the cwd when there is no scenario file)."""
    base = None if not scenario_path else Path(scenario_path).resolve().parent
    return Path(resolve_against(str(path), base))


def resolve_path_field(value: str | None, info) -> str | None:
    """Field validator body for file paths: resolved against the directory of the scenario
    being read (pydantic validation context {"base_dir": ...}), so a scenario names its data
    files relative to itself."""
    if value is None:
        return None
    context = info.context or {}
    return resolve_against(value, context.get("base_dir"))


def _child(node, key):
    return node.get(key) if isinstance(node, dict) else getattr(node, key, None)


def _concrete_keys(node, parts: list[str], done: tuple = ()):
    """Concrete key tuples matching `parts` ("*" = every key of a table) that hold a value."""
    if node is None:
        return
    if not parts:
        yield done
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        keys = list(node) if isinstance(node, dict) else []
    else:
        keys = [head]
    for k in keys:
        yield from _concrete_keys(_child(node, k), rest, done + (k,))


def _replace(node, keys: tuple, value):
    """Copy of `node` (dicts / frozen models) with the value at `keys` replaced."""
    if not keys:
        return value
    head = keys[0]
    new = _replace(_child(node, head), keys[1:], value)
    if isinstance(node, dict):
        return {**node, head: new}
    return node.model_copy(update={head: new})


def resolve_scenario_paths(node, base_dir: str | Path | None):
    """`node` (a raw scenario dict or a Scenario) with every PATH_KEYS value resolved against base_dir."""
    if base_dir is None:
        return node
    for pattern in PATH_KEYS:
        for keys in list(_concrete_keys(node, pattern.split("."))):
            value = node
            for k in keys:
                value = _child(value, k)
            if isinstance(value, str) and value:
                resolved = resolve_against(value, base_dir, template=pattern in TEMPLATE_KEYS)
                if resolved != value:
                    node = _replace(node, keys, resolved)
    return node
