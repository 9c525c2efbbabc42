"""Scenario-file reference generated from the pydantic config models (hil/scenario/config.py and the
subsystem sections of `hil.scenario.config.SUBSYSTEM_SECTIONS`): one table per TOML table, every key
with its type, default, bounds and the model's own description."""
from __future__ import annotations

import importlib
import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("min_length", "len >="),
           ("max_length", "len <="))


def _models_in(annotation) -> list[tuple[str, type[BaseModel]]]:
    """(how the model nests, model) for the BaseModels an annotation contains:
    '' a table, '.<name>' a table per name (dict), '[]' an array of tables (list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is dict and len(args) == 2:
        return [(".<name>" + k, m) for k, m in _models_in(args[1])]
    if origin in (list, tuple) and args:
        return [("[]" + k, m) for k, m in _models_in(args[0])]
    out = []
    for a in args:  # Union / Optional / Annotated
        out.extend(_models_in(a))
    return out


def _type_text(annotation) -> str:
    """A short, readable type: `int | "auto"`, `list[tuple[float, float]]`, `SensorGap`."""
    import types

    if annotation is type(None):
        return "None"
    if annotation is typing.Any:
        return "any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_text(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_text(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def _type_name(annotation) -> str:
    return _type_text(annotation)


def _default(field) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
        if isinstance(value, BaseModel):
            return "(table)"
        return f"`{value!r}`" if value is not None else "—"
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
        if isinstance(value, BaseModel):
            return "(table)"
        return f"`{value!r}`"
    return "**required**"


def _bounds(field) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sym in _BOUNDS:
            v = getattr(meta, attr, None)
            if v is not None:
                parts.append(f"{sym} {v}")
    return ", ".join(parts)


def _clean(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def model_tables(path: str, model: type[BaseModel], seen: set | None = None) -> list[str]:
    """Markdown sections for `model` at TOML path `path` and every model nested in it."""
    seen = set() if seen is None else seen
    if (path, model) in seen:
        return []
    seen.add((path, model))
    doc = _clean(model.__doc__ if model.__doc__ and "BaseModel" not in model.__doc__[:40] else "")
    lines = [f"### `[{path}]`\n", f"{doc}\n" if doc else "",
             "| key | type | default | bounds | meaning |", "| --- | --- | --- | --- | --- |"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        lines.append(f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | {_bounds(field)} "
                     f"| {_clean(field.description)} |")
        for how, sub in _models_in(field.annotation):
            nested.append((f"{path}.{key}{how.replace('[]', '')}" if not how.startswith("[]")
                           else f"[{path}.{key}{how[2:]}]", sub))
    if model.model_config.get("extra") == "allow":
        lines.append("| *other keys* | | | | passed on (see the description above) |")
    out = ["\n".join(lines) + "\n"]
    for sub_path, sub in nested:
        out.extend(model_tables(sub_path, sub, seen))
    return out


def scenario_reference_markdown() -> str:
    """The whole scenario reference: core sections, then each subsystem section."""
    from hil.scenario import config

    out = []
    for name, field in config.Scenario.model_fields.items():
        models = _models_in(field.annotation)
        if name in config.SUBSYSTEM_SECTIONS:
            module, cls = config.SUBSYSTEM_SECTIONS[name]
            models = [("", getattr(importlib.import_module(module), cls))]
        for how, model in models:
            out.append(f"## {name}\n")
            if how:
                out.append(f"One table per name: `[{name}.<name>]`.\n")
            out.extend(model_tables(name + (".<name>" if how else ""), model))
    return "\n".join(out)
