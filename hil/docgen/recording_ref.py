"""Recording-columns reference generated from the recorder and the plant specs: the column list
is `hil.recorder.columns_for(spec)` (what the recorder writes, in row order) for the plant of
each shipped scenario, with the unit and description of each signal from its spec; an array
group (`bus.vm`, `joint.q`) is one row with its element count and first and last column."""
from __future__ import annotations

import ast
from pathlib import Path

# column prefix -> the spec kind it comes from, and what the column holds
PREFIXES = {
    "cmd": ("inputs", "commanded input (what the driver asked for)"),
    "app": ("inputs", "applied input (after clip, actuator gaps and the safety shield)"),
    "x": ("states", "true state"),
    "y": ("outputs", "true output"),
    "meas": ("outputs", "measured output, as served (after sensor and latency gaps)"),
    "z": ("algebraic", "algebraic unknown"),
    "d": ("discrete", "discrete state (exact integers)"),
}


def recorder_columns_paragraph() -> str:
    """The "Columns:" paragraph of hil/recorder.py's docstring (what every recording holds)."""
    import hil.recorder

    doc = ast.get_docstring(ast.parse(Path(hil.recorder.__file__).read_text())) or ""
    para = next((p for p in doc.split("\n\n") if p.lstrip().startswith("Columns:")), "")
    return " ".join(para.split())


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def columns_table(spec) -> str:
    """Markdown table of the recording columns of a plant with `spec`, in row order."""
    from hil.recorder import columns_for

    import re

    rule = recorder_columns_paragraph()
    rows = ["| column | unit | what |", "| --- | --- | --- |"]
    seen_groups: set = set()
    for col in columns_for(spec):
        prefix, dot, name = col.partition(".")
        if not dot:
            m = re.search(rf"\b{col} \(([^)]*)\)", rule)
            rows.append(f"| `{col}` | | every plant{': ' + _cell(m.group(1)) if m else ''} |")
            continue
        kind, what = PREFIXES[prefix]
        i = spec.index(kind, name)
        g = spec.group_of(kind, i)
        if g is not None:
            if (prefix, g.name) in seen_groups:
                continue
            seen_groups.add((prefix, g.name))
            names = spec.names(kind)
            first, last = names[g.start], names[g.stop - 1]
            rows.append(f"| `{prefix}.{first}` ... `{prefix}.{last}` ({g.size} columns, group `{g.name}`) "
                        f"| {_cell(g.unit)} | {what}: {_cell(g.description)} |")
            continue
        q = spec.quantity(kind, name)
        rows.append(f"| `{col}` | {_cell(q.unit)} | {what}: {_cell(q.description)} |")
    return "\n".join(rows)


def recording_reference_markdown(scenarios) -> str:
    """The page body: the recorder's column rule, then one table per scenario's plant."""
    from hil.scenario.config import load_scenario
    from hil.recorder import columns_for

    parts = [recorder_columns_paragraph().replace("<", "&lt;"), ""]
    for path in scenarios:
        sc = load_scenario(path)
        spec = sc.plant.load().spec
        n = len(columns_for(spec))
        parts += [f"## `{sc.plant.model}` (`{Path(path).name}`)", "",
                  f"{n} columns. {_cell(spec.description)}", "", columns_table(spec), ""]
    return "\n".join(parts)
