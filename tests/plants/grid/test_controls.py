"""In-plant AGC and UFLS (plants/grid/controls.py): lockstep runs through hil's Runtime, the relay
stages on the model, and the scenario keys' errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hil.scenario.config import load_scenario
from hil.errors import ConfigError
from hil.recorder import read_recording
from hil.runtime import Runtime
from plants.grid.case_files import read_case
from plants.grid.controls import Agc, Ufls
from plants.grid.network import GridModel, GridParams

from .conftest import GRIDS

# case14: unit 2 (bus 2) produces 40 MW; its trip at t = 5 s is the disturbance
TRIP_UNIT_2 = """
[inputs."gen_2.on"]
driver = "profile"
profile = [[0.0, 1.0], [5.0, 0.0]]
"""


def _scenario(tmp_path: Path, plant_extra: str, inputs: str = TRIP_UNIT_2, duration_s: float = 120.0) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    p = tmp_path / "grid14_ctl.toml"
    p.write_text(f"""
[scenario]
name = "grid14_ctl"
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


def _run(tmp_path, plant_extra):
    with Runtime(load_scenario(_scenario(tmp_path, plant_extra)), lockstep=True) as rt:
        s = rt.run()
    assert s.exit_code == 0
    return read_recording(s.record_path)


def test_agc_returns_the_frequency_to_nominal_after_a_unit_trip_in_a_lockstep_run(tmp_path):
    """Paired with the same run without AGC: governors alone leave the droop offset (~0.24 Hz for
    40 MW); the AGC's integral brings it back (|f - 50| < 5 mHz after 2 min) by moving units 1 and 3."""
    base = _run(tmp_path / "base", "")
    agc = _run(tmp_path / "agc", "agc = { units = [1, 3], kp = 20.0, ki = 20.0 }")
    f_base, f_agc = base["y.grid.frequency"].to_numpy(), agc["y.grid.frequency"].to_numpy()
    assert f_base[3] == pytest.approx(50.0, abs=1e-9) and f_agc[3] == pytest.approx(50.0, abs=1e-9)
    assert 50.0 - f_base[-1] > 0.15                      # droop alone: settles off nominal
    assert abs(f_agc[-1] - 50.0) < 5e-3                  # AGC: back to nominal
    assert f_agc[10] < 49.95                             # (it did dip: the trip was felt)
    moved = agc["y.grid.agc_mw"].to_numpy()
    assert abs(moved[3]) < 1e-6 and moved[-1] == pytest.approx(40.0, abs=2.0)  # the lost 40 MW, plus losses
    assert (base["y.grid.agc_mw"] == 0.0).all()


def test_ufls_sheds_in_stages_below_their_thresholds():
    """Stage 1 (49.8 Hz, buses 4 and 9, 10 %) trips after its pickup; stage 2 (49.5 Hz) does not
    (the dip stops at ~49.70 Hz); with stage 2 raised to 49.75 Hz it sheds first."""
    def model(stage2_below):
        m = GridModel(read_case(GRIDS / "case14.m"), GridParams())
        ufls = Ufls({"stages": [{"below": 49.8, "pickup_s": 2.0, "buses": [4, 9], "shed": 0.1},
                                {"below": stage2_below, "buses": [3], "shed": 0.2}]}, m.case, 50.0)
        m.configure_controls(None, ufls)
        return m

    c = read_case(GRIDS / "case14.m")
    pd = {b: float(c.pd_mw[c.bus_index(b)]) for b in (3, 4, 9)}
    m = model(49.5)
    o = m.out
    shed, freq = [], []
    for k in range(30):
        if k == 5:
            m.state["gen_on"][1] = 0
            m._topology(inherit=False)
        m.step(1.0)
        shed.append(o["shed_load_mw"][0])
        freq.append(o["freq_hz"][0])
    below = next(k for k, f in enumerate(freq) if f < 49.8)
    assert all(s == 0.0 for s in shed[:below + 1])                     # pickup 2 s: not at once
    assert shed[below + 2] == pytest.approx(0.1 * (pd[4] + pd[9]), rel=1e-12)
    assert shed[-1] == pytest.approx(0.1 * (pd[4] + pd[9]), rel=1e-12) and min(freq) > 49.5
    assert list(m.state["ufls_active"]) == [1, 1, 0] and o["ufls_tripped"][0] == 2
    m2 = model(49.75)
    for k in range(30):
        if k == 5:
            m2.state["gen_on"][1] = 0
            m2._topology(inherit=False)
        m2.step(1.0)
    # stage 2 (no pickup delay) sheds at once and lifts the frequency above 49.8 Hz before stage 1's
    # 2 s pickup ends: stage 1's timer resets, only stage 2 sheds (staging as relays coordinate)
    assert m2.out["shed_load_mw"][0] == pytest.approx(0.2 * pd[3], rel=1e-12)
    assert list(m2.state["ufls_active"]) == [0, 0, 1] and m2.state["ufls_timer_s"][0] == 0.0


def test_ufls_state_is_part_of_a_snapshot():
    m = GridModel(read_case(GRIDS / "case14.m"), GridParams())
    m.configure_controls(Agc({"units": [1], "kp": 5.0, "ki": 5.0}, m.case, 50.0),
                         Ufls({"stages": [{"below": 49.9, "pickup_s": 3.0, "buses": [4], "shed": 0.1}]}, m.case, 50.0))
    m.state["gen_on"][1] = 0
    m._topology(inherit=False)
    m.step(1.0)
    snap = m.get_state()
    first = []
    for _ in range(6):
        m.step(1.0)
        first.append({k: v.copy() for k, v in m.out.items()})
    assert first[-1]["ufls_tripped"][0] == 1
    m.set_state(snap)
    for ref in first:
        m.step(1.0)
        for k, v in m.out.items():
            assert np.array_equal(v, ref[k]), k


@pytest.mark.parametrize("extra, key", [
    ("agc = { units = [9], kp = 1.0 }", "agc.units\\[0\\]: 9 is not a generator row in 1..5"),
    ("agc = { units = [1], kp = 1.0, gain = 2 }", "agc.gain: unknown key"),
    ("agc = { units = [1] }", "agc.kp / agc.ki"),
    ("agc = { units = [1], kp = -1.0 }", "agc.kp: -1.0 must be >= 0"),
    ("agc = { units = [1], kp = 1.0, out_min = 50.0, out_max = 10.0 }", "agc.out_min / out_max"),
    ("ufls = { stages = [{ below = 49.5, buses = [4] }] }", "ufls.stages\\[0\\].shed: required"),
    ("ufls = { stages = [{ below = 49.5, buses = [4], shed = 1.5 }] }", "ufls.stages\\[0\\].shed: 1.5"),
    ("ufls = { stages = [{ below = 50.5, buses = [4], shed = 0.1 }] }", "ufls.stages\\[0\\].below: 50.5 Hz"),
    ("ufls = { stages = [{ below = 49.5, buses = [99], shed = 0.1 }] }", "ufls.stages\\[0\\].buses\\[0\\]: 99"),
    ("ufls = { stages = [] }", "ufls.stages: a non-empty list"),
])
def test_bad_control_keys_name_the_key_and_the_reason(tmp_path, extra, key):
    with pytest.raises(ConfigError, match=key):
        load_scenario(_scenario(tmp_path, extra))
