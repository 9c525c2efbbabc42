"""`hil plot RECORDING`: a PNG of a recording's signals (true vs measured, setpoints)."""

from __future__ import annotations

import click


@click.command("plot")
@click.argument("recording", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", default=None, help="PNG path (default: RECORDING/plot.png).")
@click.option("--signals", default=None, help="Comma-separated outputs/inputs (default: every output).")
@click.option("--setpoint", "setpoints", multiple=True, metavar="SIGNAL=VALUE", help="Dashed setpoint line.")
def command(recording, output, signals, setpoints) -> None:
    """Plot RECORDING (a directory written by `hil run`)."""
    from hil.plot import plot_recording

    sp = {}
    for item in setpoints:
        name, _, value = item.partition("=")
        sp[name] = float(value)
    out = plot_recording(recording, output, signals.split(",") if signals else None, sp)
    click.echo(str(out))
