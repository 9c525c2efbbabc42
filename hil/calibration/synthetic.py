"""A "real unit" with known truth, for validating calibration: any plant, parameters off the
nominal, an unmodelled effect, lagging actuators and imperfect sensors.

`real_unit_run` integrates the plant's own kernel in sub-steps <= MAX_SUBSTEP and, between
sub-steps, adds an `effect(x, u, dt)` the model does not have (plain Python, so it can be
anything), passes chosen inputs through a first-order lag (a pump that lags its command;
the log records the command), then measures the outputs through a sensor model written
independently of hil/gaps (bias, drift, white and AR(1) noise, quantization, dropouts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hil.calibration.logs import RunLog


@dataclass
class SensorTruth:
    """Sensor model of one output (plant units; per second of simulated time)."""

    bias: float = 0.0
    drift_per_s: float = 0.0
    noise_std: float = 0.0
    colored_std: float = 0.0
    colored_tau_s: float = 60.0
    quant_step: float = 0.0
    dropout_prob: float = 0.0   # probability that a sample is missing (NaN)


@dataclass
class UnitTruth:
    params: dict[str, float] = field(default_factory=dict)      # off-nominal values
    effect: object = None                                       # callable(x, u, dt) -> None, in place
    lag_tau_s: dict[str, float] = field(default_factory=dict)   # input -> pump lag time constant
    sensors: dict[str, SensorTruth] = field(default_factory=dict)


def real_unit_run(module, truth: UnitTruth, t_s: np.ndarray, U_cmd: np.ndarray, x0: np.ndarray,
                  seed: int, name: str = "run", base_params=None) -> tuple[RunLog, np.ndarray]:
    """Simulate the unit; returns (RunLog with commanded inputs and measured outputs,
    true outputs (n, n_outputs))."""
    spec = module.SPEC
    p = np.array(spec.nominal("params") if base_params is None else base_params, float)
    for k, v in truth.params.items():
        p[spec.index("params", k)] = v
    tu = float(getattr(module, "TIME_UNIT_S", 1.0))
    max_sub = float(module.MAX_SUBSTEP)
    work = np.zeros((5, spec.n_states))
    x = np.array(x0, float)
    u_app = U_cmd[0].copy()
    lag = {spec.index("inputs", k): v for k, v in truth.lag_tau_s.items()}
    n = t_s.size
    Ytrue = np.zeros((n, spec.n_outputs))
    y = np.zeros(spec.n_outputs)
    for k in range(n):
        module.outputs(x, u_app, p, y)
        Ytrue[k] = y
        if k == n - 1:
            break
        dt_s = t_s[k + 1] - t_s[k]
        nsub = max(1, math.ceil(dt_s / tu / max_sub * (1 - 1e-12)))
        h_s = dt_s / nsub
        for _ in range(nsub):
            for j in range(spec.n_inputs):
                if j in lag:
                    a = math.exp(-h_s / lag[j])
                    u_app[j] = a * u_app[j] + (1 - a) * U_cmd[k, j]
                else:
                    u_app[j] = U_cmd[k, j]
            module.step(0.0, x, u_app, p, h_s / tu, 1, work)
            if truth.effect is not None:
                truth.effect(x, u_app, h_s / tu)
    rng = np.random.default_rng(seed)
    Y = np.full((n, spec.n_outputs), np.nan)
    for name_o, s in truth.sensors.items():
        j = spec.index("outputs", name_o)
        v = Ytrue[:, j] + s.bias + s.drift_per_s * t_s
        if s.noise_std:
            v = v + rng.normal(0.0, s.noise_std, n)
        if s.colored_std:
            ar = np.zeros(n)
            ar[0] = rng.normal(0.0, s.colored_std)
            for k in range(1, n):
                a = math.exp(-(t_s[k] - t_s[k - 1]) / s.colored_tau_s)
                ar[k] = a * ar[k - 1] + math.sqrt(1 - a * a) * s.colored_std * rng.normal()
            v = v + ar
        if s.quant_step:
            v = np.round(v / s.quant_step) * s.quant_step
        if s.dropout_prob:
            v[rng.random(n) < s.dropout_prob] = np.nan
        Y[:, j] = v
    run = RunLog(name, t_s - t_s[0], U_cmd.copy(), Y, np.full((n, spec.n_states), np.nan), {}, "synthetic")
    return run, Ytrue
