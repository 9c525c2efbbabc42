"""`hil shadow CONFIG --policy DIR [--version vN] [--duration 30min]`: a policy version proven in
HIL in shadow mode, with no copy of the scenario: the loop (lockstep, recorded), the policy and the
safety processes over the bus, the baseline ([safety.fallback]) acting and every proposal logged
beside it (hil.gym.deploy.shadow_run), then the comparison and the shadow gate's verdict.

Exit codes: 0 the shadow run completed and its report was printed (whatever the gate said), or
with --require-gate the shadow gate passed; 1 with --require-gate, the gate refused or gave no
verdict; 2 bad configuration or usage, or the run did not complete.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command("shadow")
@click.argument("config", type=click.Path(dir_okay=False, exists=True))
@click.option("--policy", "policy_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="A versioned policy directory (hil policy import / fit write one).")
@click.option("--version", default=None, help="Version to run (default: the newest).")
@click.option("--duration", default="30min", show_default=True, metavar="DURATION",
              help="Simulated time: 2h, 90min, 30s, or seconds.")
@click.option("--seed", type=int, default=None, help="loop.seed of the run (default: the scenario's).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Where the recording, decision log and safety status go (default: a new temporary directory).")
@click.option("--require-gate", is_flag=True, help="Exit 1 unless the shadow gate passed.")
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: the comparison as one JSON object.")
def command(config, policy_dir, version, duration, seed, out_dir, require_gate, as_json) -> None:
    """Run CONFIG in lockstep with a policy version in shadow mode; print how its proposals compare
    with the baseline's actions and the shadow gate's verdict."""
    from hil.scenario.config import load_scenario
    from hil.scenario.durations import parse_duration
    from hil.errors import ConfigError
    from hil.gym.deploy import print_comparison, shadow_run
    from hil.policy.store import PolicyStore

    try:
        sc = load_scenario(config)
        if sc.safety is None or sc.bus is None:
            raise ConfigError("safety", "the scenario has no [safety] / [bus] section: no shadow mode to run in")
        duration_s = parse_duration(duration, "--duration")
        versions = PolicyStore(policy_dir).versions()
        if not versions:
            raise ConfigError("--policy", f"{policy_dir} holds no policy version (v1, v2, ...)")
        version = version or versions[-1]
        if version not in versions:
            raise ConfigError("--version", f"{version!r} is not in {policy_dir} (versions: {', '.join(versions)})")
    except ConfigError as exc:
        click.echo(f"config error {exc}", err=True)
        sys.exit(2)
    click.echo(f"hil shadow {sc.name}: {policy_dir} {version}, {duration_s:g} s simulated, lockstep", err=True)
    try:
        res = shadow_run(config, policy_dir, version, duration_s=duration_s, seed=seed,
                         workdir=Path(out_dir) if out_dir else None)
    except (RuntimeError, ValueError) as exc:
        click.echo(f"shadow run failed: {exc}", err=True)
        sys.exit(2)
    print_comparison(res, click.echo)
    click.echo(f"  recording, decision log and safety status: {res['workdir']}")
    if as_json:
        click.echo(json.dumps(res["comparison"], default=str))
    sys.exit(1 if require_gate and res["comparison"]["shadow_gate"]["passed"] is not True else 0)
