"""`hil grid n1 SCENARIO`: N-1 screening of a grid scenario's operating point (DC/LODF screen,
AC confirmation, plants/grid/n1.py); `hil grid ratings SCENARIO --out F.csv`: ratings under
which that point is N-1 secure (the case's own RATE_A where it has one), as a `ratings_csv`.

Exit codes of `hil grid n1`: 0 N-1 secure, 2 configuration error, 3 not N-1 secure."""

from __future__ import annotations

import json
import math
import sys

import click
import numpy as np

EXIT_INSECURE = 3


class _Failed(Exception):
    pass


def _scenario_plant(scenario_path: str):
    """(scenario, built grid plant) or exit 2 naming the problem."""
    from hil.errors import ConfigError
    from plants.base import PlantOptionError

    try:
        from hil.scenario.config import load_scenario

        sc = load_scenario(scenario_path)
        if sc.plant.model != "grid":
            raise ConfigError("plant.model", f"{sc.plant.model!r} is not the grid plant (hil grid needs model = \"grid\")")
        return sc, sc.plant.load()
    except (ConfigError, PlantOptionError, ValueError) as exc:
        click.echo(f"error: {scenario_path}: {exc}", err=True)
        sys.exit(2)


def initial_inputs(sc, spec) -> np.ndarray:
    """The plant's input vector at t = 0: nominal values, then each input's scenario entry
    (a fixed value, a profile's value at t = 0, or an initial `value`)."""
    from hil.scenario.signal_tables import expand_input_groups

    u = spec.nominal("inputs").copy()
    for name, inp in expand_input_groups(sc.inputs, spec).items():
        if not spec.has("inputs", name):
            continue
        v = inp.value
        if inp.driver == "profile" and inp.profile:
            at0 = [val for t, val in inp.profile if t <= 0.0]
            v = at0[-1] if at0 else v
        if v is not None:
            u[spec.index("inputs", name)] = float(v)
    return u


_SEVERITY = {"overload": 0, "load_loss": 1, "unconfirmed": 2, "radial": 3, "secure": 4, "screened": 5}


def _table(result, console, rows: int) -> None:
    """The confirmed outages, worst first (insecure, radial, then by AC loading); ``rows`` at most (0: all)."""
    from rich.table import Table

    listed = [o for o in result.outages if o.critical or o.flagged]
    shown = sorted(listed, key=lambda o: (_SEVERITY[o.verdict], -np.nan_to_num(o.ac_max_loading)))
    shown = shown[:rows] if rows > 0 else shown
    n_ac = sum(o.critical for o in result.outages)
    t = Table(title=f"N-1 {result.case_name}: {len(result.outages)} outages screened (DC), {n_ac} "
                    f"confirmed with AC, {len(shown)} shown")
    for col in ("line", "from-to", "base MW", "DC max %", "AC max %", "worst line", "unserved MW", "islands",
                "power flow", "verdict"):
        t.add_column(col, justify="right" if col not in ("verdict", "power flow") else "left")
    style = {"overload": "red", "load_loss": "red", "unconfirmed": "red", "radial": "yellow", "secure": "green"}
    for o in shown:
        dc = "islanding" if o.islanding else f"{100 * o.dc_max_loading:.1f}"
        ac = (f"{100 * o.ac_max_loading:.1f}", str(o.ac_worst_line), f"{o.unserved_mw:.1f}", str(o.islands)) \
            if o.critical else ("-", "-", "-", "-")
        t.add_row(str(o.line), f"{o.from_bus}-{o.to_bus}", f"{o.base_mw:.1f}", dc, *ac, o.pf_status or "-",
                  f"[{style.get(o.verdict, 'white')}]{o.verdict}[/]")
    console.print(t)


def _plot(result, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = np.array([o.line for o in result.outages])
    dc = np.array([o.dc_max_loading for o in result.outages]) * 100
    ac = np.array([o.ac_max_loading for o in result.outages]) * 100
    isl = np.array([o.islanding for o in result.outages])
    bad = np.array([o.verdict in ("overload", "load_loss") for o in result.outages])
    ac = np.where([o.critical for o in result.outages], ac, np.nan)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    ax.bar(lines, np.nan_to_num(dc), color="0.75", label="DC screen (LODF): largest post-outage loading")
    radial = np.array([o.verdict == "radial" for o in result.outages])
    ok = ~bad & ~radial
    ax.scatter(lines[ok], ac[ok], s=14, color="tab:green", label="AC confirmed, secure", zorder=3)
    if radial.any():
        ax.scatter(lines[radial], ac[radial], s=18, color="gold", edgecolors="k", linewidths=0.5,
                   label="AC confirmed, radial load loss", zorder=3)
    ax.scatter(lines[bad], ac[bad], s=18, color="tab:red", label="AC confirmed, insecure", zorder=3)
    top = np.nanmax(np.r_[dc, ac, 110.0])
    for x in lines[isl]:
        ax.axvline(x, color="tab:orange", lw=0.6, alpha=0.6)
    ax.axhline(100 * result.limit_loading, color="k", lw=1, ls="--", label="rating")
    ax.axhline(100 * result.screen_loading, color="0.4", lw=0.8, ls=":", label="screening threshold")
    ax.plot([], [], color="tab:orange", lw=0.6, label="islanding outage")
    ax.set_xlim(0, len(lines) + 1 if lines.size == 0 else lines.max() + 1)
    ax.set_ylim(0, 1.05 * top)
    ax.set_xlabel("outaged branch (1-based row)")
    ax.set_ylabel("largest loading of another line (%)")
    verdict = "N-1 secure" if result.secure else f"not N-1 secure ({len(result.insecure)} outages)"
    ax.set_title(f"{result.case_name}: {verdict}")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.group("grid")
def command() -> None:
    """Tools for grid scenarios (plant model "grid")."""


@command.command("n1")
@click.argument("scenario", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False), help="PNG of every outage.")
@click.option("--confirm", type=click.Choice(["critical", "all", "none"]), default="critical", show_default=True,
              help="Which outages get the AC power flow: the ones the DC screen flags, all, or none.")
@click.option("--screen-loading", type=float, default=0.9, show_default=True,
              help="DC screen: an outage is critical above this fraction of a rating.")
@click.option("--limit-loading", type=float, default=1.0, show_default=True,
              help="AC verdict: a line above this fraction of its rating is an overload.")
@click.option("--radial-is-insecure", is_flag=True,
              help="Count load cut off by a radial branch as insecure (default: reported as 'radial').")
@click.option("--rows", type=int, default=30, show_default=True, help="Table rows, worst first (0: all).")
def n1(scenario, as_json, plot_path, confirm, screen_loading, limit_loading, radial_is_insecure, rows) -> None:
    """Screen every single-branch outage of SCENARIO's operating point (t = 0); exit 3 if not N-1 secure."""
    from rich.console import Console

    from plants.grid.n1 import operating_point, screen

    sc, plant = _scenario_plant(scenario)
    try:
        model = operating_point(plant, initial_inputs(sc, plant.spec))
        result = screen(model, screen_loading=screen_loading, limit_loading=limit_loading, confirm=confirm,
                        radial_is_insecure=radial_is_insecure, case_name=sc.name)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if plot_path:
        _plot(result, plot_path)
    if as_json:
        click.echo(json.dumps(_finite(result.to_dict())))
    else:
        console = Console(width=None if sys.stdout.isatty() else 140)
        _table(result, console, rows)
        if result.secure:
            console.print(f"[green]N-1 secure[/]: {len(result.outages)} outages, "
                          f"{sum(o.verdict == 'radial' for o in result.outages)} radial load loss(es)")
        else:
            console.print(f"[red]not N-1 secure[/]: lines {', '.join(str(o.line) for o in result.insecure)}")
    sys.exit(0 if result.secure else EXIT_INSECURE)


def _finite(obj):
    """JSON-safe: nan -> None (JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


@command.command("ratings")
@click.argument("scenario", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="CSV line,rating_mva.")
@click.option("--margin", type=float, default=1.2, show_default=True,
              help="rating = margin x the largest current in the base case and every single outage.")
@click.option("--floor-mva", type=float, default=100.0, show_default=True, help="No derived rating below this.")
def ratings(scenario, out_path, margin, floor_mva) -> None:
    """Write ratings under which SCENARIO's operating point is N-1 secure (a `ratings_csv`)."""
    from plants.grid.case_files import read_case
    from plants.grid.n1 import n1_ratings, operating_point

    sc, plant = _scenario_plant(scenario)
    try:
        model = operating_point(plant, initial_inputs(sc, plant.spec))
        rating, from_case = n1_ratings(model, read_case(sc.plant.options["case"]).rate_a_mva, margin, floor_mva)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    with open(out_path, "w") as fh:
        fh.write("line,rating_mva\n")
        for k, r in enumerate(rating, start=1):
            fh.write(f"{k},{math.ceil(10.0 * r) / 10.0:.1f}\n")  # rounded up: never below the rule
    click.echo(f"{out_path}: {len(rating)} ratings ({int(from_case.sum())} from the case, "
               f"{int((~from_case).sum())} derived: max({margin:g} x N-1 current, {floor_mva:g} MVA))")
