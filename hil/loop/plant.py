"""A scenario's plant instance as every mode builds it: the PlantModel with the scenario's
options, sub-steps for the loop step, parameter and initial-state overrides, nominal inputs,
and the residual model's arrays ([plant] residual_model), checked against the plant."""

from __future__ import annotations

from hil.errors import ConfigError
from plants.base import Plant


def scenario_plant(sc) -> Plant:
    """The configured Plant of scenario `sc` (dt = loop.step_s in the plant's time unit)."""
    model = sc.plant.load()  # PlantModel: built once per process from its model file, if any
    plant = Plant(model, sc.plant.substeps, dt=sc.loop.step_s / model.time_unit_s)
    spec = plant.spec
    for name, value in sc.plant.parameters.items():
        plant.p[spec.index("params", name)] = value
    for name, value in sc.plant.initial_state.items():
        if spec.has("states", name):
            plant.x[spec.index("states", name)] = value
        else:  # a discrete state (validated in hil/scenario/config.py)
            plant.d[spec.index("discrete", name)] = int(value)
    plant.u[:] = spec.nominal("inputs")
    return plant


def load_correction(path, spec):
    """plant.residual_model: the residual model's arrays, checked against the plant (ConfigError)."""
    if not path:
        return None
    from hil.calibration.residual import ResidualModel

    try:
        return ResidualModel.load(path, spec).arrays()
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError("plant.residual_model", str(exc)) from None
