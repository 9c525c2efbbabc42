"""Exit-code reference generated from the code that exits:

- `hil run` / `hil demo`: the `EXIT_<NAME> = <code>  # meaning` constants of hil/loop/health.py, then
  the plants' own codes (`EXIT_<NAME> = <code>` in a plant package, e.g. the grid's watches, with
  the comment above them);
- every other command: the "Exit codes" paragraph of its module docstring (hil/commands/*.py).

The constants and docstrings are what the code uses and what `--help` readers see, so the page
cannot drift from them; a command without such a paragraph is listed with click's rule
(0 success, 1 an error it reports, 2 usage).
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_CONST = re.compile(r"^(EXIT_[A-Z0-9_]+)\s*=\s*(\d+)\s*(?:#\s*(.*))?$")


def constants(path: Path) -> list[tuple[int, str, str]]:
    """(code, constant, trailing comment) for each `EXIT_<NAME> = <code>` line of a file."""
    out = []
    for line in Path(path).read_text().splitlines():
        m = _CONST.match(line.strip())
        if m:
            out.append((int(m.group(2)), m.group(1), (m.group(3) or "").strip()))
    return out


def _option_helps(path: Path) -> dict:
    """A plant module's `OPTIONS = {option: help}` literal (read, not imported: no build)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "OPTIONS" for t in node.targets):
            try:
                return dict(ast.literal_eval(node.value))
            except ValueError:
                return {}
    return {}


def _words(constant: str) -> str:
    return constant.removeprefix("EXIT_").replace("_", " ").lower()


def run_codes_markdown() -> str:
    """The table of `hil run`'s exit codes: hil/loop/health.py, then the plants' codes with the
    plant option that selects them (the option whose help names "exit code N")."""
    rows = [(code, f"`hil.loop.health.{name}`", meaning or _words(name))
            for code, name, meaning in constants(ROOT / "hil" / "loop" / "health.py")]
    for path in sorted((ROOT / "plants").rglob("*.py")):
        mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        helps = _option_helps(path)
        for code, name, meaning in constants(path):
            why = meaning or _words(name)
            opts = [f"`[plant] {k}`: {v}" for k, v in helps.items() if re.search(rf"exit code {code}\b", v)]
            why += " (" + ("; ".join(opts) if opts else "a plant watch with action \"fail\"") + ")"
            rows.append((code, f"`{mod}.{name}`", why))
    rows.sort(key=lambda r: r[0])
    return "\n".join(["| code | constant | meaning |", "| --- | --- | --- |"]
                     + [f"| {c} | {n} | {_cell(w)} |" for c, n, w in rows])


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def docstring_exit_paragraph(doc: str) -> str:
    """The text from "Exit codes" (or "Exit\\ncodes") to the end of its paragraph, one line."""
    flat = "\n".join(doc.split("\n"))
    m = re.search(r"Exit\s+codes\b", flat)
    if not m:
        return ""
    start = flat.rfind("\n\n", 0, m.start())
    para = flat[start + 2 if start >= 0 else 0:]
    para = para.split("\n\n")[0]
    para = para[para.find(m.group(0)) if m.group(0) in para else 0:]
    return re.sub(r"^Exit\s+codes:\s*", "", " ".join(para.split()))


def command_codes() -> list[tuple[str, str]]:
    """(command, its exit-code paragraph or '') for every module of hil/commands/, sorted."""
    import click

    import hil.commands as pkg
    from hil.docgen.cli_ref import walk

    out = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"hil.commands.{info.name}")
        cmd = getattr(module, "command", None)
        if not isinstance(cmd, click.Command):
            continue
        doc = ast.get_docstring(ast.parse(Path(module.__file__).read_text())) or ""
        para = docstring_exit_paragraph(doc)
        notes = [f"`{path}`: {m.group(1)}" for path, sub in walk(cmd, f"hil {cmd.name}")
                 for m in [re.search(r"\((exit \d+[^)]*)\)", sub.help or "")] if m]
        if notes:  # a subcommand's own code, as its help text states it
            para = (para + " " if para else "") + "; ".join(notes) + "."
        out.append((f"hil {cmd.name}", para))
    return out


def exit_codes_markdown() -> str:
    parts = ["## `hil run` and `hil demo`", "",
             "A run's summary carries its exit code (`exit_code` in `hil run --json`'s last line); "
             "the CLI exits with it.", "", run_codes_markdown(), "", "## Other commands", "",
             "| command | exit codes |", "| --- | --- |"]
    for name, para in command_codes():
        if name in ("hil demo",):
            continue
        rule = ("0 done, 1 an error it reports (the message says which), 2 bad configuration or usage "
                "(click's rule)")
        text = para if para and not para.startswith("`") else rule + (f"; {para}" if para else "")
        parts.append(f"| `{name}` | {_cell(text)} |")
    return "\n".join(parts) + "\n"
