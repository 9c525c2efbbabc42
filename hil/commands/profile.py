"""`hil profile SOURCE -o profile.json`: a latency profile file for the latency gap.

SOURCE is one of:
- a recording directory (loop step intervals and lateness; plus per-client series from a
  Modbus request log _modbus_requests.jsonl/.parquet inside it);
- a Modbus request log (.jsonl / .parquet, adapters/modbus_log.py);
- with --latencies or --timestamps: a plain file of numbers (JSON list, or one per line /
  first CSV column) holding latencies, or event timestamps whose intervals are the series.

Measured wall-clock durations are multiplied by --time-scale to give simulated seconds (the
unit of the latency gap): use the time_scale the replaying scenario runs at relative to the
measured system (1 when the plant ran in real time). Format: hil/gaps/profile.py.
"""

from __future__ import annotations

import click


@click.command("profile")
@click.argument("source", type=click.Path(exists=True))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Profile JSON to write.")
@click.option("--latencies", "plain", flag_value="latencies",
              help="SOURCE is a plain list of latencies.")
@click.option("--timestamps", "plain", flag_value="timestamps",
              help="SOURCE is a plain list of event timestamps (intervals are the series).")
@click.option("--unit", type=click.Choice(["s", "ms", "us", "ns"]), default="s", show_default=True,
              help="Unit of the plain values.")
@click.option("--column", default=None, help="Column of a CSV plain file (default: the first).")
@click.option("--name", default=None, help="Series name for plain input.")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Simulated seconds per measured second.")
@click.option("--bins", type=int, default=0, show_default=True,
              help="Store histograms of this many bins instead of the samples (order is lost).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary of the series.")
def command(source, output, plain, unit, column, name, time_scale, bins, as_json) -> None:
    """Build a latency profile from a run (request log / recording) or from plain numbers."""
    import json

    import numpy as np

    from hil.gaps import measure, profile

    if time_scale <= 0 or bins < 0:
        raise click.BadParameter("--time-scale must be > 0 and --bins >= 0")
    try:
        if plain:
            values = measure.read_plain(source, column)
            values = values[np.isfinite(values)] * time_scale
            build = profile.from_latencies if plain == "latencies" else profile.from_timestamps
            prof = build(values, unit, name or ("latency" if plain == "latencies" else "interval"),
                         bins, source=f"{source} ({plain}, {unit}, x time_scale {time_scale:g})")
        else:
            prof = measure.profile_from_run(source, time_scale, bins)
        profile.save_profile(prof, output)
    except profile.ProfileError as exc:
        raise click.ClickException(str(exc)) from None
    summary = {k: v["stats"] for k, v in prof["series"].items()}
    if as_json:
        click.echo(json.dumps({"output": output, "series": summary}))
        return
    click.echo(f"{output}: {len(summary)} series")
    for k, s in summary.items():
        click.echo(f"  {k:40s} n={s['n']:<7d} mean={s['mean'] * 1e3:9.3f} ms  "
                   f"p50={s['p50'] * 1e3:9.3f} ms  p99={s['p99'] * 1e3:9.3f} ms")
