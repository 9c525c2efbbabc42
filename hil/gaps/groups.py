"""Array groups in [gaps]: a key naming a group (`node.temp`, or `node.temp[2]` for one
element) stands for its elements; an entry for one element overrides the group's.

`expand_groups(section, spec)` returns the section keyed by element names only (what the
pipeline and the checks work on, resolved once at configure time) and the origin of each
expanded key, so that a problem found on an element is reported at the key the user wrote
(`gaps.sensors.node.temp.bias`, once, not once per element).
"""

from __future__ import annotations

from hil.gaps.config import GapsSection


def _table(table: dict, spec, kind: str, prefix: str, origin: dict) -> dict:
    out: dict = {}
    names = spec.names(kind)
    for pass_groups in (True, False):  # groups first: an element's own entry wins
        for key, value in table.items():
            is_group = spec.group(kind, key) is not None
            if is_group != pass_groups:
                continue
            if not spec.has(kind, key):
                out[key] = value  # unknown: the checks name it
                continue
            for i in spec.indices(kind, key):
                out[names[i]] = value
                origin[f"{prefix}.{names[i]}"] = f"{prefix}.{key}"
    return out


def _signals(sigs: list[str] | None, spec, kind: str) -> list[str] | None:
    if sigs is None:
        return None
    out: list[str] = []
    for s in sigs:
        out += list(spec.expand(kind, s)) if spec.has(kind, s) else [s]
    return out


def expand_groups(section: GapsSection, spec) -> tuple[GapsSection, dict[str, str]]:
    """(section keyed by element names, {expanded key path: key path as written})."""
    origin: dict[str, str] = {}
    rz = section.randomize
    latency = {}
    for direction, kind in (("observation", "outputs"), ("actuation", "inputs")):
        chans = {}
        for name, ch in getattr(section.latency, direction).items():
            sigs = ch.signals
            if sigs is None and spec.group(kind, name) is not None:
                sigs = [name]
            chans[name] = ch.model_copy(update={"signals": _signals(sigs, spec, kind)}) if sigs is not None else ch
        latency[direction] = chans
    new = section.model_copy(update={
        "sensors": _table(section.sensors, spec, "outputs", "gaps.sensors", origin),
        "actuators": _table(section.actuators, spec, "inputs", "gaps.actuators", origin),
        "latency": section.latency.model_copy(update=latency),
        "randomize": rz.model_copy(update={
            "plant": _table(rz.plant, spec, "params", "gaps.randomize.plant", origin),
            "sensors": _table(rz.sensors, spec, "outputs", "gaps.randomize.sensors", origin),
            "actuators": _table(rz.actuators, spec, "inputs", "gaps.randomize.actuators", origin),
        }),
    })
    return new, origin


def report_at_origin(problems: list[tuple[str, str]], origin: dict[str, str]) -> list[tuple[str, str]]:
    """Problems on expanded element keys moved to the key as written, duplicates dropped."""
    out, seen = [], set()
    for path, reason in problems:
        for exp, orig in origin.items():
            if exp != orig and (path == exp or path.startswith(exp + ".")):
                path = orig + path[len(exp):]
                break
        if (path, reason) not in seen:
            seen.add((path, reason))
            out.append((path, reason))
    return out
