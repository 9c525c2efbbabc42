"""`hil tags SCENARIO --format csv|json [--out FILE]`: the Modbus register map, the OPC UA
node list and the IEC 104 information objects of a scenario (hil/tagmap/export.py), for a SCADA
engineer's import."""

from __future__ import annotations

import json
import math
import sys

import click


def _json_safe(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


@click.command("tags")
@click.argument("scenario", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False), help="File (default: stdout).")
@click.option("--protocol", type=click.Choice(["all", "modbus", "opcua", "iec104"]), default="all", show_default=True)
def command(scenario, fmt, out_path, protocol) -> None:
    """Export SCENARIO's Modbus map, OPC UA nodes and IEC 104 objects: address, type, word order, scale, unit,
    range, writable."""
    from hil.scenario.config import load_scenario
    from hil.errors import ConfigError
    from hil.tagmap.export import PROTOCOLS, header, tag_rows, to_csv
    from plants.base import PlantOptionError

    try:
        sc = load_scenario(scenario)
        spec = sc.plant.load().spec
        protocols = PROTOCOLS if protocol == "all" else (protocol,)
        rows = tag_rows(sc, spec, protocols)
    except (ConfigError, PlantOptionError, ValueError) as exc:
        click.echo(f"error: {scenario}: {exc}", err=True)
        sys.exit(2)
    if not rows:
        click.echo(f"error: {scenario}: no [modbus], [opcua] or [iec104] section: nothing to export", err=True)
        sys.exit(2)
    if fmt == "csv":
        text = to_csv(rows)
    else:
        text = json.dumps({**header(sc), "tags": [{k: _json_safe(v) for k, v in r.items()} for r in rows]},
                          indent=1) + "\n"
    if out_path:
        with open(out_path, "w") as fh:
            fh.write(text)
        click.echo(f"{out_path}: {len(rows)} tags", err=True)
    else:
        click.echo(text, nl=False)
