"""Everything that consumes a spec, on a plant whose spec is built from a model file with
array signals (tests/plants/array_plant.py), in a lockstep run: the scenario's relative
model path, nested names, --set on an element, gaps on an array group with an element's own
override, recording columns per element (states, algebraic and discrete included), the
plot of a group, and snapshot/restore of the event state after the run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hil.cli import parse_settings
from hil.scenario.config import load_scenario
from hil.errors import ConfigError
from hil.recorder import read_recording
from hil.runtime import Runtime
from tests.plants.heaters_scenario import write_scenario


def test_lockstep_run_records_per_element_with_group_gaps_and_event_state(tmp_path, monkeypatch):
    path = write_scenario(tmp_path / "sc", duration_s=1800.0)
    monkeypatch.chdir(tmp_path)  # the model file resolves against the scenario, not the cwd
    sc = load_scenario(path, parse_settings(["inputs.heater_12.duty.value=0.7"]))
    assert sc.plant.options == {"file": str(tmp_path / "sc" / "model" / "heaters.toml")}
    assert sc.inputs["heater_12.duty"].value == 0.7 and sc.plant.initial_state["node_20.temp"] == 335.0
    with Runtime(sc, lockstep=True) as rt:
        assert rt.plant.substeps == 5  # the model file's max sub-step: 0.2 s
        summary = rt.run()
        assert summary.exit_code == 0 and summary.steps == 1800
        # snapshot/restore of the whole state after the run: the trips and the warm start too
        plant = rt.plant
        snap = plant.snapshot()
        for _ in range(50):
            plant.step(1.0)
        y1 = plant.compute_outputs().copy()
        plant.restore(snap)
        for _ in range(50):
            plant.step(1.0)
        assert np.array_equal(plant.compute_outputs(), y1)
    df = read_recording(summary.record_path)
    meta = json.loads((Path(summary.record_path) / "_meta.json").read_text())
    ids = (3, 7, 12, 20)
    for i in ids:
        for col in (f"x.node_{i}.temp", f"y.node_{i}.power", f"cmd.heater_{i}.duty", f"d.node_{i}.trip"):
            assert col in df.columns, col
    assert "z.supply.voltage" in df.columns and meta["groups"]["outputs.node.temp"] == [0, 4, "K"]
    assert meta["units"]["y.node_3.temp"] == "K"
    # gaps: the group's bias on every element, node 7's own entry instead of it (exact: bias only)
    for i, bias in zip(ids, (0.5, -1.0, 0.5, 0.5)):
        assert np.allclose(df[f"meas.node_{i}.temp"] - df[f"y.node_{i}.temp"], bias, rtol=0, atol=1e-9), i
    # what the loop applied: --set on one element, fixed and plc commands
    assert (df["app.heater_12.duty"] == 0.7).all() and (df["app.heater_3.duty"] == 1.0).all()
    # discrete state: node 12 started tripped (its heater does nothing), node 3 trips by an
    # event inside the run; algebraic: the source voltage recorded every step
    assert (df["d.node_12.trip"] == 1).all() and (df["y.node_12.power"] == 0).all()
    first = df.index[df["d.node_3.trip"] == 1]
    assert len(first) and df["d.node_3.trip"].iloc[0] == 0
    k = first[0]
    assert df["x.node_3.temp"].iloc[k] > 340.0 and df["y.node_3.power"].iloc[k] == 0.0
    assert df["y.node_3.power"].iloc[k - 3] > 0.0
    assert df["z.supply.voltage"].between(0.0, 50.0).all()

    # hil plot: a group as one panel, an element by name
    from hil.plot import plot_recording

    png = plot_recording(summary.record_path, tmp_path / "p.png", ["node.temp", "node_3.power", "heater.duty"])
    assert png.stat().st_size > 10_000
    with pytest.raises(KeyError, match="node.tmp"):
        plot_recording(summary.record_path, tmp_path / "q.png", ["node.tmp"])


def test_plant_option_errors_name_the_key(tmp_path):
    path = write_scenario(tmp_path, extra="")
    text = path.read_text()
    path.write_text(text.replace('file = "model/heaters.toml"', 'file = "model/nope.toml"'))
    with pytest.raises(ConfigError) as e:
        load_scenario(path)
    assert "plant.file" in str(e.value) and "nope.toml" in str(e.value)
    path.write_text(text.replace('file = "model/heaters.toml"', 'file = "model/heaters.toml"\ncase = "x.m"'))
    with pytest.raises(ConfigError, match=r"plant.case: .*has no option 'case'"):
        load_scenario(path)
    path.write_text(text.replace("node_12.trip = 1", "node_12.trip = 0.5"))
    with pytest.raises(ConfigError, match=r"plant.initial_state.node_12.trip: 0.5 is not an integer"):
        load_scenario(path)
    path.write_text(text.replace("[gaps.sensors.node_7.temp]", "[gaps.sensors.node_9.temp]"))
    with pytest.raises(ConfigError, match=r"gaps.sensors.node_9.temp: heaters has no output 'node_9.temp' "
                                          r"\(known: node.temp\[4\]"):
        load_scenario(path)
    path.write_text(text + "\n[gaps.actuators.heater.duty]\nrate_limit = -1.0\n")
    with pytest.raises(ConfigError) as e:
        load_scenario(path)
    assert str(e.value).count("gaps.actuators.heater.duty.rate_limit") == 1  # once, at the group key


def test_plant_spread_randomizes_through_the_plant_hook(tmp_path):
    path = write_scenario(tmp_path, duration_s=5.0, extra="\n[gaps.randomize]\nplant_spread = 0.3\n"
                                                          "[gaps.randomize.plant.ambient]\ndist = \"uniform\"\n"
                                                          "low = 280.0\nhigh = 290.0\n")
    sc = load_scenario(path)
    with Runtime(sc, lockstep=True, record=False) as rt:
        spec, p = rt.spec, rt.plant.p
        cap, gamb = spec.indices("params", "node.capacity"), spec.indices("params", "node.g_ambient")
        base = spec.nominal("params")
        s = p[cap] / base[cap]
        assert not np.allclose(s, 1.0)  # drawn
        assert np.allclose(p[gamb] / base[gamb], s ** (2 / 3))  # structured: capacity and surface together
        assert 280.0 <= p[spec.index("params", "ambient")] <= 290.0  # a named draw after the hook
        assert set(rt.drawn) >= {"plant.node_3.capacity", "plant.ambient"}
    # a plant without a hook: plant_spread is refused, naming the key
    from hil.scenario.config import parse_scenario

    data = {"scenario": {"name": "b"}, "plant": {"model": "bioreactor"}, "loop": {"step_s": 1.0, "duration_s": 5.0},
            "gaps": {"randomize": {"plant_spread": 0.1}}}
    with pytest.raises(ConfigError, match=r"gaps.randomize.plant_spread: bioreactor has no randomization hook"):
        parse_scenario(data)
