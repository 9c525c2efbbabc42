"""Block tag maps: an array group of the spec served as one block.

Modbus (`[[modbus.blocks]]`, hil/tagmap/modbus.py `RegisterBlock`): one entry maps a group
onto consecutive addresses of one table,

    [[modbus.blocks]]
    group = "bus.vm"            # an array group of plant outputs (or inputs)
    table = "input_register"
    start = 100                 # element k (group order) at start + k * stride
    encoding = "uint16"         # ... every field of a [[modbus.map]] entry but signal/address
    scale = 10000.0
    stride = 1                  # optional: addresses per element (default: the encoding's width)

and is expanded once, at configure time, into one view per element (`bus_1.vm` at 100,
`bus_2.vm` at 101, ...), checked and served exactly as map entries are (access rules,
ranges, overlaps: a problem is reported once, at `modbus.blocks[j]`).

OPC UA (`[[opcua.folders]]`, hil/tagmap/opcua.py `OpcuaFolder`): one entry puts a group's
variables in a folder of their own, `Objects/<scenario>/Sensors/<folder>/<element>` (and
`Actuators/<folder>/`, `Applied/<folder>/` for an input group), each variable with the
element's unit (EngineeringUnits) and bounds (EURange) from the spec; its string node id
mirrors the browse path: `<scenario>.Sensors.<folder>.<element>`.
"""

from __future__ import annotations


def dedupe(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Problems without repeats, in order: a block's elements share one key path, so the
    first problem at each block key stands for all ("and N more elements"); a block's
    `address` is its `start`."""
    out: list[list] = []
    first: dict[str, list] = {}
    seen: set = set()
    for path, reason in problems:
        if path.startswith("modbus.blocks["):
            if path.endswith(".address"):
                path = path[: -len("address")] + "start"
            if path in first:
                first[path][2] += 1
                continue
            entry = [path, reason, 0]
            first[path] = entry
            out.append(entry)
        elif (path, reason) not in seen:
            seen.add((path, reason))
            out.append([path, reason, 0])
    return [(p, r + (f" (and {n} more element{'s' if n > 1 else ''} of the block)" if n else ""))
            for p, r, n in out]


def group_kind(spec, name: str) -> str | None:
    """"outputs" or "inputs" for an array group of that name, else None."""
    for kind in ("outputs", "inputs"):
        if spec.group(kind, name) is not None:
            return kind
    return None


def _groups_known(spec) -> str:
    names = [f"{g.name}[{g.size}]" for k in ("outputs", "inputs") for g in spec.groups_of(k)]
    return ", ".join(names) or "none"


def expand_blocks(section, spec, entry, problems: list | None = None) -> list:
    """[(key path, entry)] for every element of every [[modbus.blocks]] entry, `entry` the
    model class of one mapped value (hil/tagmap/modbus.py RegisterMap, passed in: this
    module sits below the section that uses it); an unknown group is appended to `problems`
    (when given) and skipped."""
    out = []
    for j, b in enumerate(section.blocks):
        key = f"modbus.blocks[{j}]"
        kind = group_kind(spec, b.group)
        if kind is None:
            if problems is not None:
                problems.append((f"{key}.group", f"{spec.name} has no array group {b.group!r} of outputs or "
                                 f"inputs (groups: {_groups_known(spec)})"))
            continue
        common = b.model_dump(exclude={"group", "start", "stride"})
        stride = b.stride
        names = spec.expand(kind, b.group)
        for k, name in enumerate(names):
            e = entry.model_construct(signal=name, address=0, **common)
            step = stride if stride is not None else e.n_words
            if stride is not None and stride < e.n_words:
                if problems is not None:
                    problems.append((f"{key}.stride", f"{stride} is less than the {e.n_words} addresses "
                                     f"of one {e.effective_encoding} value"))
                break
            out.append((key, entry.model_construct(signal=name, address=b.start + k * step, **common)))
    return out


def folder_of(section, spec, problems: list | None = None) -> dict[str, tuple[int, object]]:
    """{element name: (entry index, OpcuaFolder)} for every [[opcua.folders]] entry; bad
    entries (unknown group, a group in two folders, a folder name taken twice) go to problems."""
    out: dict[str, tuple[int, object]] = {}
    seen: dict[tuple[str, str], int] = {}
    for j, f in enumerate(section.folders):
        key = f"opcua.folders[{j}]"
        kind = group_kind(spec, f.group)
        if kind is None:
            if problems is not None:
                problems.append((f"{key}.group", f"{spec.name} has no array group {f.group!r} of outputs or "
                                 f"inputs (groups: {_groups_known(spec)})"))
            continue
        fname = f.name or f.group
        if (kind, fname) in seen:
            if problems is not None:
                problems.append((f"{key}.name", f"folder {fname!r} is already opcua.folders[{seen[(kind, fname)]}]"))
            continue
        seen[(kind, fname)] = j
        for name in spec.expand(kind, f.group):
            if name in out:
                if problems is not None:
                    problems.append((f"{key}.group", f"{name!r} is already in opcua.folders[{out[name][0]}]"))
                continue
            out[name] = (j, f)
    return out
