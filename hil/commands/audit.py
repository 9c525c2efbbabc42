"""`hil audit PROJECT_DIR_OR_MANIFEST`: the reality-gap diagnostic from evidence on disk
(hil/calibration/audit.py), in the terminal and as Markdown / HTML."""

from __future__ import annotations

import click


@click.command("audit")
@click.argument("target", type=click.Path(exists=True))
@click.option("--md", "md_out", default=None, type=click.Path(dir_okay=False), help="Markdown file to write.")
@click.option("--html", "html_out", default=None, type=click.Path(dir_okay=False), help="HTML file to write.")
@click.option("--json", "as_json", is_flag=True, help="Print the cells as JSON.")
def command(target, md_out, html_out, as_json) -> None:
    """Fill the playbook's reality-gap table from fits, profiles, recordings and campaigns."""
    import json
    from dataclasses import asdict
    from pathlib import Path

    from hil.calibration.audit import audit, html, markdown

    cells = audit(target)
    if md_out:
        Path(md_out).write_text(markdown(cells))
    if html_out:
        Path(html_out).write_text(html(cells))
    if as_json:
        click.echo(json.dumps([asdict(c) for c in cells]))
        return
    colors = {"green": "green", "amber": "yellow", "red": "red", "n/a": "white"}
    for c in cells:
        click.echo(click.style(f"{c.gap:18s} {c.status:6s}", fg=colors[c.status]) + "  " + "; ".join(c.evidence))
        click.echo(f"{'':25s} next: {c.next_step}")
