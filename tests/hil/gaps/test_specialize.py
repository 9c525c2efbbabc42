"""hil/gaps/specialize.py: the gap kernels generated for one scenario give exactly (bit for bit)
what each instance's own GapPipeline arena gives, and a changed parameter gets another kernel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hil.gaps import GapPipeline, GapsSection
from hil.gaps.compact import CompactGaps
from hil.gaps.pipeline import _actuate, _sense
from hil.gaps.profile import from_latencies, make_profile
from hil.gaps.specialize import gap_source, lit, specialised_gaps
from hil.scenario.config import load_scenario
from plants.base import Plant
from tests.hil.gaps.gaps_util import TANK

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "bioreactor_gym.toml"


def _every_branch(tmp_path) -> dict:
    """Every sensor and actuator element, every delay kind and order, and randomized fields that
    make some parameters run-time values (a drawn on/off, a drawn quantizer, a drawn delay)."""
    seq = tmp_path / "seq.json"
    seq.write_text(json.dumps(from_latencies((0.05 + 0.1 * np.arange(7) % 0.3).tolist(), "s", name="plc")))
    hist = tmp_path / "hist.json"
    hist.write_text(json.dumps(make_profile({"h": {"unit": "s", "histogram": {
        "edges": [0.0, 0.1, 0.2, 0.4], "counts": [5.0, 3.0, 2.0]}}})))
    return {
        "max_delay_s": 2.0,
        "sensors": {
            "level": {"noise_std": 0.01, "colored_std": 0.02, "colored_tau_s": 0.5, "random_walk_std": 0.01,
                      "adc_bits": 10, "spike_rate_per_s": 2.0, "spike_size": 0.5, "dropout_rate_per_s": 1.0,
                      "dropout_duration_s": 0.3, "dropout_mode": "hold", "bias": 0.1, "drift_per_s": 0.001},
            "temp": {"noise_std": 0.1, "quant_step": 0.05, "sample_period_s": 0.3, "gain": 1.01,
                     "dropout_rate_per_s": 0.5, "dropout_duration_s": 0.2, "dropout_mode": "stuck",
                     "dropout_value": -1.0},
        },
        "actuators": {
            "inflow": {"gain": 1.02, "offset": -0.01, "dac_bits": 8, "deadband": 0.01, "breakaway": 0.02,
                       "saturation": [0.0, 0.9], "rate_limit_per_s": 0.5, "lag_tau_s": 0.3, "backlash": 0.02},
            "valve": {"quant_step": 0.5, "lag_tau_s": 0.2},
        },
        "latency": {
            "observation": {
                "level": {"value_s": 0.3},
                "temp": {"dist": "lognormal", "median_s": 0.2, "sigma": 0.4, "max_s": 1.0, "order": "latest"},
                "flow": {"dist": "profile", "file": str(seq)},
            },
            "actuation": {
                "inflow": {"dist": "uniform", "low_s": 0.1, "high_s": 0.4, "jitter_s": 0.05},
                "valve": {"dist": "profile", "file": str(hist), "order": "latest"},
                "heater": {"dist": "normal", "mean_s": 0.2, "std_s": 0.1, "min_s": 0.05},
            },
        },
        "randomize": {
            "sensors": {"flow": {"noise_std": {"dist": "choice", "values": [0.0, 0.02]},
                                 "adc_bits": {"dist": "choice", "values": [8.0, 12.0]}},
                        "level": {"bias": {"dist": "normal", "mean": 0.0, "std": 0.05}}},
            "actuators": {"heater": {"lag_tau_s": {"dist": "choice", "values": [0.0, 0.3]}}},
            "latency": {"observation": {"temp": {"median_s": {"dist": "uniform", "low": 0.1, "high": 0.5}}},
                        "actuation": {"heater": {"mean_s": {"dist": "uniform", "low": 0.1, "high": 0.4}}}},
        },
    }


def _check(g, spec, step_s: float, n: int, steps: int, seed0: int) -> None:
    cg = CompactGaps(g, n)
    mod = specialised_gaps(cg)
    arenas = []
    for i in range(n):  # each instance its own seed and episode, as HilVectorEnv does
        g.seed = g.plant_randomizer.seed = seed0 + i
        g.reset(i % 2)
        g.randomize(np.array([q.nominal for q in spec.params]), i % 2)
        cg.load(i)
        arenas.append((g._act_buf.copy(), g._sense_buf.copy()))
    rng = np.random.default_rng(0)
    n_u, n_y = spec.n_inputs, spec.n_outputs
    lo, hi = spec.lows("inputs"), spec.highs("inputs")
    for k in range(steps):
        t = k * step_s
        for i in range(n):
            u = rng.uniform(lo, np.minimum(hi, lo + 100.0))
            if k % 17 == 3:
                u[0] = np.nan  # a non-finite command reaches the gaps as it is
            y = rng.normal(10.0, 3.0, n_y)
            ua1, ua2 = np.zeros(n_u), np.zeros(n_u)
            ym1, ym2 = np.zeros(n_y), np.zeros(n_y)
            _actuate(arenas[i][0], t, u, ua1)
            _sense(arenas[i][1], t + step_s, y, ym1)
            mod.actuate_spec(cg.REC[i], t, u, ua2)
            mod.sense_spec(cg.REC[i], t + step_s, y, ym2)
            np.testing.assert_array_equal(ua2, ua1, err_msg=f"u_applied, instance {i}, step {k}")
            np.testing.assert_array_equal(ym2, ym1, err_msg=f"y_meas, instance {i}, step {k}")


def test_generated_kernels_are_each_instances_arena_bit_for_bit_bioreactor_gym():
    sc = load_scenario(CONFIG)
    plant = Plant.from_name("bioreactor")
    g = GapPipeline.build(sc.gaps, plant.spec, sc.loop.step_s, 1)
    _check(g, plant.spec, sc.loop.step_s, 4, 400, 100)


def test_generated_kernels_are_each_instances_arena_bit_for_bit_every_branch(tmp_path):
    g = GapPipeline.build(GapsSection.model_validate(_every_branch(tmp_path)), TANK, 0.1, 7)
    cg = CompactGaps(g, 1)
    text = gap_source(cg)
    # the drawn rows are run-time values: their tests stay in the code (a drawn on/off, quantizer)
    assert "rf[" in text and "quantize(" in text
    _check(g, TANK, 0.1, 6, 300, 11)


def test_a_changed_parameter_gets_another_kernel(tmp_path):
    """Numba caches the generated module by its file: a scenario that differs in one fixed
    parameter must get another file (and module), never the kernel compiled for the old value."""
    cfg = {"sensors": {"level": {"noise_std": 0.01, "bias": 0.1}},
           "latency": {"observation": {"level": {"value_s": 0.3}}}}
    mods = []
    for bias in (0.1, 0.2, 0.1):
        cfg["sensors"]["level"]["bias"] = bias
        g = GapPipeline.build(GapsSection.model_validate(cfg), TANK, 0.1, 7)
        mods.append(specialised_gaps(CompactGaps(g, 1)))
    assert mods[0] is mods[2] and mods[0] is not mods[1]
    assert Path(mods[0].__file__) != Path(mods[1].__file__)
    assert lit(0.1) in Path(mods[0].__file__).read_text() and lit(0.2) in Path(mods[1].__file__).read_text()
    # and the kernels compute with their own value
    y = np.full(3, 5.0)
    outs = []
    for m, bias in zip(mods[:2], (0.1, 0.2)):
        cfg["sensors"]["level"]["bias"] = bias
        g = GapPipeline.build(GapsSection.model_validate(cfg), TANK, 0.1, 7)
        cg = CompactGaps(g, 1)
        cg.load(0)
        ym = np.zeros(3)
        m.sense_spec(cg.REC[0], 0.1, y, ym)
        ref = np.zeros(3)
        _sense(g._sense_buf, 0.1, y, ref)
        np.testing.assert_array_equal(ym, ref)
        outs.append(ym[0])
    assert outs[0] != outs[1]


@pytest.mark.parametrize("v", [0.1, -0.0, 1e-300, -2.5e17, float("inf"), float("-inf")])
def test_literals_round_trip(v):
    assert eval(lit(v), {"_INF": float("inf")}).hex() == float(v).hex()  # noqa: S307
