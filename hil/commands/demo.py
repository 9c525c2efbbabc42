"""`hil demo`: the whole hardware-in-the-loop chain on one machine, no hardware.

loop (bioreactor, real time, faster than real time as the scenario says)
  + Modbus TCP and OPC UA servers in their own processes on 127.0.0.1
  + the SoftPLC in its own process: a Modbus master scanning every 100 ms, four PID loops
  + the live dashboard in its own process (hil/dashboard/), its URL printed first
for about 60 s of wall time with a live status line, then a plot (PNG) of the main
signals with the setpoints, the recording and the SoftPLC's scan log.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from datetime import datetime, timezone
from pathlib import Path

import click

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "bioreactor_plc.toml"
PLOTTED = ["dissolved_oxygen", "agitation_power", "glucose", "feed_rate", "ph", "base_flow", "temperature",
           "coolant_flow", "biomass"]


def _softplc_main(scenario, stop, record_path: str, results) -> None:
    from hil.loop.rt import set_normal
    from hil.softplc import run_softplc

    set_normal()
    stats = run_softplc(scenario, None, stop, record_path=record_path)
    results.put(stats)


@click.command("demo")
@click.argument("config", required=False, type=click.Path(dir_okay=False), default=str(DEFAULT_CONFIG))
@click.option("--wall", "wall", default="60s", show_default=True, metavar="DURATION",
              help="Wall-clock time to run: 60s, 2min, ... (a plain number is seconds).")
@click.option("--out", "out_dir", default=None, help="Output directory (default: runs/demo-<time>).")
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: the summary as one JSON object.")
@click.option("--set", "settings", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a scenario value (TOML literal), e.g. --set modbus.port=5021.")
@click.option("--dashboard", "dashboard", default=None, metavar="[HOST:]PORT",
              help="Where the live dashboard listens (default 127.0.0.1:8050, another free port if that is taken).")
@click.option("--no-dashboard", is_flag=True, help="Do not start the live dashboard.")
def command(config, wall, out_dir, as_json, settings, dashboard, no_dashboard) -> None:
    """Run loop + Modbus/OPC UA servers + SoftPLC in closed loop, then plot."""
    import json

    from rich.console import Console

    from hil.cli import _status_printer, check_scenario_ports, parse_settings, print_scheduling, print_summary
    from hil.scenario.config import load_scenario
    from hil.scenario.durations import run_duration
    from hil.errors import ConfigError
    from hil.plot import plot_recording
    from hil.runtime import Runtime

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        scenario = load_scenario(config, parse_settings(settings))
        if scenario.softplc is None or scenario.served("modbus") is None:
            raise ConfigError("softplc", "the demo needs a scenario with [modbus] (enabled) and [softplc]")
        sim_s = run_duration(scenario, duration=None, wall=wall, lockstep=False)
        wall_s = sim_s / scenario.loop.time_scale
        check_scenario_ports(scenario, lockstep=False, servers=True, source=str(config))
        dash, dash_url = (None, None) if no_dashboard else _dashboard(config, dashboard)
    except ConfigError as exc:
        err.print(f"[red]config error[/red] {exc}")
        sys.exit(2)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    out = Path(out_dir or f"runs/demo-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    servers = [k for k in ("modbus", "opcua") if scenario.served(k) is not None]
    err.print(f"[bold]hil demo[/bold]: {scenario.name}, {sim_s / 3600:.2f} h simulated in {wall_s:g} s "
              f"({scenario.loop.time_scale:g}x), servers: "
              + ", ".join(f"{k} {getattr(scenario, k).host}:{getattr(scenario, k).port}" for k in servers)
              + f", SoftPLC scan {scenario.softplc.scan_ms:g} ms")
    if dash_url:
        err.print(f"  dashboard: [bold]{dash_url}[/bold] (read-only; live while the demo runs)")
    ctx = mp.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    scan_log = str(out / "softplc-scan.csv")
    plc = ctx.Process(target=_softplc_main, args=(scenario, stop, scan_log, results), name="hil-softplc")

    def start_plc(_runtime) -> None:
        plc.start()
        if dash is not None:
            import os

            dash.start(os.getpid())

    def stop_plc(_runtime) -> None:
        stop.set()  # before the servers stop, so the PLC does not see a comm loss
        if plc.pid is not None:
            plc.join(10)

    runtime = Runtime(scenario, duration_s=sim_s, record_path=str(out / "plant"), start_servers=True,
                      scenario_path=str(config))
    runtime.announce = True  # the dashboard (and `hil dashboard`) find the run (hil/live_runs.py)
    err.print(f"  recording: {(out / 'plant').resolve()}")
    runtime.on_scheduled = print_scheduling(err)
    try:
        with runtime:
            summary = runtime.run(_status_printer(err, runtime), on_started=start_plc, on_stopping=stop_plc).as_dict()
    except Exception as exc:  # noqa: BLE001  (failed before the loop started: say why, nothing left running)
        if runtime.state != "failed":
            raise
        err.print(f"[red]could not start[/red] the demo: {exc}; nothing left running")
        try:
            out.rmdir()  # only if we left it empty
        except OSError:
            pass
        sys.exit(2)
    finally:
        if dash is not None:
            dash.stop()
        stop.set()
        plc_stats = results.get(timeout=30) if plc.pid is not None and plc.exitcode in (None, 0) else {}
        if plc.pid is not None:
            plc.join(10)
            if plc.is_alive():
                plc.kill()
    if err.is_terminal:
        err.file.write("\n")
    print_summary(err, summary)
    setpoints = {lp.measurement: lp.setpoint for lp in scenario.softplc.loops}
    png = plot_recording(out / "plant", out / "demo.png", PLOTTED, setpoints,
                         title=f"hil demo: {scenario.name} under SoftPLC control ({scenario.loop.time_scale:g}x real time)")
    err.print(f"  SoftPLC: {plc_stats.get('scans', 0)} scans, {plc_stats.get('overruns', 0)} overruns, "
              f"{plc_stats.get('comm_errors', 0)} comm errors, {plc_stats.get('comm_losses', 0)} comm losses")
    err.print(f"  scan log: {plc_stats.get('record_path', scan_log)}")
    err.print(f"  plot: [bold]{png}[/bold]")
    summary.update(plot_path=str(png), softplc=plc_stats, out_dir=str(out), dashboard_url=dash_url)
    if as_json:
        click.echo(json.dumps(summary, default=str))
    sys.exit(summary.get("exit_code", 0 if summary["state"] == "stopped" else 1))


def _dashboard(config, listen):
    """(DashboardProcess, URL) for the demo: `listen` as given, else 127.0.0.1:8050, else (that
    port taken, e.g. by another demo) a free loopback port. ConfigError if `listen` is unusable."""
    from hil.dashboard.launch import DashboardProcess, check_listen
    from hil.errors import ConfigError

    if listen is None:
        try:
            url = check_listen("127.0.0.1:8050")
        except ConfigError:
            url = check_listen("127.0.0.1:0")
    else:
        url = check_listen(listen)
    port = url.rstrip("/").rsplit(":", 1)[1]
    host = url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")
    return DashboardProcess(str(config), f"{host}:{port}"), url
