"""The fault library: each kind changes what the loop applies / serves inside its window only."""

import math

import numpy as np
import pytest

from hil.campaign.faults import build_fault, check_fault
from hil.campaign.stage import FaultStage
from hil.errors import ConfigError
from plants.base import Plant, load_plant_module

MOD = load_plant_module("bioreactor")
SPEC = MOD.SPEC


def _stage(cfg, start_s=10.0, duration_s=5.0, shape="step", n=40, seed=1):
    plant = Plant(MOD, None, dt=1.0 / 3600)
    args = check_fault(cfg, "faults.f", SPEC, MOD)
    f = build_fault("f", cfg["kind"], args, start_s, duration_s, shape, SPEC, MOD, 1.0)
    return FaultStage([f], plant, n, 1.0, seed), plant


def _serve(stage, n=40, which="sense"):
    """Drive the stage for n steps with y = step index in every output; return what it served."""
    out = []
    for k in range(n):
        stage.pre(k, float(k))
        if which == "sense":
            y = np.full(SPEC.n_outputs, float(k))
            stage.sense(k, k + 1.0, y)
        else:  # as in the loop: the applied inputs are the plant's own input array
            y = stage.plant.u
            y[:] = float(k)
            stage.actuate(k, float(k), y)
        out.append(y.copy())
    return np.array(out)


def test_sensor_stuck_holds_the_last_served_value_inside_the_window_only():
    st, _ = _stage({"kind": "sensor_stuck", "signal": "dissolved_oxygen"})
    y = _serve(st)
    i = SPEC.index("outputs", "dissolved_oxygen")
    assert np.all(y[10:15, i] == 9.0)  # the value served at step 9
    assert y[9, i] == 9.0 and y[15, i] == 15.0
    j = SPEC.index("outputs", "ph")
    assert np.all(y[:, j] == np.arange(40))  # other signals untouched


def test_sensor_dropout_bad_serves_nan_and_bias_ramp_grows():
    st, _ = _stage({"kind": "sensor_dropout", "signal": "ph"})
    y = _serve(st)
    i = SPEC.index("outputs", "ph")
    assert np.isnan(y[10:15, i]).all() and np.isfinite(y[15:, i]).all()
    st, _ = _stage({"kind": "sensor_bias", "signal": "ph", "bias": 1.0}, shape="ramp")
    y = _serve(st)
    assert np.allclose(y[10:15, i] - np.arange(10, 15), [0.2, 0.4, 0.6, 0.8, 1.0])


def test_actuator_degraded_and_saturated_change_the_applied_value():
    st, _ = _stage({"kind": "actuator_degraded", "signal": "agitation_power", "gain": 0.5})
    u = _serve(st, which="actuate")
    i = SPEC.index("inputs", "agitation_power")
    assert np.allclose(u[10:15, i], 0.5 * np.arange(10, 15)) and u[15, i] == 15.0
    st, _ = _stage({"kind": "actuator_saturated", "signal": "agitation_power", "high": 3.0})
    u = _serve(st, which="actuate")
    assert np.all(u[10:15, i] == 3.0)


def test_actuator_stuck_holds_the_value_applied_before_the_fault():
    st, _ = _stage({"kind": "actuator_stuck", "signal": "feed_rate"})
    u = _serve(st, which="actuate")
    i = SPEC.index("inputs", "feed_rate")
    assert np.all(u[10:15, i] == 9.0) and u[15, i] == 15.0


def test_latency_spike_serves_older_values_without_overtaking():
    st, _ = _stage({"kind": "latency_spike", "path": "observation", "delay_s": 3.0, "signals": ["ph"]})
    y = _serve(st)
    i = SPEC.index("outputs", "ph")
    # from step 10 the served value freezes until it is 3 steps old; it never goes back in time
    assert list(y[10:15, i]) == [9, 9, 9, 10, 11]
    assert y[15, i] == 15 and np.all(np.diff(y[:, i]) >= 0)


def test_jitter_burst_is_seeded_and_monotonic():
    a = _serve(_stage({"kind": "jitter_burst", "path": "observation", "max_s": 4.0}, duration_s=20, seed=3)[0])
    b = _serve(_stage({"kind": "jitter_burst", "path": "observation", "max_s": 4.0}, duration_s=20, seed=3)[0])
    c = _serve(_stage({"kind": "jitter_burst", "path": "observation", "max_s": 4.0}, duration_s=20, seed=4)[0])
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.all(np.diff(a[:, 0]) >= 0) and (a[10:30, 0] < np.arange(10, 30)).any()


def test_param_jump_and_restore():
    st, plant = _stage({"kind": "param_jump", "param": "kla_alpha", "factor": 0.5})
    i = SPEC.index("params", "kla_alpha")
    p0 = plant.p[i]
    seen = []
    for k in range(20):
        st.pre(k, float(k))
        seen.append(plant.p[i])
    assert seen[9] == p0 and seen[10] == 0.5 * p0 and seen[14] == 0.5 * p0 and seen[15] == p0


def test_plant_contributed_fault_kind(monkeypatch):
    calls = []
    monkeypatch.setattr(MOD, "FAULTS", {"trip": {
        "doc": "test", "args": {"element": 0},
        "begin": lambda x, p, a: calls.append(("begin", a["element"])) or 7,
        "end": lambda x, p, a, saved: calls.append(("end", saved))}}, raising=False)
    st, _ = _stage({"kind": "trip", "element": 2})
    _serve(st)
    assert calls == [("begin", 2), ("end", 7)]


@pytest.mark.parametrize("cfg, key", [
    ({"kind": "sensor_stuck", "signal": "nope"}, "faults.f.signal"),
    ({"kind": "warp_drive"}, "faults.f.kind"),
    ({"kind": "sensor_bias", "signal": "ph"}, "faults.f.bias"),
    ({"kind": "sensor_bias", "signal": "ph", "bias": 1.0, "gain": 2.0}, "faults.f.gain"),
    ({"kind": "param_jump", "param": "mu_x"}, "faults.f"),
])
def test_bad_fault_tables_name_the_key(cfg, key):
    with pytest.raises(ConfigError) as e:
        check_fault(cfg, "faults.f", SPEC, MOD)
    assert e.value.path == key
