"""Scenario tables keyed by signal name, and the plant's file options.

Signal names are identifiers joined by dots (`gen_3.p`, `bus_12.vm`, plants/spec.py). In
TOML a dotted key is nested tables, so `[inputs.gen_3.p]` and `--set inputs.gen_3.p.value=1`
arrive as {"gen_3": {"p": {...}}}; `flatten_signal_tables` joins them back into the one
name "gen_3.p" for every table registered in SIGNAL_TABLES (a section registers its own with
`register_signal_table`), merging an entry spelled both ways. An entry is recognised by its
fields (or by holding no table), so a typo inside an entry stays an unknown key.

Array groups: `expand_input_groups` turns `[inputs."gen.p"]` into one entry per element,
`expand_name_list` a list of names (a policy's features) into elements, once, when the
scenario is validated against the plant's spec.

`resolve_plant_files` applies the path rule (hil/scenario/paths.py) to the options a plant module
declares as files (FILE_OPTIONS, plants/base.py): `[plant] case = "case118.m"` is relative
to the scenario file.
"""

from __future__ import annotations

from pathlib import Path

from hil.errors import ConfigError
from hil.scenario.paths import resolve_against
from hil.scenario.sections import SUBSYSTEM_SECTIONS


def expand_input_groups(inputs: dict, spec) -> dict:
    """[inputs."gen.p"] (an array group) -> one entry per element (`gen_1.p`, ...); an
    element's own entry overrides the group's fields it sets. Unknown names are kept (the
    checks name them). The result keeps the declaration order (an element at its first mention,
    a group's elements in spec order at the group's place): the gym env's action order."""
    out: dict = {}
    order: list[str] = []
    for name, inp in inputs.items():
        if spec.group("inputs", name) is not None:
            for el in spec.expand("inputs", name):
                out[el] = inp
                order.append(el)
        else:
            order.append(spec.names("inputs")[spec.index("inputs", name)] if spec.has("inputs", name) else name)
    for name, inp in inputs.items():
        if spec.group("inputs", name) is None:
            if spec.has("inputs", name):
                name = spec.names("inputs")[spec.index("inputs", name)]  # `gen.p[2]` -> its element
            base = out.get(name)
            out[name] = inp if base is None else base.model_copy(update={k: getattr(inp, k) for k in inp.model_fields_set})
    return {n: out[n] for n in dict.fromkeys(order)}


# Tables keyed by input name whose values apply per element: a group key sets every element
# (an element's own key wins). Expanded once the spec is known (hil.scenario.config.parse_scenario).
INPUT_VALUE_TABLES: tuple[tuple[str, ...], ...] = (
    ("bus", "fallback_action"),
    ("safety", "projection", "box"), ("safety", "projection", "rate"),
    ("safety", "fallback", "fixed"), ("safety", "fallback", "safe_output"),
    ("safety", "rollout", "limited_max_deviation"), ("safety", "rollout", "limited_box"),
)


def expand_value_tables(sc, spec):
    """`sc` (a Scenario) with group keys of INPUT_VALUE_TABLES replaced by their elements."""
    from hil.scenario.paths import _child, _replace

    for path in INPUT_VALUE_TABLES:
        table = sc
        for part in path:
            table = _child(table, part)
        if not isinstance(table, dict) or not any(spec.group("inputs", k) is not None for k in table):
            continue
        out: dict = {}
        for k, v in table.items():
            if spec.group("inputs", k) is not None:
                out.update({e: v for e in spec.expand("inputs", k)})
        out.update({k: v for k, v in table.items() if spec.group("inputs", k) is None})
        sc = _replace(sc, path, out)
    return sc


def expand_name_list(names: list[str], spec, kind: str) -> list[str]:
    """A list of signal names with each array group replaced by its elements, in order
    (`u.<group>` too, for inputs among observation features)."""
    out: list[str] = []
    for n in names:
        k, bare, prefix = kind, n, ""
        if kind == "outputs" and n.startswith("u."):
            k, bare, prefix = "inputs", n[2:], "u."
        out += [prefix + e for e in spec.expand(k, bare)] if spec.group(k, bare) is not None else [n]
    return out

def resolve_plant_files(data: dict, base_dir: str | Path | None, source: str | None = None,
                        model: str | None = None) -> dict:
    """`data` with the plant's FILE_OPTIONS under [plant] resolved against base_dir (the
    plant module names which of its options are paths). Raises ConfigError for an unknown
    plant module."""
    from plants.base import is_built, load_plant_module

    plant = data.get("plant") if isinstance(data, dict) else None
    model = model or (plant.get("model") if isinstance(plant, dict) else None)
    if base_dir is None or not isinstance(plant, dict) or not isinstance(model, str):
        return data
    try:
        module = load_plant_module(model)
    except ValueError as exc:
        raise ConfigError("plant.model", str(exc), source=source) from None
    if not is_built(module):
        return data
    new = dict(plant)
    for key in getattr(module, "FILE_OPTIONS", ()):
        if isinstance(new.get(key), str) and new[key]:
            new[key] = resolve_against(new[key], base_dir)
    return {**data, "plant": new}


# Tables keyed by signal name, where nested TOML keys spell a dotted name
# ([inputs.gen_3.p] = [inputs."gen_3.p"]): path -> the keys of one entry (None: scalar entries).
SIGNAL_TABLES: dict[tuple[str, ...], frozenset | None] = {
    ("plant", "parameters"): None,
    ("plant", "initial_state"): None,
    ("inputs",): frozenset({"driver", "value", "profile"}),  # hil.scenario.config.InputSection
    ("bus", "fallback_action"): None,
}


def register_signal_table(path: tuple[str, ...], entry_keys) -> None:
    """A section adds a table keyed by signal name (entry_keys: an entry's field names, or
    None when entries are plain values)."""
    SIGNAL_TABLES[tuple(path)] = None if entry_keys is None else frozenset(entry_keys)


def _is_entry(value, keys: frozenset | None) -> bool:
    if not isinstance(value, dict):
        return True
    # an entry has one of the entry's fields, or no table inside (a typo stays an unknown key)
    return keys is not None and (any(k in keys for k in value) or not any(isinstance(v, dict) for v in value.values()))


def flatten_names(table: dict, keys: frozenset | None, prefix: str = "") -> dict:
    """{"gen_3": {"p": entry}} -> {"gen_3.p": entry}; entries met twice (a dotted key and a
    nested one, e.g. a --set override) are merged, the later winning per key."""
    out: dict = {}
    for k, v in table.items():
        name = f"{prefix}{k}"
        if _is_entry(v, keys):
            if isinstance(v, dict) and isinstance(out.get(name), dict):
                merged = dict(out[name])
                _deep_merge(merged, v)
                out[name] = merged
            else:
                out[name] = v
        else:
            for n, e in flatten_names(v, keys, name + ".").items():
                if isinstance(e, dict) and isinstance(out.get(n), dict):
                    merged = dict(out[n])
                    _deep_merge(merged, e)
                    out[n] = merged
                else:
                    out[n] = e
    return out


def flatten_signal_tables(data: dict) -> dict:
    """`data` with every SIGNAL_TABLES table's nested names joined by dots."""
    import importlib

    for mod, _cls in SUBSYSTEM_SECTIONS.values():  # sections register their tables on import
        if mod.split(".")[0] == "hil":
            try:
                importlib.import_module(mod)
            except ImportError:
                pass
    for path, keys in SIGNAL_TABLES.items():
        node = data
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        table = node.get(path[-1]) if isinstance(node, dict) else None
        if not isinstance(table, dict):
            continue
        flat = flatten_names(table, keys)
        if flat != table:
            data = _set_in(data, path, flat)
    return data


def _set_in(data: dict, path: tuple, value) -> dict:
    if len(path) == 1:
        return {**data, path[0]: value}
    return {**data, path[0]: _set_in(data[path[0]], path[1:], value)}


def _deep_merge(base: dict, over: dict) -> None:
    """Merge `over` into `base` in place: nested tables merged key by key, anything else replaced
    (the one merge of scenario overrides: config, campaign expansion, signal tables)."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value
