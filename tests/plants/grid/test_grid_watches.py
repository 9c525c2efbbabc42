"""The grid's solver state and losses of load reach the run: lockstep runs of case14 through
hil's Runtime, asserting on what the recording carries and on the run's summary (exit code,
alarms, warnings): `[plant] on_blackout` / `on_unserved_load` = warn | fail."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hil.scenario.config import load_scenario
from hil.errors import ConfigError
from hil.recorder import read_recording
from hil.runtime import Runtime
from plants.grid.plant import EXIT_BLACKOUT, EXIT_UNSERVED_LOAD
from tests.plants.grid.conftest import GRIDS


def _scenario(tmp_path: Path, plant_extra: str, inputs: str, duration_s: float = 10.0) -> Path:
    p = tmp_path / "grid14.toml"
    p.write_text(f"""
[scenario]
name = "grid14_watch"
[plant]
model = "grid"
case = "{GRIDS / 'case14.m'}"
{plant_extra}
[loop]
step_s = 1.0
duration_s = {duration_s}
{inputs}
[recording]
path = "{tmp_path / 'runs' / '{scenario}-{timestamp}'}"
""")
    return p


# bus 14 (14.9 MW, no unit) is fed by branches 9-14 (row 17) and 13-14 (row 20)
ISOLATE_14 = """
[inputs."line_17.open_cmd"]
driver = "profile"
profile = [[0.0, 0.0], [3.0, 1.0]]
[inputs."line_20.open_cmd"]
driver = "profile"
profile = [[0.0, 0.0], [3.0, 1.0]]
"""

SHED_60 = """
[inputs."load.shed"]
driver = "profile"
profile = [[0.0, 0.0], [4.0, 0.6]]
"""


def test_unserved_load_warns_by_default_and_the_recording_carries_it(tmp_path):
    sc = load_scenario(_scenario(tmp_path, "", ISOLATE_14))
    with Runtime(sc, lockstep=True) as rt:
        s = rt.run()
    assert s.exit_code == 0 and s.steps == 10
    kinds = [a["kind"] for a in s.alarms]
    assert kinds == ["unserved_load"], s.alarms
    assert any("unserved load 14.9 MW" in w for w in s.warnings), s.warnings
    df = read_recording(s.record_path)
    assert (df["y.grid.unserved_mw"].iloc[:3] == 0).all()
    assert np.allclose(df["y.grid.unserved_mw"].iloc[3:], 14.9, rtol=0, atol=1e-9)
    assert (df["y.grid.dead_buses"].iloc[3:] == 1).all() and (df["y.grid.blackout"] == 0).all()
    assert (df["y.bus_14.island"].iloc[3:] == -1).all()
    assert (df["y.grid.pf_status"] == 0).all() and (df["y.grid.pf_mismatch_pu"] < 1e-8).all()


def test_on_unserved_load_fail_stops_the_run_with_its_exit_code(tmp_path):
    sc = load_scenario(_scenario(tmp_path, 'on_unserved_load = "fail"\nunserved_load_mw = 10.0', ISOLATE_14))
    with Runtime(sc, lockstep=True) as rt:
        s = rt.run()
    assert s.exit_code == EXIT_UNSERVED_LOAD and s.state == "failed" and s.steps == 4
    assert s.stop_reason == "unserved_load" and "14.9 MW" in s.error
    df = read_recording(s.record_path)
    assert len(df) == 4 and df["y.grid.unserved_mw"].iloc[-1] == pytest.approx(14.9)  # the step that failed


def test_unserved_threshold_above_the_loss_raises_nothing(tmp_path):
    sc = load_scenario(_scenario(tmp_path, 'on_unserved_load = "fail"\nunserved_load_mw = 20.0', ISOLATE_14))
    with Runtime(sc, lockstep=True) as rt:
        s = rt.run()
    assert s.exit_code == 0 and s.alarms == [] and s.warnings == []


def test_on_blackout_fail_when_most_load_is_not_served(tmp_path):
    sc = load_scenario(_scenario(tmp_path, 'on_blackout = "fail"', SHED_60))
    with Runtime(sc, lockstep=True) as rt:
        s = rt.run()
    assert s.exit_code == EXIT_BLACKOUT and s.stop_reason == "blackout" and s.steps == 5
    df = read_recording(s.record_path)
    last = df.iloc[-1]
    total = 259.0  # case14's demand, MW
    assert last["y.grid.shed_mw"] == pytest.approx(0.6 * total) and last["y.grid.served_fraction"] == pytest.approx(0.4)
    assert last["y.grid.blackout"] == 1 and last["y.grid.islands"] == 1  # energized, but most load lost


@pytest.mark.parametrize("extra, key", [('on_blackout = "stop"', "on_blackout"),
                                        ("unserved_load_mw = -1", "unserved_load_mw"),
                                        ("blackout_served_fraction = 1.5", "blackout_served_fraction")])
def test_bad_watch_options_name_the_key(tmp_path, extra, key):
    with pytest.raises(ConfigError, match=key):
        load_scenario(_scenario(tmp_path, extra, ""))
