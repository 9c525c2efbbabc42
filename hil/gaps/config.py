"""The [gaps] section of a scenario: sensor, actuator and latency gaps, domain randomization.

Every value is in the plant unit of the signal it acts on unless its name carries another unit
(`_s` seconds of simulated time, `_per_s` per simulated second, `_per_day` per 86400 s).
Omitted keys mean "this gap is off". Schema (TOML):

    [gaps]
    enabled = true            # master switch; false = identity pipeline
    max_delay_s = 10.0        # delay buffer limit: every delay is <= this (ring of
                              # ceil(D / loop.step_s) + 2 slots rounded up to a power of two,
                              # at most 2**20; D = the largest delay the channels can draw,
                              # <= max_delay_s: hil/gaps/latency.py channel_bound_s)

    [gaps.sensors.<output>]   # applied in this order, at the sensor's sample instants:
    gain = 1.0                #   y = gain * y_true + bias + drift * t_s + random walk
    bias = 0.0                #     (t_s: simulated time of the sample, s)
    drift_per_s = 0.0         #   linear drift, units/s ... or
    drift_per_day = 0.0       #   ... units/day (e.g. pH 0.02); not both
    random_walk_std = 0.0     #   random-walk drift, units/sqrt(s): std grows as sqrt(t)
    noise_std = 0.0           #   + white Gaussian noise, std in units
    colored_std = 0.0         #   + AR(1) noise, stationary std in units ...
    colored_tau_s = 60.0      #     ... correlation time (lag-dt autocorrelation exp(-dt/tau))
    spike_rate_per_s = 0.0    #   + outliers: Poisson rate per s, each +/- spike_size (sign 50/50)
    spike_size = 0.0
    adc_bits = 12             #   quantization: clip to adc_range, step (hi-lo)/2**bits ...
    adc_range = [lo, hi]      #     (default: the output's bounds), or
    quant_step = 0.01         #     a plain step in units (not with adc_bits)
    sample_period_s = 0.0     #   sample-and-hold: new value every sample_period_s (0 = every step)
    dropout_rate_per_s = 0.0  #   dropouts: Poisson rate per s ...
    dropout_duration_s = 0.0  #     ... each lasting this long; during one the output is
    dropout_mode = "hold"     #     "hold" (last value), "stuck" (dropout_value), "bad" (dropout_value,
    dropout_value = nan       #     default NaN: an invalid reading)

    [gaps.actuators.<input>]  # applied in this order to the (delayed) command:
    gain = 1.0                #   u = gain * u_cmd + offset
    offset = 0.0
    quant_step = 0.0 | dac_bits = 12, dac_range = [lo, hi]   # command quantization
    deadband = 0.0            #   hold the last passed command until |u - held| > deadband
    breakaway = 0.0           #   |u - breakaway_rest| < breakaway -> breakaway_rest (does not move)
    breakaway_rest = 0.0      #     (default: 0 if inside the input's bounds, else the low bound)
    saturation = [lo, hi]     #   physical travel, inside the input's bounds
    rate_limit_per_s = 1.0    #   |du/dt| <= rate, units/s
    lag_tau_s = 0.0           #   first-order lag, exact ZOH discretization
    backlash = 0.0            #   mechanical play, total width in units
                              # the result is finally clipped to the input's physical bounds

    [gaps.latency.observation.<output or group>]   # after the sensor gap
    [gaps.latency.actuation.<input or group>]      # before the actuator gap
    signals = ["a", "b"]      # a group sharing one delay draw per sample (default: [the name])
    dist = "constant"         # constant | uniform | normal | lognormal | empirical | profile
    value_s = 0.0             # constant
    low_s, high_s             # uniform
    mean_s, std_s             # normal
    median_s, sigma           # lognormal: ln(d) ~ N(ln(median_s), sigma)
    samples_s = [...]         # empirical: drawn uniformly with replacement
    file = "p.json"           # profile (format: hil/gaps/profile.py; relative to the scenario file)
    series = "name"           #   series in the file (default: the only one)
    replay = "sequence"       #   "sequence" (recorded order, from a random start) or "random"
    jitter_s = 0.0            # + uniform jitter in [-jitter_s, +jitter_s]
    min_s = 0.0, max_s = max_delay_s   # every draw is clipped to [min_s, max_s]
    order = "fifo"            # "fifo": no overtaking (a late sample holds back newer ones, as TCP);
                              # "latest": the newest arrived sample wins, stale arrivals are dropped

    [gaps.randomize]          # per episode, reproducible from (loop.seed, episode)
    table = { file = "fits.csv", rows = "random" }   # fitted joint samples: CSV, header = params
    [gaps.randomize.plant.<param>]       # a Dist (below), truncated to the param's bounds
    [gaps.randomize.sensors.<output>]    # <field> = { Dist }, any numeric field above
    [gaps.randomize.actuators.<input>]
    [gaps.randomize.latency.observation.<channel>]   (and .actuation.<channel>)

    Dist = { dist = "uniform", low, high } | { dist = "normal", mean, std }
         | { dist = "lognormal", median, sigma } | { dist = "choice", values = [...] }
         + relative = false (values are factors of the nominal) + min, max (truncation, by
         rejection, intersected with the plant bounds or the field's own limits).

`GapsSection.validate_against(spec, scenario)` returns (key_path, reason) problems such as
("gaps.sensors.glucose.adc_bits", "40 is outside 1..32").
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from hil.scenario.config import StrictModel, resolve_path_field
from hil.scenario.numbers import unlimited

SECONDS_PER_DAY = 86400.0
MAX_RING_SLOTS = 1 << 20
Pair = tuple[float, float]


class SensorGap(StrictModel):
    """Gap between a true plant output and what its sensor reports (see module docstring)."""

    gain: float = 1.0
    bias: float = 0.0
    drift_per_s: float = 0.0
    drift_per_day: float = 0.0
    random_walk_std: float = Field(0.0, ge=0, description="units/sqrt(s)")
    noise_std: float = Field(0.0, ge=0)
    colored_std: float = Field(0.0, ge=0)
    colored_tau_s: float = Field(60.0, gt=0)
    spike_rate_per_s: float = Field(0.0, ge=0)
    spike_size: float = Field(0.0, ge=0)
    adc_bits: int | None = Field(None, ge=1, le=32)
    adc_range: Pair | None = None
    quant_step: float | None = Field(None, gt=0)
    sample_period_s: float = Field(0.0, ge=0)
    dropout_rate_per_s: float = Field(0.0, ge=0)
    dropout_duration_s: float = Field(0.0, ge=0)
    dropout_mode: Literal["hold", "stuck", "bad"] = "hold"
    dropout_value: float = unlimited(math.nan, description="stuck / bad value; default NaN (an invalid reading)")


class ActuatorGap(StrictModel):
    """Gap between a commanded and an applied plant input (see module docstring)."""

    gain: float = 1.0
    offset: float = 0.0
    quant_step: float | None = Field(None, gt=0)
    dac_bits: int | None = Field(None, ge=1, le=32)
    dac_range: Pair | None = None
    deadband: float = Field(0.0, ge=0)
    breakaway: float = Field(0.0, ge=0)
    breakaway_rest: float | None = None
    saturation: Pair | None = None
    rate_limit_per_s: float | None = Field(None, gt=0)
    lag_tau_s: float = Field(0.0, ge=0)
    backlash: float = Field(0.0, ge=0)


class LatencyChannel(StrictModel):
    """Delay of one signal or of a group sharing one draw per sample (seconds, simulated)."""

    signals: list[str] | None = None
    dist: Literal["constant", "uniform", "normal", "lognormal", "empirical", "profile"] = "constant"
    value_s: float = Field(0.0, ge=0)
    low_s: float | None = Field(None, ge=0)
    high_s: float | None = Field(None, ge=0)
    mean_s: float | None = Field(None, ge=0)
    std_s: float | None = Field(None, ge=0)
    median_s: float | None = Field(None, gt=0)
    sigma: float | None = Field(None, ge=0)
    samples_s: list[float] | None = None
    file: str | None = None
    series: str | None = None
    replay: Literal["sequence", "random"] = "sequence"
    _resolve_file = field_validator("file")(resolve_path_field)
    jitter_s: float = Field(0.0, ge=0)
    min_s: float = Field(0.0, ge=0)
    max_s: float | None = Field(None, ge=0)
    order: Literal["fifo", "latest"] = "fifo"


class LatencySection(StrictModel):
    observation: dict[str, LatencyChannel] = Field(default_factory=dict)
    actuation: dict[str, LatencyChannel] = Field(default_factory=dict)


class Dist(StrictModel):
    """A distribution of one randomized value (plant units, or a factor if relative)."""

    dist: Literal["uniform", "normal", "lognormal", "choice"]
    low: float | None = None
    high: float | None = None
    mean: float | None = None
    std: float | None = Field(None, ge=0)
    median: float | None = Field(None, gt=0)
    sigma: float | None = Field(None, ge=0)
    values: list[float] | None = None
    relative: bool = False
    min: float | None = None
    max: float | None = None


class TableSource(StrictModel):
    file: str
    rows: Literal["random", "sequential"] = "random"
    columns: list[str] | None = Field(None, description="subset of the CSV columns to use")
    _resolve_file = field_validator("file")(resolve_path_field)


class RandomizeSection(StrictModel):
    plant: dict[str, Dist] = Field(default_factory=dict)
    plant_spread: float | None = Field(
        None, ge=0, le=1, description="relative spread of the plant's own randomization hook "
        "(spec.randomize: a physically consistent draw of all its parameters); names in `plant` "
        "are drawn after it and override it")
    table: TableSource | None = None
    sensors: dict[str, dict[str, Dist]] = Field(default_factory=dict)
    actuators: dict[str, dict[str, Dist]] = Field(default_factory=dict)
    latency: dict[Literal["observation", "actuation"], dict[str, dict[str, Dist]]] = Field(
        default_factory=dict
    )


class GapsSection(StrictModel):
    enabled: bool = True
    max_delay_s: float = Field(10.0, gt=0)
    sensors: dict[str, SensorGap] = Field(default_factory=dict)
    actuators: dict[str, ActuatorGap] = Field(default_factory=dict)
    latency: LatencySection = Field(default_factory=LatencySection)
    randomize: RandomizeSection = Field(default_factory=RandomizeSection)

    def validate_against(self, spec, scenario=None) -> list[tuple[str, str]]:
        """Checks that need the plant spec and the loop step; (key_path, reason) pairs."""
        from hil.gaps.checks import check_gaps

        step_s = scenario.loop.step_s if scenario is not None else None
        return check_gaps(self, spec, step_s)


def _register_signal_tables() -> None:
    """[gaps.sensors.node_3.temp] spells [gaps.sensors."node_3.temp"] (hil.scenario.config.flatten_signal_tables)."""
    from hil.scenario.config import register_signal_table

    register_signal_table(("gaps", "sensors"), SensorGap.model_fields)
    register_signal_table(("gaps", "actuators"), ActuatorGap.model_fields)
    register_signal_table(("gaps", "randomize", "plant"), Dist.model_fields)
    register_signal_table(("gaps", "randomize", "sensors"), SensorGap.model_fields)
    register_signal_table(("gaps", "randomize", "actuators"), ActuatorGap.model_fields)


_register_signal_tables()
