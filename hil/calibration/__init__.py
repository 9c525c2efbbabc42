"""Calibration on the actual unit: logs in, fitted parameters, noise profiles, a residual
model, a world-model consistency check and the reality-gap audit out.

Modules (one job each):
    logs       read CSV / Parquet / hil recordings through a column map (units converted)
    simulate   Numba simulation of any plant over logged inputs (ZOH, prescribed states)
    sysid      least-squares fit (single or multiple shooting), intervals, identifiability
    noise      sensor gap parameters fitted from residuals, written in the [gaps] format
    residual   a linear-in-features dynamics correction, Numba-callable in the plant step
    worldmodel a small learned ensemble compared with the simulator by operating region
    audit      the playbook's reality-gap diagnostic from evidence on disk
Nothing here assumes a particular plant: everything goes through the plant spec.
"""
