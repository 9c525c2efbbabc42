"""The "real unit" of the calibration tests: the bioreactor off nominal, with an unmodelled
CO2 stripping by the aeration, a feed pump lagging its command by 10 min, and imperfect
sensors (bias, pH drift, white + AR(1) noise on DO, DO quantization and dropouts)."""

from __future__ import annotations

import numpy as np

from hil.calibration.synthetic import SensorTruth, UnitTruth, real_unit_run
from plants.base import load_plant_module

MODULE = load_plant_module("bioreactor")
SPEC = MODULE.SPEC
HOURS = 12.0
SAMPLE_S = 60.0
TRUE_PARAMS = {"mu_x": 0.100, "kla_alpha": 80.0, "Y_xs": 0.42}
STRIP = 0.05  # 1/h per L/h of aeration: CO2 stripped to the off-gas, not in the model
DO_SENSOR = SensorTruth(noise_std=0.3, colored_std=0.5, colored_tau_s=600.0, quant_step=0.1,
                        dropout_prob=0.01)
PH_DRIFT_PER_S = 0.02 / 86400.0


def co2_stripping(x, u, dt_h):
    """The unmodelled effect: dCO2/dt -= STRIP * f_g * CO2 (1/h)."""
    x[5] -= dt_h * STRIP * max(u[3], 0.0) * x[5]


TRUTH = UnitTruth(
    params=TRUE_PARAMS, effect=co2_stripping, lag_tau_s={"feed_rate": 600.0},
    sensors={"dissolved_oxygen": DO_SENSOR,
             "glucose": SensorTruth(noise_std=0.05, bias=0.05),
             "biomass": SensorTruth(noise_std=0.05),
             "co2": SensorTruth(noise_std=0.01),
             "ph": SensorTruth(noise_std=0.01, drift_per_s=PH_DRIFT_PER_S)})


def x0():
    x = SPEC.nominal("states")
    x[0] = 1.0  # inoculum 1 g/L
    return x


def inputs(t_s, seed):
    """Feed steps every 2 h (0.02..0.08 L/h), aeration steps every hour (5..15 L/h)."""
    rng = np.random.default_rng(1000 + seed)
    U = np.tile(SPEC.nominal("inputs"), (t_s.size, 1))
    b = (t_s // 7200).astype(int)
    U[:, 0] = rng.uniform(0.02, 0.08, b.max() + 1)[b]
    a = (t_s // 3600).astype(int)
    U[:, 3] = rng.uniform(5.0, 15.0, a.max() + 1)[a]
    return U


def runs(n, hours=HOURS, sample_s=SAMPLE_S, first_seed=0):
    out = []
    for r in range(first_seed, first_seed + n):
        t = np.arange(0.0, hours * 3600.0 + 1.0, sample_s)
        run, _ = real_unit_run(MODULE, TRUTH, t, inputs(t, r), x0(), seed=r, name=f"run{r}")
        out.append(run)
    return out


def with_known_pump_lag(runs_):
    """The runs as sysid sees them when the pump lag is known (column map `lag_s`)."""
    from hil.calibration.logs import lag_filter

    for r in runs_:
        r.U[:, 0] = lag_filter(r.t_s, r.U[:, 0], TRUTH.lag_tau_s["feed_rate"])
    return runs_
