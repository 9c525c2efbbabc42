"""A scenario around the test plant tests/plants/array_plant.py, written next to a copy of
its model file (the plant's `file` option is relative to the scenario, as every path)."""

from __future__ import annotations

import shutil
from pathlib import Path

MODEL_FILE = Path(__file__).parent / "data" / "heaters.toml"

BASE = """
[scenario]
name = "heaters"

[plant]
model = "tests.plants.array_plant"
file = "model/heaters.toml"

[plant.initial_state]
node_20.temp = 335.0          # nested keys spell the dotted name "node_20.temp"
node_12.trip = 1              # a discrete state: node 12 starts tripped

[loop]
step_s = 1.0
time_scale = {time_scale}
duration_s = {duration_s}
priority = 0
cpu = -1

[inputs.heater_3.duty]
driver = "fixed"
value = 1.0

[inputs.heater_7.duty]
value = 1.0                   # plc-driven (the default), starts at full duty

[inputs.reset]
driver = "fixed"
value = 0.0

[gaps.sensors.node.temp]      # the whole group node.temp[4] ...
bias = 0.5

[gaps.sensors.node_7.temp]    # ... and one element's own entry, which wins
bias = -1.0

[recording]
path = "runs/{{scenario}}"
"""


def write_scenario(directory: Path, *, time_scale: float = 1.0, duration_s: float = 1800.0, extra: str = "") -> Path:
    """scenario.toml in `directory` (model file copied to directory/model/); returns its path."""
    (directory / "model").mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL_FILE, directory / "model" / "heaters.toml")
    path = directory / "scenario.toml"
    path.write_text(BASE.format(time_scale=time_scale, duration_s=duration_s) + extra)
    return path
