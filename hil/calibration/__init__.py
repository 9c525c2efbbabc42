"""Calibration on the actual unit: logs in, fitted parameters, noise profiles, a residual
model, a world-model consistency check and the reality-gap audit out.

Modules (one job each):
    logs       read CSV / Parquet / hil recordings through a column map (units converted)
    simulate   Numba simulation of any plant over logged inputs (ZOH, prescribed states)
    parallel   a fit's runs and finite-difference Jacobian columns on a thread pool
    sysid      least-squares fit (parameters, initial states, sensor offsets, actuator lags,
               lab references) and its sandwich intervals
    checks     profile likelihood, identifiability, per-run fits and the spread ranges
    stats      small shared statistics (robust noise level, long-run variance factor)
    findings   what the model lacks: trends, correlations, spread, bounds, unlogged states
    shooting   multiple shooting for long runs
    noise      sensor gap parameters fitted from residuals, written in the [gaps] format
    residual   a linear-in-features dynamics correction (states, inputs, logged columns and
               events), Numba-callable in the plant step
    residual_fit  fitting it, held-out error with and without
    worldmodel a small learned ensemble compared with the simulator by operating region
    audit      the playbook's reality-gap diagnostic from evidence on disk
    report     the fitted TOML and residual plots; tomlw: its TOML writer
    synthetic  a "real unit" with known truth, for validation (same kernel)
    reality    an independent "real unit" (own equations, LSODA), to judge the fitter
Nothing here assumes a particular plant: everything goes through the plant spec.
"""
