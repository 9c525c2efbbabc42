"""A small TOML writer for the calibration outputs (nested dicts of str/bool/int/float/lists).

Tables are written depth-first with dotted headers; non-finite floats as nan/inf (TOML 1.0).
"""

from __future__ import annotations

import math
import re

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else '"' + k.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    if hasattr(v, "item"):  # numpy scalar
        return _value(v.item())
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps(data: dict, comments: dict[str, str] | None = None) -> str:
    """TOML text of `data`; `comments` maps a dotted table path to a comment line above it."""
    out: list[str] = []
    comments = comments or {}

    def table(d: dict, path: list[str]) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict) or _inline(v)}
        subs = {k: v for k, v in d.items() if k not in scalars}
        if path and (scalars or not subs):
            dotted = ".".join(_key(p) for p in path)
            if dotted in comments:
                out.append(f"# {comments[dotted]}")
            out.append(f"[{dotted}]")
        for k, v in scalars.items():
            out.append(f"{_key(k)} = {_value(v)}")
        if path and (scalars or not subs):
            out.append("")
        for k, v in subs.items():
            table(v, path + [k])

    table(data, [])
    return "\n".join(out).rstrip() + "\n"


def _inline(d: dict) -> bool:
    """Small leaf tables (e.g. a Dist) stay inline."""
    return bool(d) and all(not isinstance(v, dict) for v in d.values()) and "dist" in d
