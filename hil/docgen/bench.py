"""Benchmarks page tables from the result files `make bench` writes (`benchmarks/results/*.json`).

Nothing here measures or rounds beyond display: every figure shown is a leaf of a result file,
with the file named above its table, so the page quotes only generated results.
"""
from __future__ import annotations

import json
from pathlib import Path

#: top-level keys describing the conditions of a run, shown before the figures
CONTEXT_KEYS = ("date", "timestamp", "machine", "host", "cpu", "cpus", "load", "load_average",
                "versions", "library_versions", "python", "command", "argv")


def _flatten(obj, prefix: str = ""):
    """Yield (dotted key, scalar) for every scalar leaf of a JSON value; lists of scalars joined."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, list):
        if all(not isinstance(v, (dict, list)) for v in obj):
            yield prefix, ", ".join(_fmt(v) for v in obj)
        else:
            for i, value in enumerate(obj):
                yield from _flatten(value, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None:
        return "—"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _headline(rows: list) -> list[str]:
    """The peer comparison rows a benchmark chose (`results.py`: figure, hil, peer, ratio, goal, met)."""
    out = ["| figure | hil | peer | peer / hil | goal | met |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if not isinstance(r, dict):
            continue
        unit = f" {r['unit']}" if r.get("unit") else ""
        peer = f"{_fmt(r.get('peer'))}{unit} ({_fmt(r['peer_name'])})" if r.get("peer_name") else "—"
        met = r.get("met")
        met_s = "—" if "met" not in r else ("yes" if met else "**no**")
        out.append(f"| {_fmt(r.get('figure'))} | {_fmt(r.get('hil'))}{unit} | {peer} | {_fmt(r.get('ratio'))} | "
                   f"{_fmt(r.get('goal')) if 'goal' in r else '—'} | {met_s} |")
    return out + [""]


def results_markdown(results_dir: Path) -> str:
    """Markdown: one section per `*.json` in `results_dir` (sorted by name), or a note if none."""
    files = sorted(Path(results_dir).glob("*.json"))
    if not files:
        return ("*No generated results in `benchmarks/results/` in this build: run `make bench`, "
                "then rebuild the site (`mkdocs build`).*\n")
    out: list[str] = []
    for path in files:
        out.append(f"### `{path.stem}`\n")
        out.append(f"From `benchmarks/results/{path.name}`.\n")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            out.append(f"*Unreadable result file: {exc}*\n")
            continue
        if not isinstance(data, dict):
            data = {"value": data}
        if set(data) == {"meta", "result"} and isinstance(data["result"], dict):  # written by benchmarks/results.py
            context = data["meta"] if isinstance(data["meta"], dict) else {"meta": data["meta"]}
            data = dict(data["result"])
            rows = data.pop("headline", None)
            if isinstance(rows, list) and rows:
                out.append("Peer / hil ratios are for times: > 1 means hil is faster, < 1 a loss.\n")
                out.extend(_headline(rows))
            figures = data
        else:
            context = {k: data[k] for k in CONTEXT_KEYS if k in data}
            figures = {k: v for k, v in data.items() if k not in context}
        if context:
            out.append("| run | |\n| --- | --- |")
            out.extend(f"| {k} | {_fmt(v)} |" for k, v in _flatten(context))
            out.append("")
        out.append("| figure | value |\n| --- | --- |")
        out.extend(f"| `{k}` | {_fmt(v)} |" for k, v in _flatten(figures))
        out.append("")
    return "\n".join(out) + "\n"
