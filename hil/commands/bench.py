"""`hil bench modbus HOST:PORT` / `hil bench opcua URL`: latency of a real endpoint, at a bounded
request rate; writes a report (JSON) and a latency profile the latency gap replays
(`[gaps.latency.*] dist = "profile", file = ..., series = "<name>.rtt_1"`). See hil/campaign/bench.py.

Exit codes: 0 measured, 1 every request failed, 2 bad usage or the endpoint cannot be reached.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.group("bench")
def command() -> None:
    """Measure a real Modbus TCP or OPC UA endpoint (round trip, block reads, subscriptions)."""


def _common(f):
    f = click.option("--rate", "rate_hz", type=float, default=50.0, show_default=True,
                     help="Requests per second at most (absolute deadlines; never bursts).")(f)
    f = click.option("--requests", type=int, default=500, show_default=True,
                     help="Request pairs (1 + N values) to send.")(f)
    f = click.option("--count", type=int, default=10, show_default=True, help="Values per block read (N).")(f)
    f = click.option("--out", "out_dir", default="bench", show_default=True,
                     help="Directory for report.json and profile.json.")(f)
    f = click.option("--name", default=None, help="Series name prefix in the profile (default: the kind).")(f)
    f = click.option("--time-scale", type=float, default=1.0, show_default=True,
                     help="Simulated seconds per measured second in the profile.")(f)
    return click.option("--json", "as_json", is_flag=True, help="Last stdout line: the report's stats as JSON.")(f)


def _finish(report: dict, out_dir: str, time_scale: float, as_json: bool) -> None:
    from rich.console import Console

    from hil.campaign.bench import to_profile
    from hil.gaps.profile import save_profile

    err = Console(stderr=True, highlight=False)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    ok = any(len(v) for v in report["series_s"].values())
    if ok:
        save_profile(to_profile(report, time_scale), out / "profile.json")
    err.print(f"[bold]hil bench {report['kind']}[/bold] {report['endpoint']}: connect {report['connect_ms']:.2f} ms, "
              f"{report['requests']} x 2 requests at <= {report['rate_hz']:g}/s, skipped slots {report['skipped_slots']}, "
              f"errors {report['errors']}")
    for key, s in report["stats"].items():
        if s.get("n"):
            err.print(f"  {key:>13}: n {s['n']:>6}  p50 {s['p50_ms']:8.3f} ms  p99 {s['p99_ms']:8.3f} ms  "
                      f"max {s['max_ms']:8.3f} ms")
    err.print(f"  report: {out / 'report.json'}" + (f"; profile: {out / 'profile.json'}" if ok else ""))
    if as_json:
        click.echo(json.dumps({k: v for k, v in report.items() if k != "series_s"}))
    sys.exit(0 if ok else 1)


@command.command("modbus")
@click.argument("endpoint", metavar="HOST:PORT")
@click.option("--unit", type=int, default=1, show_default=True, help="Unit (device) id.")
@click.option("--table", type=click.Choice(["input", "holding"]), default="input", show_default=True,
              help="FC4 input or FC3 holding registers.")
@click.option("--address", type=int, default=0, show_default=True, help="First register (0-based).")
@_common
def modbus_cmd(endpoint, unit, table, address, rate_hz, requests, count, out_dir, name, time_scale, as_json) -> None:
    """Round trip (1 register) and block read (N registers) of a Modbus TCP server."""
    from hil.campaign.bench import modbus_bench

    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise click.BadParameter(f"{endpoint!r}: expected HOST:PORT", param_hint="HOST:PORT")
    try:
        report = modbus_bench(host, int(port), unit=unit, table=table, address=address, count=count,
                              rate_hz=rate_hz, requests=requests, name=name or "modbus")
    except (ConnectionError, ValueError) as exc:
        click.echo(f"hil bench modbus: {exc}", err=True)
        sys.exit(2)
    _finish(report, out_dir, time_scale, as_json)


@command.command("opcua")
@click.argument("url")
@click.option("--node", "nodes", multiple=True, help="Node id to read (repeat; default: the first N variables).")
@click.option("--publish-ms", type=float, default=100.0, show_default=True, help="Subscription publishing interval.")
@click.option("--subscribe-s", type=float, default=5.0, show_default=True, help="How long to watch the subscription.")
@_common
def opcua_cmd(url, nodes, publish_ms, subscribe_s, rate_hz, requests, count, out_dir, name, time_scale,
              as_json) -> None:
    """Read round trip (1 node), block read (N nodes) and subscription delivery of an OPC UA server."""
    from hil.campaign.bench import opcua_bench

    try:
        report = opcua_bench(url, nodes=list(nodes) or None, count=count, rate_hz=rate_hz, requests=requests,
                             publish_ms=publish_ms, subscribe_s=subscribe_s, name=name or "opcua")
    except (OSError, ValueError, TimeoutError) as exc:
        click.echo(f"hil bench opcua: {type(exc).__name__}: {exc}", err=True)
        sys.exit(2)
    _finish(report, out_dir, time_scale, as_json)
