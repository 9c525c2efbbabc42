"""The module import graph of hil/, plants/ and adapters/ has no cycle, function-level imports
included (a cycle hidden by an import inside a function is still a cycle: the two modules
cannot be understood, tested or moved apart), and every module imports in a fresh
interpreter.

The graph is read with `ast` from every `import` / `from ... import` anywhere in a module
(top level, functions, methods); importing `a.b.c` also imports the packages `a` and `a.b`.
The edges still allowed are listed with their reason; a new cycle fails this test.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hil", "plants", "adapters")

# (importer, imported): edges that close a cycle still, each with why it stays
ALLOWED = {
    # the gaps section validates itself through its checks, which read the section's models:
    # one unit split over two files (hil/scenario/config.py calls every section's validate_against)
    ("hil.gaps.config", "hil.gaps.checks"): "section -> its checks",
    # hil/safety is another branch's (issue 19's brief leaves it alone): still open
    ("hil.safety.config", "hil.safety.projection"): "open",
    ("hil.safety.wrapper", "hil.safety.launch"): "open",
}


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    def with_parents(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & mods.keys()

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [resolve(f"{mod}.{a.name}") for a in node.names]
            for t in targets:
                if t is not None:
                    graph[m] |= {p for p in with_parents(t) if p != m and not m.startswith(p + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_beyond_the_listed_edges():
    mods = modules()
    graph = import_graph(mods)
    for (a, b) in ALLOWED:
        assert b in graph[a], f"allowed edge {a} -> {b} is gone: remove it from ALLOWED"
        graph[a].discard(b)
    assert cycles(graph) == []


def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(modules())
    code = ("import importlib, sys\nsys.path.insert(0, %r)\nbad = []\nfor m in %r:\n"
            "    try:\n        importlib.import_module(m)\n    except Exception as e:\n"
            "        bad.append(f'{m}: {e!r}')\nprint('\\n'.join(bad))\n") % (str(ROOT), names)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == ""
