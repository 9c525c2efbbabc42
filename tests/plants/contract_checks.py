"""Conformance checks of the plant contract (plants/base.py), reusable by every plant's
tests: `assert_plant_contract(model, dt)` on a PlantModel (or an "ode" module).

What it asserts (each a way a plant can break the loop, rollback or shadow forks):
- the spec is consistent (groups inside their kinds, discrete nominal integral) and the
  kernels take the arrays of the declared sizes;
- `step` returns t + dt and changes only the state arrays in place (never u or p; the
  arrays stay the same objects: the loop holds views of them);
- outputs at the nominal state and after steps are finite;
- snapshot / restore round-trip bit for bit: n steps after a restore repeat exactly
  (x, z, d and y), also in a second instance restored from the snapshot (a shadow fork);
- the sub-step count follows max_substep.
"""

from __future__ import annotations

import numpy as np

from plants.base import Plant, as_model, substeps_for


def assert_plant_contract(model, dt: float, n_steps: int = 20, setup=None) -> None:
    """Raise AssertionError naming the broken rule. `setup(plant)` may set inputs first
    (the same for every instance); dt in the plant's time unit."""
    model = as_model(model)
    spec = model.spec
    for g in spec.groups:
        assert 0 <= g.start < g.stop <= len(getattr(spec, g.kind)), f"group {g.name} outside {g.kind}"
    assert substeps_for(model, dt) * model.max_substep >= dt * (1 - 1e-12), "sub-steps exceed max_substep"

    def fresh() -> Plant:
        p = Plant(model, dt=dt)
        if setup is not None:
            setup(p)
        return p

    plant = fresh()
    ids = [id(a) for a in (plant.x, plant.z, plant.d, plant.u, plant.p, plant.y)]
    y0 = plant.compute_outputs().copy()
    assert np.isfinite(y0).all(), f"non-finite outputs at the nominal state: {np.flatnonzero(~np.isfinite(y0))}"
    u0, p0 = plant.u.copy(), plant.p.copy()
    t1 = plant._step(plant.t, plant.x, plant.u, plant.p, dt, plant.substeps, plant._work) \
        if plant._work is not None else \
        plant._step(plant.t, plant.x, plant.z, plant.d, plant.u, plant.p, dt, plant.substeps, *plant.aux)
    assert t1 == plant.t + dt, f"step returned {t1}, not t + dt = {plant.t + dt}"
    assert np.array_equal(plant.u, u0) and np.array_equal(plant.p, p0), "step changed u or p"
    plant.t = t1
    for _ in range(n_steps):
        plant.step(dt)
    assert [id(a) for a in (plant.x, plant.z, plant.d, plant.u, plant.p, plant.y)] == ids, "arrays replaced"
    assert plant.d.dtype == np.int64 and plant.z.dtype == np.float64 and plant.x.dtype == np.float64
    assert np.isfinite(plant.compute_outputs()).all(), "non-finite outputs after steps"

    snap = plant.snapshot()
    trace = []
    for _ in range(n_steps):
        plant.step(dt)
        trace.append(np.concatenate([plant.x, plant.z, plant.d.astype(np.float64), plant.compute_outputs()]))
    end = plant.snapshot()
    for other in (plant, fresh()):
        other.restore(snap)
        assert other.snapshot().equals(snap), "restore did not set the whole state"
        again = []
        for _ in range(n_steps):
            other.step(dt)
            again.append(np.concatenate([other.x, other.z, other.d.astype(np.float64), other.compute_outputs()]))
        assert np.array_equal(np.array(trace), np.array(again), equal_nan=True), \
            "a restored plant does not repeat its steps bit for bit (state kept outside x, z, d?)"
        assert other.snapshot().equals(end)
