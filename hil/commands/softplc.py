"""`hil softplc CONFIG`: run the scenario's SoftPLC against its Modbus server.

The server must already be serving (`hil run CONFIG` starts it with the loop). Exit
codes: 0 done, 1 never exchanged data with the server, 2 bad configuration.
"""

from __future__ import annotations

import json
import sys

import click


@click.command("softplc")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--duration", default=None, metavar="DURATION",
              help="Wall-clock time to run: 30s, 5min, ... or seconds (default: until Ctrl-C).")
@click.option("--record", "record_path", default=None, help="Scan log (.csv or .parquet; default softplc.record).")
@click.option("--host", default=None, help="Server host (default: softplc.host or modbus.host).")
@click.option("--port", type=int, default=None, help="Server port (default: softplc.port or modbus.port).")
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: the counters as one JSON object.")
@click.option("--quiet", is_flag=True, help="No live status line.")
def command(config, duration, record_path, host, port, as_json, quiet) -> None:
    """Run the [softplc] of CONFIG: scan cycle, PID loops, safe outputs on comm loss."""
    import logging

    from rich.console import Console

    from hil.scenario.config import load_scenario
    from hil.errors import ConfigError
    from hil.softplc import run_softplc

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    try:
        scenario = load_scenario(config)
        if scenario.softplc is None:
            raise ConfigError("softplc", "the scenario has no [softplc] section")
        if duration is not None:
            from hil.scenario.durations import parse_duration

            duration = parse_duration(duration, "--duration")
    except ConfigError as exc:
        err.print(f"[red]config error[/red] {exc}")
        sys.exit(2)

    every = max(1, int(round(500.0 / scenario.softplc.scan_ms)))  # ~2 status lines per s

    def status(plc) -> None:
        s = plc.stats
        if s.scans % every:
            return
        loops = "  ".join(
            f"{lp.name} {plc.meas.get(lp.meas_tag, float('nan')):.4g}/{lp.setpoint:.4g} "
            f"-> {plc.image.get(lp.out_tag, float('nan')):.4g}" for lp in plc.loops)
        line = (f"{s.state:<9} scans {s.scans:>7d}  overruns {s.overruns:>4d}  "
                f"comm errors {s.comm_errors:>4d}  {loops}")
        if err.is_terminal:
            err.file.write("\r" + line)
            err.file.flush()
        else:
            err.file.write(line + "\n")

    stats = run_softplc(scenario, duration, record_path=record_path, host=host, port=port,
                        on_scan=None if quiet else status)
    if not quiet and err.is_terminal:
        err.file.write("\n")
    err.print(f"softplc: {stats['scans']} scans ({stats['good_scans']} good), {stats['overruns']} overruns, "
              f"{stats['comm_errors']} comm errors, {stats['comm_losses']} comm losses, "
              f"{stats['write_rejections']} rejected writes; max scan {stats['max_scan_ms']:.1f} ms")
    if stats.get("record_path"):
        err.print(f"  scan log: {stats['record_path']}")
    if as_json:
        click.echo(json.dumps(stats, default=str))
    sys.exit(0 if stats["good_scans"] else 1)
