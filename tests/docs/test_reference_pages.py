"""The generated reference pages (CLI, exit codes, recording columns) come from the code: every
command, option, exit constant and recording column appears, a command or constant added to the
code appears without editing the docs, and the pages' sources hold only the generation marker
and an introduction (nothing hand-copied). tests/docs/test_site.py checks the built site."""
from __future__ import annotations

from pathlib import Path

import click
import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def test_every_command_and_option_is_in_the_cli_reference():
    from hil.cli import main
    from hil.docgen.cli_ref import cli_reference_markdown, walk

    md = cli_reference_markdown()
    paths = [p for p, _ in walk(main)]
    assert {"hil run", "hil demo", "hil policy import", "hil policy check", "hil campaign run",
            "hil safety promote"} <= set(paths)
    for path, cmd in walk(main):
        assert f"`{path}`\n" in md, path
        assert f"Usage: {path} " in md, path
        section = md.split(f"`{path}`\n", 1)[1].split("\n#", 1)[0]  # up to the next command's heading
        for p in cmd.params:
            if isinstance(p, click.Option):
                assert f"| `{p.opts[0]}`" in section, (path, p.opts[0])
            elif isinstance(p, click.Argument):
                assert f"`{p.human_readable_name}`" in section, (path, p.name)
    run = md.split("### `hil run`\n", 1)[1].split("\n### ", 1)[0]
    assert "| `--lockstep` | flag | off | No wall clock: as fast as possible, deterministic. |" in run
    assert "`--set` `SECTION.KEY=VALUE` | text |  | Override a scenario value" in run and "(repeatable)" in run
    imp = md.split("#### `hil policy import`\n", 1)[1].split("\n#### ", 1)[0]
    assert "| `--out` | path | **required** |" in imp and "| `--rollout-steps` | integer | `2000` |" in imp
    assert "Arguments: `MODEL`, `CONFIG`." in imp


def test_a_new_command_appears_without_editing_the_docs():
    from hil.docgen.cli_ref import cli_reference_markdown

    @click.group()
    def tool():
        """A tool."""

    @tool.command("frobnicate")
    @click.argument("target")
    @click.option("--speed-hz", type=float, default=2.5, help="How fast, in Hz.")
    @click.option("--mode", type=click.Choice(["a", "b"]), required=True)
    def frob(target, speed_hz, mode):
        """Frobnicate TARGET."""

    md = cli_reference_markdown(tool)
    assert "### `hil frobnicate`" in md and "Frobnicate TARGET." in md
    assert "| `--speed-hz` | float | `2.5` | How fast, in Hz. |" in md
    assert "| `--mode` | `a` \\| `b` | **required** |" in md
    assert "[`hil frobnicate`](#hil-frobnicate)" in md


def _prose(page: str) -> str:
    return (ROOT / "docs" / "reference" / page).read_text()


def test_reference_sources_hold_only_the_marker():
    """Nothing hand-copied: no option table, no exit-code row, no column list in the sources."""
    for page, marker in (("cli.md", "cli-reference"), ("exit-codes.md", "exit-codes"),
                         ("recording.md", "recording-columns")):
        text = _prose(page)
        assert text.count(f"<!-- generated: {marker} -->") == 1, page
        assert "| ---" not in text and "Usage:" not in text, page
    assert "--rollout-steps" not in _prose("cli.md") and "EXIT_DIVERGED" not in _prose("exit-codes.md")
    assert "meas." not in _prose("recording.md")


def test_exit_codes_come_from_the_constants_and_docstrings(tmp_path):
    from hil.loop import health
    from hil.docgen.exit_codes import command_codes, constants, docstring_exit_paragraph, exit_codes_markdown

    md = exit_codes_markdown()
    for name in dir(health):
        if name.startswith("EXIT_"):
            assert f"| {getattr(health, name)} | `hil.loop.health.{name}` |" in md, name
    assert "| 5 | `plants.grid.plant.EXIT_BLACKOUT` | blackout (`[plant] on_blackout`:" in md
    assert "| `hil campaign` | 0 every criterion held" in md and "3 it cannot compare" in md
    assert "| `hil softplc` | 0 done, 1 never exchanged data with the server" in md
    assert "`hil safety promote`: exit 1 if refused." in md  # a subcommand's code, from its help
    assert {c for c, _ in command_codes()} >= {"hil campaign", "hil bench", "hil policy", "hil safety"}
    f = tmp_path / "m.py"
    f.write_text("X = 1\n# a comment\nEXIT_NEW_THING = 42  # it broke\nEXIT_OTHER = 9\n")
    assert constants(f) == [(42, "EXIT_NEW_THING", "it broke"), (9, "EXIT_OTHER", "")]
    assert docstring_exit_paragraph("Title.\n\nSome text. Exit\ncodes: 0 ok, 1 bad.\n\nMore.") == "0 ok, 1 bad."
    assert docstring_exit_paragraph("No codes here.") == ""


def test_recording_columns_are_the_recorders():
    from hil.scenario.config import load_scenario
    from hil.docgen.recording_ref import columns_table, recording_reference_markdown
    from hil.recorder import columns_for

    cfg = ROOT / "configs" / "bioreactor.toml"
    spec = load_scenario(cfg).plant.load().spec
    table = columns_table(spec)
    cols = columns_for(spec)
    rows = [line.split("|")[1].strip().strip("`") for line in table.splitlines()[2:]]
    assert rows == cols  # every column, in row order, nothing else
    q = spec.quantity("outputs", "dissolved_oxygen")
    assert f"| `meas.dissolved_oxygen` | {q.unit} | measured output" in table
    assert "| `t_s` | | every plant: simulated s at the end of the step |" in table
    md = recording_reference_markdown([cfg])
    assert f"{len(cols)} columns." in md and "cmd.&lt;input> (commanded)" in md


def test_array_groups_are_one_row_each():
    from hil.docgen.recording_ref import columns_table
    from hil.recorder import columns_for
    from plants.spec import Quantity, SpecBuilder

    b = SpecBuilder("arr")
    b.scalar("states", Quantity("level", "m", 1.0, 0.0, 2.0, "tank level"))
    b.scalar("inputs", Quantity("valve", "1", 0.5, 0.0, 1.0, "valve opening"))
    b.array("outputs", "node.temp", [f"node_{i}.temp" for i in range(5)], unit="K", nominal=np.full(5, 300.0),
            low=np.zeros(5), high=np.full(5, 500.0), description="node temperature")
    b.scalar("outputs", Quantity("flow", "L/h", 1.0, 0.0, 9.0, "outflow"))
    spec = b.build()
    table = columns_table(spec)
    assert "| `y.node_0.temp` ... `y.node_4.temp` (5 columns, group `node.temp`) | K | true output: node temperature |" \
        in table
    assert "| `meas.flow` | L/h |" in table and table.count("node_") == 4  # two rows (y, meas), two names each
    assert len(columns_for(spec)) == 4 + 2 + 1 + 12
