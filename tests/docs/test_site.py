"""The documentation site builds with `mkdocs build --strict` (broken links, missing pages and
nav entries fail the build), and its generated pages come from the code."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    index = (tmp_path / "site" / "index.html").read_text()
    assert "hardware-in-the-loop" in index
    bench = (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    assert "<!-- generated:" not in bench  # every marker was replaced
    keys = (tmp_path / "site" / "reference" / "scenario" / "index.html").read_text()
    assert "<!-- generated:" not in keys and "time_scale" in keys
    from hil.cli import main
    from hil.docgen.cli_ref import walk

    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "<!-- generated:" not in cli
    for path, _ in walk(main):  # every command, as a heading with its anchor
        assert f'id="{path.replace(" ", "-")}"' in cli, path
    codes = (tmp_path / "site" / "reference" / "exit-codes" / "index.html").read_text()
    assert "<!-- generated:" not in codes and "EXIT_SAFETY_LOST" in codes
    rec = (tmp_path / "site" / "reference" / "recording" / "index.html").read_text()
    assert "<!-- generated:" not in rec and "meas.dissolved_oxygen" in rec and "group <code>bus.vm</code>" in rec


def test_benchmark_tables_quote_the_result_files(tmp_path):
    from hil.docgen.bench import results_markdown

    assert "No generated results" in results_markdown(tmp_path)
    (tmp_path / "grid_speed.json").write_text(json.dumps({
        "date": "2026-12-01T10:00:00Z", "load_average": [2.5, 2.1, 1.9],
        "case118": {"warm_ms": 0.0361234, "reference": {"lightsim2grid_ms": 0.114}}, "goal_met": True}))
    (tmp_path / "broken.json").write_text("{not json")
    md = results_markdown(tmp_path)
    assert "### `grid_speed`" in md and "benchmarks/results/grid_speed.json" in md
    assert "| `case118.warm_ms` | 0.03612 |" in md
    assert "| `case118.reference.lightsim2grid_ms` | 0.114 |" in md
    assert "| load_average | 2.5, 2.1, 1.9 |" in md
    assert "| `goal_met` | True |" in md
    assert "Unreadable result file" in md.split("### `broken`")[1].split("###")[0]


def test_results_py_files_show_their_headline_rows_and_conditions(tmp_path):
    from hil.docgen.bench import results_markdown

    (tmp_path / "manipulator_speed.json").write_text(json.dumps({
        "meta": {"benchmark": "manipulator_speed", "date_utc": "2026-12-02 15:00 UTC",
                 "machine": {"cores": 2, "load_average_1_5_15": [3.1, 2.0, 1.5]}, "versions": {"pin": "3.4.0"}},
        "result": {"headline": [{"figure": "ABA called from Python, per call", "hil": 5.2, "peer": 3.4,
                                 "peer_name": "pin.aba from Python", "ratio": 0.654, "unit": "us",
                                 "goal": "ratio >= 1", "met": False}],
                   "step_us": 19.1}}))
    md = results_markdown(tmp_path)
    assert "| ABA called from Python, per call | 5.2 us | 3.4 us (pin.aba from Python) | 0.654 | ratio >= 1 | **no** |" in md
    assert "| date_utc | 2026-12-02 15:00 UTC |" in md and "| versions.pin | 3.4.0 |" in md
    assert "| `step_us` | 19.1 |" in md and "`headline" not in md


def test_scenario_reference_lists_every_section_and_key():
    from hil.scenario import config
    from hil.docgen.config_ref import scenario_reference_markdown

    md = scenario_reference_markdown()
    for section in config.Scenario.model_fields:
        assert f"## {section}\n" in md, section
    for key, field in config.LoopSection.model_fields.items():
        assert f"| `{key}` |" in md, key
    assert "| `step_s` | float | **required** | > 0 |" in md
    assert '| `priority` | int \\| "auto" |' in md
    assert "### `[[modbus.map]]`" in md and "### `[safety.rollout.gates.<name>]`" in md
