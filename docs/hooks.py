"""MkDocs hooks: replace `<!-- generated: NAME -->` markers with text generated from the code.

The generators live in `hil.docgen` (tested in tests/docs); this file only wires them in.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hil.docgen import bench, cli_ref, config_ref, exit_codes, recording_ref  # noqa: E402

# The shipped scenario of each plant family, whose recording columns the reference lists.
RECORDING_SCENARIOS = [ROOT / "configs" / f for f in ("bioreactor.toml", "grid118.toml", "panda.toml")]

GENERATORS = {
    "benchmark-results": lambda: bench.results_markdown(ROOT / "benchmarks" / "results"),
    "scenario-keys": config_ref.scenario_reference_markdown,
    "cli-reference": cli_ref.cli_reference_markdown,
    "exit-codes": exit_codes.exit_codes_markdown,
    "recording-columns": lambda: recording_ref.recording_reference_markdown(RECORDING_SCENARIOS),
}


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (mkdocs hook signature)
    for name, make in GENERATORS.items():
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
