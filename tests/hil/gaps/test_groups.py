"""[gaps] keys naming array groups (hil/gaps/groups.py): expanded once to elements, an
element's own entry winning; problems reported at the key as written."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hil.gaps.config import GapsSection
from hil.gaps.groups import expand_groups, report_at_origin
from hil.gaps.pipeline import GapPipeline
from plants.base import load_plant

SPEC = load_plant("tests.plants.array_plant",
                  {"file": str(Path(__file__).parents[2] / "plants" / "data" / "heaters.toml")}).spec
TEMPS = [f"node_{i}.temp" for i in (3, 7, 12, 20)]


def _section(**kw) -> GapsSection:
    return GapsSection.model_validate({"max_delay_s": 10.0, **kw})


def test_groups_expand_with_element_overrides_and_latency_signals():
    sec = _section(sensors={"node.temp": {"bias": 0.5}, "node_7.temp": {"bias": -1.0}, "node.power[0]": {"bias": 2.0}},
                   latency={"observation": {"temps": {"signals": ["node.temp"], "dist": "constant", "value_s": 2.0},
                                            "node.tripped": {"dist": "constant", "value_s": 1.0}}},
                   randomize={"plant": {"node.capacity": {"dist": "uniform", "low": 0.9, "high": 1.1,
                                                          "relative": True}}})
    new, origin = expand_groups(sec, SPEC)
    assert {k: v.bias for k, v in new.sensors.items()} == {
        "node_3.temp": 0.5, "node_7.temp": -1.0, "node_12.temp": 0.5, "node_20.temp": 0.5, "node_3.power": 2.0}
    assert new.latency.observation["temps"].signals == TEMPS
    assert new.latency.observation["node.tripped"].signals == [f"node_{i}.tripped" for i in (3, 7, 12, 20)]
    assert sorted(new.randomize.plant) == sorted(f"node_{i}.capacity" for i in (3, 7, 12, 20))
    assert origin["gaps.sensors.node_12.temp"] == "gaps.sensors.node.temp"
    assert report_at_origin([("gaps.sensors.node_3.temp.bits", "x"), ("gaps.sensors.node_12.temp.bits", "x"),
                             ("gaps.sensors.node_7.temp.bits", "y")], origin) == [
        ("gaps.sensors.node.temp.bits", "x"), ("gaps.sensors.node_7.temp.bits", "y")]


def test_pipeline_applies_a_group_gap_to_every_element_and_delays_a_group_channel():
    sec = _section(sensors={"node.temp": {"bias": 0.5}},
                   latency={"observation": {"temps": {"signals": ["node.temp"], "dist": "constant", "value_s": 2.0}}})
    gaps = GapPipeline.build(sec, SPEC, 1.0, 0)
    y, meas = SPEC.nominal("outputs"), np.zeros(SPEC.n_outputs)
    temps = SPEC.indices("outputs", "node.temp")
    seen = []
    for k in range(5):
        y[temps] = 300.0 + k
        gaps.sense(float(k + 1), y, meas)
        seen.append(meas[temps].copy())
    # 2 s delay at 1 s steps: step k shows the value of step k - 2, plus the group's bias
    assert np.allclose(seen[4], 300.0 + 2 + 0.5) and np.allclose(seen[3], 300.0 + 1 + 0.5)
