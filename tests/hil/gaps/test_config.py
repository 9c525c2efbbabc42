"""[gaps] section (hil/gaps/config.py, checks.py): bad parameters give a ConfigError that
names the key; the shipped configs/bioreactor_gaps.toml is valid and uses every gap type."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path

import pytest

from hil.scenario.config import load_scenario, parse_scenario
from hil.errors import ConfigError
from hil.gaps.config import ActuatorGap, GapsSection, SensorGap
from tests.hil.gaps.gaps_util import TANK

ROOT = Path(__file__).resolve().parents[3]
CORE = {
    "scenario": {"name": "t"},
    "plant": {"model": "bioreactor"},
    "loop": {"step_s": 1.0, "duration_s": 10.0},
}


def problems(gaps: dict) -> dict[str, str]:
    data = copy.deepcopy(CORE) | {"gaps": gaps}
    with pytest.raises(ConfigError) as info:
        parse_scenario(data)
    return dict(info.value.problems)


@pytest.mark.parametrize("gaps,key,reason", [
    ({"sensors": {"glucose": {"noise_std": -0.1}}}, "gaps.sensors.glucose.noise_std",
     "greater than or equal to 0"),
    ({"sensors": {"glucose": {"adc_bits": 40}}}, "gaps.sensors.glucose.adc_bits",
     "less than or equal to 32"),
    ({"sensors": {"glucose": {"adc_bits": 0}}}, "gaps.sensors.glucose.adc_bits",
     "greater than or equal to 1"),
    ({"sensors": {"glucose": {"nosie_std": 1.0}}}, "gaps.sensors.glucose.nosie_std",
     "unknown key"),
    ({"sensors": {"sugar": {"noise_std": 1.0}}}, "gaps.sensors.sugar", "no output 'sugar'"),
    ({"sensors": {"ph": {"adc_bits": 12, "adc_range": [12.0, 2.0]}}},
     "gaps.sensors.ph.adc_range", "lower bound 12.0 >= upper bound 2.0"),
    ({"sensors": {"ph": {"adc_bits": 12, "quant_step": 0.01}}}, "gaps.sensors.ph.quant_step",
     "not both"),
    ({"sensors": {"ph": {"drift_per_s": 1e-6, "drift_per_day": 0.02}}},
     "gaps.sensors.ph.drift_per_day", "either"),
    ({"sensors": {"ph": {"dropout_rate_per_s": 0.1}}}, "gaps.sensors.ph.dropout_duration_s",
     "must be > 0"),
    ({"sensors": {"ph": {"dropout_mode": "stuck", "dropout_rate_per_s": 0.1,
                         "dropout_duration_s": 1.0}}}, "gaps.sensors.ph.dropout_value", "finite"),
    ({"actuators": {"feed_rate": {"saturation": [0.4, 0.1]}}},
     "gaps.actuators.feed_rate.saturation", "lower bound 0.4 > upper bound 0.1"),
    ({"actuators": {"feed": {"gain": 1.0}}}, "gaps.actuators.feed", "no input 'feed'"),
    ({"actuators": {"feed_rate": {"lag_tau_s": -1}}}, "gaps.actuators.feed_rate.lag_tau_s",
     "greater than or equal to 0"),
    ({"actuators": {"feed_rate": {"breakaway_rest": 3.0}}},
     "gaps.actuators.feed_rate.breakaway_rest", "outside"),
    ({"latency": {"observation": {"glucose": {"value_s": 20.0}}}},
     "gaps.latency.observation.glucose.value_s", "longer than the delay buffer"),
    ({"latency": {"observation": {"glucose": {"value_s": 5.0, "jitter_s": 6.0}}}},
     "gaps.latency.observation.glucose.value_s", "longer than the delay buffer"),
    ({"latency": {"actuation": {"feed_rate": {"dist": "uniform", "low_s": 3.0, "high_s": 1.0}}}},
     "gaps.latency.actuation.feed_rate.low_s", "lower bound 3.0 > upper bound 1.0"),
    ({"latency": {"actuation": {"feed_rate": {"dist": "normal", "mean_s": 1.0}}}},
     "gaps.latency.actuation.feed_rate.std_s", "required"),
    ({"latency": {"actuation": {"feed_rate": {"max_s": 50.0}}}},
     "gaps.latency.actuation.feed_rate.max_s", "longer than the delay buffer"),
    ({"latency": {"observation": {"grp": {"signals": ["ph", "oops"]}}}},
     "gaps.latency.observation.grp.signals", "no output 'oops'"),
    ({"latency": {"observation": {"ph": {"value_s": 1.0}, "grp": {"signals": ["ph"]}}}},
     "gaps.latency.observation.grp.signals", "already delayed"),
    ({"latency": {"observation": {"ph": {"dist": "profile", "file": "/nonexistent/p.json"}}}},
     "gaps.latency.observation.ph.file", "cannot read"),
    ({"max_delay_s": 1e7, "latency": {"observation": {"ph": {"value_s": 1.0}}}},
     "gaps.max_delay_s", "buffer limit"),
    ({"randomize": {"plant": {"mu_y": {"dist": "uniform", "low": 0, "high": 1}}}},
     "gaps.randomize.plant.mu_y", "no param 'mu_y'"),
    ({"randomize": {"plant": {"mu_x": {"dist": "uniform", "low": 0.2, "high": 0.1}}}},
     "gaps.randomize.plant.mu_x.low", "lower bound"),
    ({"randomize": {"plant": {"mu_x": {"dist": "uniform", "low": 0.5, "high": 0.6}}}},
     "gaps.randomize.plant.mu_x", "misses"),
    ({"randomize": {"plant": {"mu_x": {"dist": "normal", "mean": 0.09}}}},
     "gaps.randomize.plant.mu_x.std", "required"),
    ({"randomize": {"sensors": {"ph": {"dropout_mode": {"dist": "choice", "values": [1]}}}}},
     "gaps.randomize.sensors.ph.dropout_mode", "not a numeric field"),
    ({"randomize": {"sensors": {"ph": {"noise_std": {"dist": "uniform", "low": -2, "high": -1}}}}},
     "gaps.randomize.sensors.ph.noise_std", "misses"),
    ({"randomize": {"latency": {"observation": {"nochan": {"value_s": {
        "dist": "uniform", "low": 0, "high": 1}}}}}},
     "gaps.randomize.latency.observation.nochan", "no channel"),
    ({"randomize": {"table": {"file": "/nonexistent/fits.csv"}}}, "gaps.randomize.table.file",
     "no such file"),
])
def test_bad_parameters_name_the_key(gaps, key, reason):
    found = problems({"max_delay_s": 10.0} | gaps)
    assert key in found, found
    assert reason in found[key], found[key]


def test_malformed_profile_names_the_file_key(tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"format": "hil-latency-profile", "version": 1,
                             "series": {"a": {"samples": ["x"]}}}))
    found = problems({"latency": {"observation": {"ph": {"dist": "profile", "file": str(p)}}}})
    assert "numbers" in found["gaps.latency.observation.ph.file"]
    p.write_text(json.dumps({"format": "hil-latency-profile", "version": 1,
                             "series": {"a": {"samples": [0.1]}, "b": {"samples": [0.2]}}}))
    found = problems({"latency": {"observation": {"ph": {"dist": "profile", "file": str(p)}}}})
    assert "name one" in found["gaps.latency.observation.ph.series"]


def test_table_with_values_outside_the_bounds(tmp_path):
    p = tmp_path / "fits.csv"
    p.write_text("mu_x,Y_xs\n0.09,0.45\n0.5,0.46\n")
    found = problems({"randomize": {"table": {"file": str(p)}}})
    assert "outside" in found["gaps.randomize.table.file"]


def test_validate_against_a_small_spec():
    sec = GapsSection.model_validate({"sensors": {"level": {"adc_bits": 10}},
                                      "actuators": {"valve": {"saturation": [-5, -1]}}})
    found = dict(sec.validate_against(TANK, None))
    assert found == {"gaps.actuators.valve.saturation":
                     "[-5.0, -1.0] lies outside the bounds of valve [0.0, 100.0] %"}


def test_the_shipped_gaps_config_uses_every_gap_type():
    sc = load_scenario(ROOT / "configs" / "bioreactor_gaps.toml")
    g = sc.gaps
    raw = tomllib.loads((ROOT / "configs" / "bioreactor_gaps.toml").read_text())["gaps"]
    used_s = {k for cfg in raw["sensors"].values() for k in cfg}
    for field in ("noise_std", "colored_std", "bias", "drift_per_day", "random_walk_std",
                  "adc_bits", "sample_period_s", "dropout_rate_per_s", "spike_rate_per_s"):
        assert field in used_s, field
    assert {c["dropout_mode"] for c in raw["sensors"].values() if "dropout_mode" in c} == {
        "hold", "stuck", "bad"}
    used_a = {k for cfg in raw["actuators"].values() for k in cfg}
    for field in ("saturation", "rate_limit_per_s", "deadband", "lag_tau_s", "backlash",
                  "breakaway", "quant_step", "dac_bits", "gain", "offset"):
        assert field in used_a, field
    dists = {c.dist for d in (g.latency.observation, g.latency.actuation) for c in d.values()}
    assert {"constant", "lognormal", "uniform", "normal", "empirical"} <= dists
    assert g.randomize.plant and g.randomize.sensors and g.randomize.actuators
    # core sections are bioreactor.toml's
    base = load_scenario(ROOT / "configs" / "bioreactor.toml")
    assert sc.plant == base.plant and sc.loop == base.loop and sc.inputs == base.inputs


def test_model_defaults_are_off():
    assert SensorGap().noise_std == 0 and ActuatorGap().saturation is None


def test_profile_path_resolves_against_the_scenario_file(tmp_path, monkeypatch):
    """A scenario names its data files relative to itself; it loads from any cwd."""
    from pathlib import Path

    from hil.scenario.config import load_scenario
    from hil.gaps.profile import from_latencies, save_profile

    root = Path(__file__).resolve().parents[3]
    scen_dir = tmp_path / "scenarios"
    scen_dir.mkdir()
    save_profile(from_latencies([0.01, 0.02, 0.03], name="plc"), scen_dir / "plc_profile.json")
    text = (root / "configs/bioreactor.toml").read_text()
    text += '\n[gaps.latency.observation.ph]\ndist = "profile"\nfile = "plc_profile.json"\n'
    (scen_dir / "s.toml").write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    sc = load_scenario(scen_dir / "s.toml")
    assert Path(sc.gaps.latency.observation["ph"].file) == scen_dir / "plc_profile.json"
    (scen_dir / "plc_profile.json").unlink()
    with pytest.raises(Exception, match="gaps.latency.observation.ph.file"):
        load_scenario(scen_dir / "s.toml")
