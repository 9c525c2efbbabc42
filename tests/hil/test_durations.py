"""hil.scenario.durations: what `--duration` and `--wall` accept, and what they refuse."""

import pytest

from hil.scenario.config import load_scenario
from hil.scenario.durations import format_duration, parse_duration, run_duration
from hil.errors import ConfigError
from tests.hil.test_config import ROOT


@pytest.mark.parametrize("text, seconds", [
    ("2h", 7200.0), ("90min", 5400.0), ("30s", 30.0), ("1d", 86400.0), ("600", 600.0), ("2.5", 2.5),
    ("1h30min", 5400.0), ("1h 30m", 5400.0), ("250ms", 0.25), ("3 hours", 10800.0), ("1e3", 1000.0),
    (42, 42.0), (0.5, 0.5),
])
def test_units_and_plain_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "2 parsecs", "-5", "0", "0s", "nan", "inf", "1h30", "h", "2h-"])
def test_not_durations_are_refused_naming_the_option(text):
    with pytest.raises(ConfigError, match="--wall"):
        parse_duration(text, "--wall")


def test_format_duration():
    assert format_duration(36000) == "10 h" and format_duration(5400) == "1.5 h"
    assert format_duration(90) == "1.5 min" and format_duration(0.25) == "250 ms"


@pytest.fixture(scope="module")
def scenario():
    return load_scenario(ROOT / "configs/bioreactor_plc.toml")  # step 1 s, 300x, duration_s 36000


def test_wall_is_converted_with_the_time_scale(scenario):
    assert run_duration(scenario, duration=None, wall="60s", lockstep=False) == pytest.approx(18000.0)
    assert run_duration(scenario, duration="2h", wall=None, lockstep=False) == 7200.0
    assert run_duration(scenario, duration=None, wall=None, lockstep=True) == 36000.0


def test_wall_in_lockstep_and_both_at_once_are_errors(scenario):
    with pytest.raises(ConfigError, match="--wall: lockstep"):
        run_duration(scenario, duration=None, wall="60s", lockstep=True)
    with pytest.raises(ConfigError, match="not both"):
        run_duration(scenario, duration="1h", wall="60s", lockstep=False)


def test_less_than_one_step_is_refused(scenario):
    with pytest.raises(ConfigError, match="shorter than one loop step"):
        run_duration(scenario, duration="0.5", wall=None, lockstep=True)
    with pytest.raises(ConfigError, match="--wall.*shorter than one loop step"):
        run_duration(scenario, duration=None, wall="1ms", lockstep=False)  # 0.3 s simulated
    with pytest.raises(ConfigError, match="loop.duration_s"):
        load_scenario(ROOT / "configs/bioreactor_plc.toml", {"loop": {"duration_s": 0.5}})
