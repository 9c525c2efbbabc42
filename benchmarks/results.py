"""One results file for every benchmark: ``benchmarks/results/<name>.json`` plus a generated table.

Every benchmark prints one JSON object as the last line of stdout (CONVENTIONS.md). This module
stores it with the conditions it was measured under, and renders ``benchmarks/results/README.md``
from all stored results, so README and docs quote generated figures, never hand copies.

A benchmark may put a ``headline`` list in its JSON: rows of
``{"figure", "hil", "peer", "peer_name", "ratio", "unit", "goal", "met"}`` (``ratio`` is
peer / hil for times: > 1 means hil is faster); the table shows those rows. The rest of the
object stays in the JSON file.

Usage (what ``make bench`` runs)::

    python benchmarks/results.py record NAME -- python benchmarks/NAME.py [args]
    python benchmarks/results.py table

``record`` runs the command (stderr passes through), stores the last stdout line as the result
of NAME and regenerates the table; it fails (exit 1) if the command fails or prints no JSON,
or if the result is a smoke run (``"quick": true``: few samples, not a figure to publish).
A benchmark can also call :func:`write` itself (same refusal).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
VERSIONED = ("numpy", "numba", "scipy", "lightsim2grid", "pypower", "pandapower", "pin", "libpinocchio", "mujoco", "pyzmq",
             "pymodbus", "asyncua", "gymnasium")


def machine() -> dict:
    """Where and under what load the figures were measured."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "kernel": platform.release(), "load_average_1_5_15": [round(x, 2) for x in load]}


def versions() -> dict:
    out = {}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=RESULTS_DIR.parent, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class SmokeResult(ValueError):
    """A ``--quick`` result offered for publication."""


def write(name: str, result: dict, command: list[str] | None = None, load_before: list | None = None) -> Path:
    """Store ``result`` as ``results/<name>.json`` with date, machine, load, versions and commit.

    Raises SmokeResult for a result marked ``"quick": true`` (a smoke run is never published)."""
    if isinstance(result, dict) and result.get("quick") is True:
        raise SmokeResult(f"{name}: a --quick (smoke) result is not stored; run the benchmark at full length")
    check_headline(name, result)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": name, "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": command or [sys.executable, *sys.argv], "machine": machine(), "versions": versions(),
            "commit": git_commit()}
    if load_before is not None:
        meta["machine"]["load_average_before"] = load_before
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps({"meta": meta, "result": result}, indent=1, default=float) + "\n")
    return path


HEADLINE_KEYS = {"figure", "hil"}  # required in every headline row; peer, peer_name, ratio, unit, goal, met optional


def check_headline(name: str, result) -> None:
    """A result's ``headline`` (optional) must be a list of rows, each a dict with at least
    ``figure`` and ``hil``; anything else is a SmokeResult naming the benchmark and the row, so a
    malformed result is refused when it is recorded, not when the table is generated."""
    rows = result.get("headline") if isinstance(result, dict) else None
    if rows is None:
        return
    if not isinstance(rows, list):
        raise SmokeResult(f"{name}: 'headline' must be a list of rows "
                          f"{{figure, hil, peer, peer_name, ratio, unit, goal, met}}, not {type(rows).__name__}")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not HEADLINE_KEYS <= set(r):
            raise SmokeResult(f"{name}: headline[{i}] must be a dict with at least 'figure' and 'hil': {r!r}")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, (int, float)):
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 100:
            return f"{v:.0f}"
        if a >= 1:
            return f"{v:.2f}"
        if a >= 1e-3:
            return f"{v:.4f}"
        return f"{v:.2e}"
    return str(v)


def table() -> str:
    """Markdown for every stored result (generated; do not edit by hand)."""
    lines = ["# Benchmark results (generated)", "",
             "Written by `make bench` (`benchmarks/results.py`); do not edit by hand. Each row comes from "
             "`benchmarks/results/<name>.json`, which holds every figure of the run, its command and its "
             "conditions. Ratios are peer / hil for times (> 1: hil faster, < 1: hil slower). "
             "Rules every comparison follows: `benchmarks/README.md`.", ""]
    for path in sorted(RESULTS_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        meta, result = doc["meta"], doc["result"]
        m = meta["machine"]
        ver = ", ".join(f"{k} {v}" for k, v in sorted(meta.get("versions", {}).items()))
        lines += [f"## {meta['benchmark']}", "",
                  f"{meta['date_utc']}, commit {meta.get('commit')}, {m.get('cpu')} ({m.get('cores')} cores), "
                  f"load average {m.get('load_average_before', m.get('load_average_1_5_15'))} before / "
                  f"{m.get('load_average_1_5_15')} after; `{' '.join(Path(c).name if i == 0 else c for i, c in enumerate(meta['command']))}`",
                  "", f"Versions: {ver}.", ""]
        rows = result.get("headline") if isinstance(result, dict) else None
        if rows:
            lines += ["| figure | hil | peer | peer / hil | goal | met |", "| --- | --- | --- | --- | --- | --- |"]
            for r in rows:
                unit = f" {r['unit']}" if r.get("unit") else ""
                peer = f"{_fmt(r.get('peer'))}{unit} ({r['peer_name']})" if r.get("peer_name") else "-"
                lines.append(f"| {r['figure']} | {_fmt(r.get('hil'))}{unit} | {peer} | {_fmt(r.get('ratio'))} | "
                             f"{_fmt(r.get('goal')) if 'goal' in r else '-'} | {_fmt(r.get('met')) if 'met' in r else '-'} |")
        else:
            lines.append(f"No headline rows; all figures in `{path.name}`.")
        lines.append("")
    return "\n".join(lines)


def write_table() -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "README.md"
    path.write_text(table())
    return path


def record(name: str, cmd: list[str]) -> int:
    load_before = [round(x, 2) for x in os.getloadavg()]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        print(f"results: {name} failed (exit {proc.returncode}); nothing stored", file=sys.stderr)
        return 1
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        print(f"results: {name} printed no JSON on its last stdout line; nothing stored", file=sys.stderr)
        return 1
    try:
        path = write(name, result, cmd, load_before)
    except SmokeResult as exc:
        print(f"results: {exc}", file=sys.stderr)
        return 1
    write_table()
    print(f"results: {path.relative_to(RESULTS_DIR.parent.parent)} and results/README.md written", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["table"]:
        print(write_table())
        return 0
    if len(argv) >= 4 and argv[0] == "record" and argv[2] == "--":
        return record(argv[1], argv[3:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
