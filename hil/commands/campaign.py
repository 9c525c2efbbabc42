"""`hil campaign run CAMPAIGN.toml` / `hil campaign replay RUN_ID` / `hil campaign report OUT`.

Exit codes: 0 every criterion held in every run, 1 a criterion failed (or a run could not run),
2 bad configuration or usage, 3 the campaign is INVALID: a known-bad canary run passed (or could not
run), so its criteria cannot be trusted, whatever the other runs say.
Replay: 0 the replay is bit for bit the original, 1 it differs, 2 usage, 3 it cannot compare (no
original result, or the original errored).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from hil.errors import ConfigError

EXIT_INVALID = 3
EXIT_CANNOT_COMPARE = 3


@click.group("campaign")
def command() -> None:
    """Fault-injection campaigns: scenarios x faults x seeds -> verdicts, JUnit and HTML."""


def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


@command.command("run")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", default=None, help="Output directory (default: [campaign].out).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--address", default=None, help="Ray cluster address (with --executor ray).")
@click.option("--workers", type=int, default=0, help="Local pool size (default: [campaign].workers or the CPUs).")
@click.option("--only", multiple=True, metavar="RUN_ID", help="Run only these runs.")
@click.option("--scenario", "scenarios", multiple=True, metavar="NAME",
              help="Run only this scenario's runs and canaries (repeatable; with --only: both must hold).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: the summary as one JSON object.")
@click.option("--dashboard", "dashboard", default=None, metavar="[HOST:]PORT",
              help="Serve the campaign's progress on the live dashboard (hil dashboard OUT_DIR) while it runs.")
def run_cmd(campaign_file, out_dir, executor, address, workers, only, scenarios, no_progress, as_json,
            dashboard) -> None:
    """Run CAMPAIGN_FILE (completed runs in the output directory are skipped)."""
    from hil.campaign.report import write_reports
    from hil.campaign.runner import run_campaign
    from hil.campaign.schema import load_campaign

    err = _console()
    try:
        c = load_campaign(campaign_file)
    except ConfigError as exc:
        err.print(f"[red]config error[/red] {exc}", markup=True)
        sys.exit(2)
    out = c.out_dir(out_dir)
    from hil.campaign.expand import expand

    if scenarios:  # the campaign narrowed to these scenarios (their runs and their canaries)
        unknown = sorted(set(scenarios) - {s.name for s in c.scenarios})
        if unknown:
            err.print(f"[red]usage[/red] --scenario {unknown[0]!r}: the campaign's scenarios are "
                      f"{', '.join(s.name for s in c.scenarios)}")
            sys.exit(2)
        c = c.model_copy(update={"scenarios": [s for s in c.scenarios if s.name in scenarios],
                                 "canaries": {k: v for k, v in c.canaries.items() if v.scenario in scenarios}})
    n = len(expand(c))
    err.print(f"[bold]hil campaign[/bold] {c.name}: {n} runs ({len(c.scenarios)} scenario(s) x faults x "
              f"{len(c.seed_list())} seeds), {c.campaign.mode}, executor {executor}; results in {out.resolve()}")
    dash = _start_dashboard(c, out, dashboard, err)
    try:
        results = run_campaign(c, out, executor=executor, workers=workers, address=address,
                               progress=not no_progress, console=err, only=list(only) or None)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/yellow]: workers stopped; run the same command again to resume")
        sys.exit(130)
    except RuntimeError as exc:
        err.print(f"[red]error[/red] {exc}")
        sys.exit(2)
    finally:
        if dash is not None:
            dash.stop()
    summary = write_reports(c, results, out)
    if not summary["valid"]:
        err.print(f"[bold white on red] {summary['invalid_reason']} [/bold white on red]")
    for name, s in summary["criteria"].items():
        color = "green" if s["passed"] == s["runs"] else "red"
        worst = f" (worst run {s['worst_run']})" if s.get("worst_run") else ""
        err.print(f"  [{color}]{name}[/{color}]: {s['sentence']}{worst}")
    err.print(f"  runs: {summary['passed_runs']}/{summary['runs']} passed; reports: {out / 'report.html'}, "
              f"{out / 'junit.xml'}")
    for name, s in summary["canaries"].items():
        ok = not (s["passed"] or s["not_run"])
        err.print(f"  canary [{'green' if ok else 'red'}]{name}[/]: failed as it must in {s['failed_as_expected']}/"
                  f"{s['runs']} run(s)" + (f"; caught by {', '.join(s['caught_by'])}" if s["caught_by"] else ""))
    if as_json:
        click.echo(json.dumps(summary, default=str))
    sys.exit(exit_code(summary))


def _start_dashboard(c, out, listen, err):
    """The dashboard process on the campaign's progress (None without --dashboard); exit 2 if
    its address cannot be used."""
    if listen is None:
        return None
    from hil.campaign.runner import save_campaign
    from hil.dashboard.launch import DashboardProcess, check_listen

    try:
        url = check_listen(listen)
    except ConfigError as exc:
        err.print(f"[red]config error[/red] {exc}", markup=True)
        sys.exit(2)
    save_campaign(c, out)  # the directory it watches exists from now on
    dash = DashboardProcess(str(out), listen)
    dash.start()
    err.print(f"  dashboard: [bold]{url}[/bold] (campaign progress, read-only)")
    return dash


def exit_code(summary: dict) -> int:
    if not summary.get("valid", True):
        return EXIT_INVALID
    return 0 if summary["passed_runs"] == summary["runs"] else 1


@command.command("replay")
@click.argument("run_id")
@click.option("--out", "out_dir", default=None, help="The campaign's output directory (holds campaign.json).")
@click.option("--campaign", "campaign_file", default=None, type=click.Path(dir_okay=False),
              help="The campaign file (its [campaign].out is the output directory).")
@click.option("--json", "as_json", is_flag=True)
def replay_cmd(run_id, out_dir, campaign_file, as_json) -> None:
    """Run RUN_ID again from its seed and compare its recording bit for bit with the original."""
    from hil.campaign.expand import find_run
    from hil.campaign.runner import read_campaign
    from hil.campaign.schema import load_campaign
    from hil.campaign.worker import execute_run, run_paths

    err = _console()
    if out_dir is None and campaign_file is None:
        err.print("[red]usage[/red]: give --out DIR or --campaign FILE")
        sys.exit(2)
    try:
        if out_dir is not None:
            out = Path(out_dir)
            c = read_campaign(out)
        else:
            c = load_campaign(campaign_file)
            out = c.out_dir()
        run = find_run(c, run_id)
    except ConfigError as exc:
        err.print(f"[red]config error[/red] {exc}")
        sys.exit(2)
    except (OSError, KeyError, ValueError) as exc:
        err.print(f"[red]error[/red] no run {run_id!r} in that campaign ({exc})")
        sys.exit(2)
    _, orig_path = run_paths(out, run_id)
    try:
        original = json.loads(orig_path.read_text()) if orig_path.exists() else None
    except ValueError:
        original = None
    if original is not None and original.get("verdict") == "error":
        original = None  # an error has no recording to compare with
    res = execute_run(c, run, out / "replay")
    from hil.campaign.paired import baseline_id, evaluate_pair, finalize

    bid = baseline_id(c, res["run"])
    base_path = run_paths(out, bid)[1] if bid else None
    base = json.loads(base_path.read_text()) if base_path is not None and base_path.exists() else None
    if bid == run_id:
        base = res
    finalize(c, res, evaluate_pair(c, res, base))  # paired criteria against the original baseline
    same = original is not None and res.get("digest") == original.get("digest")
    info = {"run_id": run_id, "verdict": res.get("verdict"), "failed": res.get("failed", []),
            "digest": res.get("digest"), "original_digest": (original or {}).get("digest"),
            "identical": same, "record_path": (res.get("summary") or {}).get("record_path")}
    if original is None:
        err.print(f"[red]{run_id}: replayed, but there is no original result to compare with[/red] "
                  f"({orig_path}): verdict {res.get('verdict')}; cannot tell whether it is the same")
    else:
        err.print(f"{run_id}: replay {'identical bit for bit' if same else 'DIFFERS from'} the original "
                  f"(digest {str(res.get('digest'))[:16]}); verdict {res.get('verdict')}"
                  + (f", failed: {', '.join(res['failed'])}" if res.get("failed") else ""))
    for name, cr in res.get("criteria", {}).items():
        err.print(f"  {name}: {cr['status']}  {cr.get('detail', '')}")
    if as_json:
        click.echo(json.dumps(info))
    sys.exit(EXIT_CANNOT_COMPARE if original is None else 0 if same else 1)


@command.command("report")
@click.argument("out_dir", type=click.Path(file_okay=False))
def report_cmd(out_dir) -> None:
    """Rewrite junit.xml, report.html and summary.json of OUT_DIR from its results."""
    from hil.campaign.expand import expand
    from hil.campaign.report import write_reports
    from hil.campaign.runner import load_results, read_campaign

    out = Path(out_dir)
    c = read_campaign(out)
    summary = write_reports(c, load_results(out, expand(c), include_errors=True), out)
    click.echo(json.dumps({k: summary[k] for k in ("runs", "passed_runs", "valid", "html", "junit")}))
    sys.exit(exit_code(summary))
