"""`hil sysid --scenario S.toml --data RUN... --params a,b --out fitted.toml`: calibrate a
plant on logs of the actual unit (hil/calibration/). Writes the fitted TOML (plant
parameters, intervals, identifiability, [gaps.sensors] noise profiles and
[gaps.randomize.plant] ranges from the run-to-run spread), residual plots next to it and,
with --residual-states, a residual model (.npz) with its held-out error report."""

from __future__ import annotations

import click


class BadInput(click.ClickException):
    """A bad scenario, column map or log: exit code 2, as every configuration error."""

    exit_code = 2


@click.command("sysid")
@click.option("--scenario", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Scenario TOML: plant, parameter overrides, initial state, fixed/profile inputs.")
@click.option("--data", "data", required=True, multiple=True, type=click.Path(exists=True),
              help="A run's log (CSV, Parquet or a hil recording directory); repeat per run.")
@click.option("--map", "column_map", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Column map TOML (hil/calibration/logs.py): columns, units, unlogged inputs.")
@click.option("--params", required=True, help="Comma-separated plant parameters to fit.")
@click.option("--init", "init_states", default="", help="Comma-separated initial states to fit per run.")
@click.option("--outputs", default=None, help="Comma-separated outputs to fit (default: every measured one).")
@click.option("--bias", "bias_outputs", default="", help="Comma-separated outputs whose sensor bias is fitted with the parameters.")
@click.option("--drift", "drift_outputs", default="",
              help="Comma-separated outputs whose sensor drift (per hour, from each run's start) is fitted with the "
                   "parameters; identifiable against reference columns (role = \"reference\").")
@click.option("--fit-lag", "lag_inputs", default="",
              help="Comma-separated inputs whose actuator lag (first-order time constant, s) is fitted with the "
                   "parameters, from the logged commands.")
@click.option("--noise-outputs", default=None, help="Outputs whose sensor gaps to fit (default: every measured one).")
@click.option("--shooting-h", type=float, default=None,
              help="Multiple-shooting segment length, hours of run time (default: single shooting).")
@click.option("--profile", "profile_param", default=None, help="Check this parameter's interval by profile likelihood.")
@click.option("--residual-states", default="", help="States a residual model corrects (fitted after the parameters).")
@click.option("--residual-features", default=None,
              help="x.<state>, u.<input>, e.<column> (a logged extra column's value), since.<signal> (time since "
                   "its last rising edge), trace.<signal>:<tau_s> (exp(-that time / tau)); default: every state "
                   "and input that moves. A model reading a column the loop lacks is reported, not written.")
@click.option("--holdout", "holdout", multiple=True, type=click.Path(exists=True),
              help="Held-out run(s) for the residual model's error report.")
@click.option("--world-model", "world_model", is_flag=True,
              help="Train a small world-model ensemble and compare it with the simulator on --holdout runs.")
@click.option("--horizon", type=int, default=60, show_default=True, help="World-model multi-step horizon, samples.")
@click.option("--unit", default="", help="Identifier of the physical unit the logs come from (read by hil audit).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Fitted TOML to write.")
@click.option("--no-plots", is_flag=True, help="Skip the residual plots.")
@click.option("--windows", type=int, default=6, show_default=True,
              help="Windows per run for the re-estimation of --params along each run (trend findings); 0: off.")
def command(scenario, data, column_map, params, init_states, outputs, bias_outputs, drift_outputs, lag_inputs,
            noise_outputs, shooting_h,
            profile_param, residual_states, residual_features, holdout, world_model, horizon, unit, out,
            no_plots, windows) -> None:
    """Fit plant parameters, noise profiles and spread to logs of the real unit."""
    from pathlib import Path

    from hil.calibration import logs, noise, report, sysid
    from hil.scenario.config import load_scenario
    from hil.errors import ConfigError
    from plants.base import load_plant_module

    try:
        sc = load_scenario(scenario)
        module = load_plant_module(sc.plant.model)
        spec = module.SPEC
        p0 = spec.nominal("params")
        for k, v in sc.plant.parameters.items():
            p0[spec.index("params", k)] = v
        x0 = spec.nominal("states")
        for k, v in sc.plant.initial_state.items():
            x0[spec.index("states", k)] = v
        cm = logs.ColumnMap.load(column_map, spec) if column_map else logs.ColumnMap()
        u0 = spec.nominal("inputs")
        logged = {c.signal for c in cm.columns if c.role == "input"}
        for name, inp in sc.inputs.items():  # unlogged inputs: the scenario's fixed values and profiles
            if name in logged or name in cm.fixed_inputs or name in cm.profile_inputs:
                continue
            if inp.driver == "profile" and inp.profile:
                cm.profile_inputs[name] = [tuple(x) for x in inp.profile]
            elif inp.value is not None:
                u0[spec.index("inputs", name)] = inp.value
        names = [p for p in params.split(",") if p]
        for n in names:
            spec.index("params", n)
        # every name checked before the (minutes-long) fit
        r_states = [_state_of(module, s, "--residual-states") for s in residual_states.split(",") if s]
        residual_states = ",".join(r_states)
        if residual_features:
            residual_features = ",".join(_feature_of(module, f) for f in residual_features.split(",") if f)
        for opt, names_, kind in (("--bias", bias_outputs, "outputs"), ("--drift", drift_outputs, "outputs"),
                                  ("--fit-lag", lag_inputs, "inputs")):
            for n in (x for x in names_.split(",") if x):
                if n not in spec.names(kind):
                    raise BadInput(f"{opt}: {n!r} is not an {kind[:-1]} of {spec.name} "
                                   f"({kind}: {', '.join(spec.names(kind))})")
        runs = logs.read_runs(data, spec, cm, u0)
        if residual_features:
            from hil.calibration.residual_fit import check_extra_features

            check_extra_features(spec, runs, residual_features.split(","))
        problem = sysid.SysIdProblem(module, runs, names, base_params=p0, x0=x0,
                                     init_states=[s for s in init_states.split(",") if s],
                                     outputs=outputs.split(",") if outputs else None,
                                     bias_outputs=[b for b in bias_outputs.split(",") if b],
                                     drift_outputs=[b for b in drift_outputs.split(",") if b],
                                     lag_inputs=[b for b in lag_inputs.split(",") if b])
    except KeyError as exc:
        raise BadInput(str(exc.args[0])) from None
    except (ConfigError, ValueError) as exc:
        raise BadInput(str(exc)) from None
    pooled = problem.fit(shooting_s=shooting_h * 3600.0 if shooting_h else None)
    per_run = sysid.per_run_fits(problem, pooled) if len(runs) > 1 else [pooled]
    spread = sysid.spread_ranges(problem, pooled, per_run)
    prof = problem.profile_interval(pooled, profile_param) if profile_param else None
    sims = problem.simulate(_theta(problem, pooled))
    findings, warnings = what_the_model_lacks(problem, pooled, per_run, sims, names, windows)
    nouts = noise_outputs.split(",") if noise_outputs else sorted(
        set().union(*[r.measured_outputs(spec) for r in runs]))
    ref_runs, ref_offsets = noise.reference_offsets(problem, pooled, nouts)
    profiles = noise.fit_noise_profiles(ref_runs, sims, spec, nouts, ref_offsets)
    residual = None
    try:
        held = logs.read_runs(holdout, spec, cm, u0) if holdout else None
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    if world_model and not held:
        raise BadInput("--world-model needs --holdout runs to compare on")
    if residual_states:
        from hil.calibration.residual_fit import fit_residual

        model, residual = fit_residual(problem, pooled, residual_states.split(","),
                                       residual_features.split(",") if residual_features else None,
                                       heldout=held, heldout_x0=[x0] * len(held) if held else None)
        npz = str(Path(out).with_suffix(".residual.npz"))
        if residual["loop_blockers"]:  # diagnosis only: the loop would apply another model
            residual["not_written"] = "; ".join(residual["loop_blockers"])
        else:
            model.save(npz)
            residual["file"] = Path(npz).name
    doc = report.fitted_document(problem, pooled, per_run, spread, profiles, findings, unit=unit,
                                 sources=[str(Path(f).resolve()) for f in data],
                                 profile=prof, residual=residual, warnings=warnings)
    if world_model:
        from hil.calibration import worldmodel

        wm = worldmodel.train(runs, spec, problem.outputs)
        held_sims = [problem.sim.run(r, pooled.p_full, x0)[:2] for r in held]
        wm_report = worldmodel.compare(wm, held, held_sims, spec, horizon=horizon)
        doc["sysid"]["world_model"] = {
            "members": len(wm.coefs), "heldout_runs": [r.name for r in held],
            "one_step_rmse_sigma": wm_report["one_step_rmse_sigma"],
            "multi_step_rmse_sigma": wm_report.get("multi_step_rmse_sigma", {}),
            "diverging_regions": wm_report["diverging_regions"]}
        wm_table = worldmodel.region_table(wm_report)
        if not no_plots:
            Path(out).with_suffix(".plots").mkdir(parents=True, exist_ok=True)
            f = worldmodel.region_plot(wm_report, Path(out).with_suffix(".plots") / "world_model_regions.png")
            doc["sysid"]["world_model"]["plot"] = str(Path(f).relative_to(Path(out).parent))
    if not no_plots:
        files = report.residual_plots(problem, sims, Path(out).with_suffix(".plots"), theta=problem.theta_from(pooled))
        doc["sysid"]["residual_plots"] = [str(Path(f).relative_to(Path(out).parent)) for f in files]
    report.write_fitted(out, doc)
    report.print_summary(click.echo, pooled, per_run, findings, profiles, prof, warnings=warnings)
    if world_model:
        click.echo(wm_table)
    if residual:
        for n in residual["rmse_without"]:
            u = residual["unit"][n]
            click.echo(f"residual model, {residual['evaluated_on']}, {n}: RMS error "
                       f"{residual['rmse_without_raw'][n]:.4g} {u} -> {residual['rmse_with_raw'][n]:.4g} {u} "
                       f"(noise-weighted {residual['rmse_without'][n]:.3f} -> {residual['rmse_with'][n]:.3f})")
        if residual.get("not_written"):
            click.echo(f"residual model NOT written for the loop: {residual['not_written']} (a model applied "
                       "without a feature it was fitted with is another model; it is reported for diagnosis)")
    click.echo(f"wrote {out}")


def what_the_model_lacks(problem, pooled, per_run, sims, params, windows: int) -> tuple[list[dict], list[str]]:
    """Findings (hil/calibration/sysid.py identifiability and hil/calibration/findings.py:
    bounds with the direction of the pull, run-to-run spread beyond the intervals, residuals
    correlated with extra columns or logged events, trends of the windowed re-estimation)
    and warnings (unlogged states that matter)."""
    from hil.calibration import findings as lacks
    from hil.calibration import sysid

    out = [f for f in sysid.identifiability(pooled) if f["kind"] != "at_bound"]  # said with its pull below
    out += lacks.bound_findings(problem, pooled)
    if len(per_run) > 1:
        out += lacks.spread_findings(pooled, per_run)
    out += lacks.correlation_findings(problem, sims, theta=problem.theta_from(pooled))
    if windows > 0:
        unit = {p: problem.spec.quantity("params", p).unit for p in params}
        out += lacks.trend_findings(lacks.windowed_estimates(problem, pooled, params, n_windows=windows),
                                    unit_of=lambda p: unit.get(p, ""))
    return out, lacks.unlogged_state_warnings(problem, pooled)


def _theta(problem, pooled):
    from hil.calibration.residual_fit import _theta as th

    return th(problem, pooled)


def _state_of(module, name: str, opt: str) -> str:
    """A state name for `name`: a state itself, or an output that reads exactly one state
    (dissolved_oxygen -> dissolved_o2); else a BadInput naming the option and the states."""
    import numpy as np

    spec = module.SPEC
    if name in spec.names("states"):
        return name
    if name in spec.names("outputs"):
        j = spec.index("outputs", name)
        x, u, p = spec.nominal("states"), spec.nominal("inputs"), spec.nominal("params")
        y0, y1 = np.zeros(spec.n_outputs), np.zeros(spec.n_outputs)
        module.outputs(x, u, p, y0)
        moved = []
        for i, q in enumerate(spec.states):
            x2 = x.copy()
            x2[i] += 1e-3 * max(abs(x[i]), q.high - q.low)
            module.outputs(x2, u, p, y1)
            if abs(y1[j] - y0[j]) > 1e-12 * (abs(y0[j]) + 1e-12):
                moved.append(q.name)
        if len(moved) == 1:
            return moved[0]
        raise BadInput(f"{opt}: {name!r} is an output of {spec.name} that reads "
                       f"{'no state' if not moved else 'states ' + ', '.join(moved)}: name a state "
                       f"({', '.join(spec.names('states'))})")
    raise BadInput(f"{opt}: {name!r} is not a state of {spec.name} (states: {', '.join(spec.names('states'))})")


def _feature_of(module, f: str) -> str:
    """x.<state> (an output name reading one state accepted), u.<input> or an extra feature
    (e./since./trace.; its source is checked against the logs once read); else BadInput."""
    from hil.calibration.residual import is_extra, parse_extra

    spec = module.SPEC
    kind, _, name = f.partition(".")
    if is_extra(f):
        try:
            parse_extra(f)
        except ValueError as exc:
            raise BadInput(f"--residual-features: {exc}") from None
        return f
    if kind == "x":
        return "x." + _state_of(module, name, f"--residual-features {f!r}")
    if kind == "u" and name in spec.names("inputs"):
        return f
    if kind == "u":
        raise BadInput(f"--residual-features {f!r}: {name!r} is not an input of {spec.name} "
                       f"(inputs: {', '.join(spec.names('inputs'))})")
    raise BadInput(f"--residual-features {f!r}: expected x.<state>, u.<input>, e.<column>, since.<signal> "
                   "or trace.<signal>:<tau_s>")
