"""The `hil` command: `hil run` here; other subcommands live in hil/commands/*.py.

Exit codes: 0 done, 1 the run failed (plant diverged), 2 bad configuration or usage, or the
run could not start (a port in use, a server that did not come up): nothing left running;
3 a state left its spec bounds with loop.on_state_out_of_bounds = "fail", 4 a required
helper process (Modbus/OPC UA server, recorder) died, 5-7 a plant watch with action "fail"
(the grid: blackout, unserved load, voltage collapse), 8 the safety process died (the run
stops) or hung with [safety] required = true (hil/loop/health.py EXIT_*).
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import sys

import click

from hil.errors import ConfigError


def _status_printer(console, runtime=None):
    """One live status line (stderr), rewritten in place on a terminal; with `runtime`, the
    scheduling it obtained (e.g. "FIFO 80 cpu 1") closes the line."""
    tty = console.is_terminal

    def show(status: dict) -> None:
        line = (
            f"t_sim {status['sim_time_s']:>10.1f} s  steps {status['steps']:>8d}  "
            f"wall {status['wall_time_s']:>7.1f} s  lateness p99 {status['lateness_p99_us']:>8.1f} us  "
            f"overruns {status['overruns']:>4d}  clipped {status['clipped_inputs']:>4d}  "
            f"writes {status['input_writes']:>6d}"
        ) + "".join(f"  ALARM {a}" for a in status.get("alarms", ()))
        sched = getattr(runtime, "scheduling", None)
        if sched and not sched.get("lockstep"):
            line += "  " + short_scheduling(sched)
        if tty:
            console.file.write("\r" + line)
            console.file.flush()
        else:
            console.file.write(line + "\n")

    return show


def short_scheduling(s: dict) -> str:
    """'FIFO 80 cpu 1' / 'normal cpu 0-1': the status line's scheduling tag."""
    pol = {"SCHED_FIFO": "FIFO", "SCHED_RR": "RR"}.get(s.get("policy", ""))
    head = f"{pol} {s.get('priority', 0)}" if pol else "normal"
    cpus = s.get("cpus") or []
    where = str(cpus[0]) if len(cpus) == 1 else (f"{cpus[0]}-{cpus[-1]}" if cpus else "?")
    return f"{head} cpu {where}"


def print_banner(console, scenario, runtime, sim_s: float, lockstep: bool) -> None:
    """What is about to run: duration (simulated and wall), servers, where the recording goes."""
    from hil.scenario.config import SERVER_KINDS
    from hil.scenario.durations import describe_run_time

    console.print(f"[bold]hil run[/bold] {scenario.name}: {describe_run_time(sim_s, scenario, lockstep)}")
    servers = [k for k in SERVER_KINDS if scenario.served(k) is not None] if runtime.start_servers else []
    if servers:
        console.print("  servers: " + ", ".join(f"{k} {getattr(scenario, k).host}:{getattr(scenario, k).port}"
                                                for k in servers))
    if runtime.run_dir_note:
        from rich.markup import escape

        console.print(f"  [yellow]warning:[/yellow] {escape(runtime.run_dir_note)}")
    for kind in scenario.switched_off():
        console.print(f"  {kind}: switched off (\\[{kind}] enabled = false): not started, nothing bound")
    if runtime.record_path is not None:
        from pathlib import Path

        console.print(f"  recording: {Path(runtime.record_path).resolve()}")
    else:
        console.print("  recording: off")


def print_scheduling(console):
    """Runtime.on_scheduled callback: the scheduling obtained, once, before the loop starts."""
    from hil.loop.rt import describe_scheduling

    def show(sched: dict, warnings: list) -> None:
        if sched.get("lockstep"):
            return
        console.print(f"  scheduling: {describe_scheduling(sched)}")
        for w in warnings:
            console.print(f"  [yellow]warning:[/yellow] {w}")

    return show


def print_summary(console, summary: dict) -> None:
    lat = summary.get("lateness_us", {})
    console.print(
        f"[bold]{summary['scenario']}[/bold] {summary['mode']}: {summary['state']} "
        f"({summary['stop_reason']}) after {summary['steps']} steps, "
        f"{summary['sim_time_s']:.1f} s simulated in {summary['wall_time_s']:.2f} s wall"
    )
    if summary["mode"] == "realtime":
        console.print(
            f"  lateness us: p50 {lat.get('p50', 0):.1f}  p99 {lat.get('p99', 0):.1f}  "
            f"p99.9 {lat.get('p999', 0):.1f}  max {lat.get('max', 0):.1f}; overruns {summary['overruns']}; "
            f"spin {100 * summary['spin_cpu_fraction']:.1f} % of a core"
        )
    console.print(
        f"  inputs: {summary['input_writes']} image writes, {summary['clipped_inputs']} clipped to bounds, "
        f"{summary['non_finite_inputs']} non-finite held, {summary['torn_input_reads']} torn reads skipped"
    )
    if summary.get("scheduling") and summary["mode"] == "realtime":
        from hil.loop.rt import describe_scheduling

        console.print(f"  scheduling: {describe_scheduling(summary['scheduling'])}")
    from adapters.process import counters_line

    for kind in ("modbus", "opcua", "iec104"):  # the protocol servers' final counters
        if summary.get(kind):
            console.print(f"  {kind}: {counters_line(kind, summary[kind])}", markup=False)
    for a in summary.get("alarms", []):
        console.print(f"  [red]alarm:[/red] {a['message']}")
    for w in summary.get("warnings", []):
        console.print(f"  [yellow]warning:[/yellow] {w}")
    if summary.get("error"):
        console.print(f"  [red]error:[/red] {summary['error']}")
    if summary.get("record_path"):
        console.print(f"  recording: {summary['record_path']}")


def parse_settings(settings) -> dict:
    """`a.b.c=value` strings (value a TOML literal) -> nested {a: {b: {c: value}}}."""
    import tomllib

    out: dict = {}
    for item in settings:
        key, sep, raw = item.partition("=")
        path = key.strip().split(".")
        if not sep or len(path) < 2 or not all(path):
            raise ConfigError(f"--set {item}", "expected SECTION.KEY=VALUE")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()  # a bare word: take it as a string
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


@click.group()
@click.version_option(package_name="hil")
def main() -> None:
    """hil: hardware-in-the-loop runtime for sim-to-real control."""


@main.command("run")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--duration", default=None, metavar="DURATION",
              help="Simulated time to run: 2h, 90min, 30s, 1d, or seconds (default: loop.duration_s).")
@click.option("--wall", default=None, metavar="DURATION",
              help="Wall-clock time to run instead (real time only): simulated = wall x loop.time_scale.")
@click.option("--lockstep", is_flag=True, help="No wall clock: as fast as possible, deterministic.")
@click.option("--record", "record_path", default=None,
              help="Recording directory, relative to the cwd (default: recording.path, relative to the scenario).")
@click.option("--no-record", is_flag=True, help="Do not record.")
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: the summary as one JSON object.")
@click.option("--quiet", is_flag=True, help="No live status line.")
@click.option("--set", "settings", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a scenario value (TOML literal), e.g. --set loop.time_scale=1000.")
@click.option("--dashboard", "dashboard", default=None, metavar="[HOST:]PORT",
              help="Serve the live dashboard (hil dashboard) beside the run, e.g. --dashboard 8050.")
@click.option("--dashboard-password-file", default=None, type=click.Path(dir_okay=False),
              help="Operator password for the dashboard (mode 0600); else $HIL_DASHBOARD_PASSWORD; none: read-only.")
def run_command(config, duration, wall, lockstep, record_path, no_record, as_json, quiet, settings,
                dashboard, dashboard_password_file) -> None:
    """Run the scenario CONFIG (a TOML file)."""
    from rich.console import Console

    from hil.scenario.config import load_scenario
    from hil.scenario.durations import run_duration
    from hil.runtime import Runtime

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        scenario = load_scenario(config, parse_settings(settings))
        sim_s = run_duration(scenario, duration=duration, wall=wall, lockstep=lockstep)
        check_scenario_ports(scenario, lockstep=lockstep, source=str(config))
        dash = _dashboard(dashboard, dashboard_password_file, config, err)
        runtime = Runtime(scenario, lockstep=lockstep, duration_s=sim_s,
                          record=False if no_record else None, record_path=record_path,
                          scenario_path=str(config))
    except ConfigError as exc:
        err.print(f"[red]config error[/red] {exc}")
        sys.exit(2)
    runtime.announce = True  # `hil dashboard SCENARIO` finds it (hil/live_runs.py)
    try:
        summary = run_runtime(runtime, err, scenario, sim_s, lockstep, quiet,
                              **({"on_started": lambda rt: dash.start(os.getpid())} if dash else {}))
    finally:
        if dash is not None:
            dash.stop()
    if not quiet and err.is_terminal:
        err.file.write("\n")
    print_summary(err, summary)
    if as_json:
        click.echo(json.dumps(summary, default=str))
    sys.exit(summary.get("exit_code", 0 if summary["state"] == "stopped" else 1))


def _dashboard(listen, password_file, config, err):
    """The dashboard process to start beside the run (None without --dashboard); its address is
    checked now, and its URL printed."""
    if listen is None:
        return None
    from hil.dashboard.auth import read_password
    from hil.dashboard.launch import DashboardProcess, check_listen

    url = check_listen(listen)
    login = "operator login enabled" if read_password(password_file) else "read-only (no password given)"
    err.print(f"  dashboard: [bold]{url}[/bold] ({login})")
    return DashboardProcess(str(config), listen, password_file)


def check_scenario_ports(scenario, *, lockstep: bool, servers: bool | None = None, source: str | None = None) -> None:
    """Every port the run will bind is free (hil.scenario.ports), before anything starts; ConfigError if not."""
    from hil.scenario import ports

    ports.check_ports(scenario, servers=(not lockstep) if servers is None else servers, source=source)


def run_runtime(runtime, err, scenario, sim_s: float, lockstep: bool, quiet: bool, **run_kwargs) -> dict:
    """Banner, run, summary dict. A run that cannot start (a server or the policy fails to come
    up) exits 2 with the reason, after Runtime.run has stopped whatever had started."""
    print_banner(err, scenario, runtime, sim_s, lockstep)
    runtime.on_scheduled = print_scheduling(err)
    try:
        with runtime:
            summary = runtime.run(None if quiet else _status_printer(err, runtime), **run_kwargs).as_dict()
        if summary.get("record_path"):
            from pathlib import Path

            summary["record_path"] = str(Path(summary["record_path"]).resolve())
        return summary
    except Exception as exc:  # noqa: BLE001  (before the loop started: report and exit, never a traceback)
        if runtime.state != "failed":
            raise
        err.print(f"[red]could not start[/red] {scenario.name}: {exc}; nothing left running")
        sys.exit(2)


def _register_commands() -> None:
    import hil.commands as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"hil.commands.{info.name}")
        command = getattr(module, "command", None)
        if isinstance(command, click.Command):
            main.add_command(command)


_register_commands()

if __name__ == "__main__":
    main()
