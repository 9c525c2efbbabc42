"""`hil dashboard RUN_DIR|SCENARIO`: a live web view of a running run (hil/dashboard/)."""

from __future__ import annotations

import os
import sys
import time

import click


def _find(target: str, pid: int | None):
    """(finder, what): a callable returning the live entry the target names, and its description."""
    from hil import live_runs

    if pid is not None:  # `hil run --dashboard`: exactly that loop, whatever --set changed
        return (lambda: live_runs.find(pid=pid)), f"the run of loop process {pid}"
    if os.path.isdir(target):
        return (lambda: live_runs.find(record_dir=target, pid=pid)), f"a run recording into {target}"
    from hil.scenario.config import load_scenario

    name = load_scenario(target).name
    return (lambda: live_runs.find(scenario_name=name, pid=pid)), f"a run of scenario {name!r}"


@click.command("dashboard")
@click.argument("target", type=click.Path(exists=True))
@click.option("--listen", default="127.0.0.1:8050", show_default=True, metavar="[HOST:]PORT",
              help="Where to serve the page (loopback unless --allow-remote).")
@click.option("--password-file", default=None, type=click.Path(dir_okay=False),
              help="Operator password (file mode 0600); else $HIL_DASHBOARD_PASSWORD; none: read-only.")
@click.option("--signal", "signals", multiple=True, metavar="NAME",
              help="Also plot this output/input (or array group); repeatable.")
@click.option("--rate", "rate_hz", type=float, default=10.0, show_default=True,
              help="Frames per second sent to the page (at most 50).")
@click.option("--wait", "wait_s", type=float, default=0.0, show_default=True,
              help="Seconds to wait for the run to start (0: it must be running).")
@click.option("--pid", type=int, default=None, help="Attach to the run of this loop process only.")
@click.option("--allow-remote", is_flag=True, help="Allow a non-loopback --listen address (plain HTTP).")
def command(target, listen, password_file, signals, rate_hz, wait_s, pid, allow_remote) -> None:
    """Serve live plots, lateness, alarms, safety mode and decisions of a running run.

    TARGET is the scenario file of the run (found as `hil safety status` finds it), the
    run's recording directory, or the output directory of `hil campaign run` (its progress). Read-only unless an operator password is given; then
    promote, demote, rollback and acknowledge go to the safety process, signed.
    """
    from hil.dashboard.auth import read_password
    from hil.dashboard.layout import UnknownSignal
    from hil.dashboard.serve import serve
    from hil.errors import ConfigError

    try:
        password = read_password(password_file)
        from hil.dashboard.campaign import is_campaign_dir

        if os.path.isdir(target) and is_campaign_dir(target):
            serve(None, listen=listen, rate_hz=rate_hz, allow_remote=allow_remote, campaign_dir=target)
            return
        finder, what = _find(target, pid)
        deadline = time.monotonic() + max(0.0, wait_s)
        entry = finder()
        while entry is None and time.monotonic() < deadline:
            time.sleep(0.2)
            entry = finder()
        if entry is None:
            raise ConfigError("TARGET", f"no live run found: {what} (start it with `hil run`; "
                              "runs of this user only; --wait N waits N s)")
        serve(entry, listen=listen, password=password, chosen=list(signals), rate_hz=rate_hz,
              allow_remote=allow_remote, finder=None if pid is not None else finder)
    except (ConfigError, UnknownSignal) as exc:
        click.echo(f"config error {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        pass
