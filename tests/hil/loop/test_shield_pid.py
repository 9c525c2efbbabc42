"""The in-loop shield's PID fallback (hil/loop/shield.py FB_PID) against the safety process's
FallbackController (hil/safety/fallback.py), step for step.

The reference is what SafetyCore does with its baseline on each observation: `follow` the
applied values that are not the last decision, `update` (dt 0 on the first observation),
choose (the proposal, or the baseline), project (Projector.project: the policy with the
supervisor's band, the baseline without it; box and rate only when a limit is unknown), and
`track` what was decided. The shield runs the same arithmetic in the same order inside its one
compiled call, so the comparison is exact (==), not within a tolerance: any reordering of
the PID's floating-point operations would show here.

Scenario: configs/bioreactor_policy.toml (two PID loops: agitation on dissolved oxygen, base
on pH; the shear limit reads the volume), with the loops given a filtered derivative, one
reverse acting and one going to a safe output on a Bad measurement, so every branch of PID
and FallbackController runs.
"""

import numpy as np
import pytest

from hil.bus.config import action_input_names
from hil.loop.shield import (FALLBACK_BAD, FALLBACK_LATE, FALLBACK_MODE, FALLBACK_UNKNOWN, FB_PID, POLICY,
                             PROJECTED, PS_ACTION, PS_INTEGRAL, Shield)
from hil.safety.fallback import FallbackController
from tests.hil.safety.helpers import scenario

STEP_S = 0.7  # not the scenario's 1 s: a dt of 1 would hide a reordered product (ki e dt)

LOOPS = [
    {"input": "agitation_power", "measurement": "dissolved_oxygen", "setpoint": 40.0, "kp": 1.0, "ki": 0.02,
     "kd": 0.5, "td_filter_s": 3.0, "bias": 13.0, "out_min": 0.0, "out_max": 80.0, "on_bad": "safe"},
    {"input": "base_flow", "measurement": "ph", "setpoint": 5.0, "kp": 0.02, "ki": 0.0005, "kd": 0.001,
     "reverse": True, "bias": 0.0003, "out_min": 0.0, "out_max": 0.005},
]


@pytest.fixture(scope="module")
def bio():
    sc = scenario({"safety": {"placement": "loop", "fallback": {"loops": LOOPS,
                                                                "safe_output": {"agitation_power": 20.0}}}})
    plant = sc.plant.load()
    spec = plant.spec
    names = action_input_names(sc, spec)
    return sc, plant, spec, names


def _reference_step(fc, proj, first, prop, prop_ok, band, applied, last_dec, y, u):
    """SafetyCore's use of its baseline for one observation (see the module docstring)."""
    which = ~(np.abs(last_dec - applied) <= 1e-9 * (1.0 + np.abs(applied)))  # NaN: nothing decided yet
    if which.any():
        fc.follow(applied, which, y, u)
    base = fc.update(y, u, 0.0 if first else STEP_S)
    linear = bool(np.isfinite(y[proj_reads(proj)]).all())
    if prop_ok and linear:
        out, _ = proj.project(prop, applied, STEP_S, y, u, band[0], band[1], linear=True)
    else:
        out, _ = proj.project(base, applied, STEP_S, y, u, linear=linear)
    fc.track(out, y, u)
    return base, out


def proj_reads(proj):
    """The outputs the configured linear limits' b(state) reads."""
    return np.flatnonzero((proj.By != 0).any(axis=0))


def test_the_pid_fallback_is_the_safety_process_fallback_step_for_step(bio):
    sc, plant, spec, names, = bio
    sh = Shield(sc, spec, names, plant=plant, max_age_steps=1)
    assert (sh.fb_kind == FB_PID).all()
    fc = FallbackController(sc.safety.fallback, spec, names, plant=plant)
    proj = sh.projector
    rng = np.random.default_rng(11)
    n = len(names)
    i_do, i_ph, i_vol = (spec.index("outputs", s) for s in ("dissolved_oxygen", "ph", "volume"))
    ia = sh.act_u
    y, u = spec.nominal("outputs"), spec.nominal("inputs")
    out = np.zeros(n)
    last_dec = np.full(n, np.nan)
    band = (np.full(n, -np.inf), np.full(n, np.inf))
    codes = {}
    do, ph = 40.0, 5.0
    for k in range(400):
        do = float(np.clip(do + rng.normal(0.0, 3.0), 5.0, 95.0))
        ph = float(np.clip(ph + rng.normal(0.0, 0.05), 4.0, 6.5))
        y[i_do], y[i_ph], y[i_vol] = do, ph, 100.0 + 0.1 * k
        if k % 23 in (5, 6, 7):
            y[i_do] = np.nan  # a Bad measurement: the agitation loop goes to its safe output
        if k % 31 in (9, 10):
            y[i_ph] = np.nan  # the base loop holds (no windup, derivative restarts)
        if k % 41 == 20:
            y[i_vol] = np.nan  # the shear limit's b(state) is unknown
        # what the actuators carry: the last decision, except an actuator gap now and then
        u[ia] = last_dec if k > 0 else np.array([0.0003, 13.0])
        if k % 37 == 15:
            u[ia] += np.array([0.0004, 3.0])
        prop = rng.uniform(sh.lo, sh.hi) * rng.choice([0.1, 1.0])
        if k % 17 == 3:
            prop[1] = np.nan
        prop_step = k - int(rng.choice([0, 0, 0, 1, 2]))
        allow = (k // 25) % 3 != 1  # spells of the supervisor's "fallback" (mode) decision
        if k % 50 == 40:  # limited mode: the supervisor's band on the policy
            band = (sh.lo + 0.2 * (sh.hi - sh.lo), sh.lo + 0.6 * (sh.hi - sh.lo))
        elif k % 50 == 45:
            band = (np.full(n, -np.inf), np.full(n, np.inf))
        sh.band_lo[:], sh.band_hi[:] = band
        prev = u[ia].copy()
        code = sh.step(k, prop, prop_step, y, u, prev, STEP_S, out, allow)
        codes[code] = codes.get(code, 0) + 1
        prop_ok = allow and k - 1 <= prop_step <= k and bool(np.isfinite(prop).all())
        base, ref = _reference_step(fc, proj, k == 0, prop, prop_ok, band, u[ia].copy(), last_dec, y, u)
        assert (code in (POLICY, PROJECTED)) == (prop_ok and np.isfinite(y[i_vol])), (k, code)
        assert np.array_equal(out, ref), (k, code, out, ref)  # exact: the same operations in the same order
        assert np.array_equal(sh.pid_state[:, PS_ACTION], fc.action), (k, sh.pid_state[:, PS_ACTION], fc.action)
        for li, (pos, pid, *_rest) in enumerate(fc.loops):
            assert sh.pid_state[pos, PS_INTEGRAL] == pid.integral, (k, li)
        last_dec = out.copy()
    # every source and every PID branch ran
    assert {POLICY, PROJECTED, FALLBACK_LATE, FALLBACK_MODE, FALLBACK_BAD, FALLBACK_UNKNOWN} <= set(codes), codes


def test_the_pid_fallback_takes_over_bumplessly_and_acts_on_the_error(bio):
    """Policy acts at 20 W for 10 steps, then the supervisor takes authority away: the PID's first
    output is where the actuator is (tracked), then it moves toward its setpoint (DO below 40 %:
    more agitation), within the rate limit."""
    sc, plant, spec, names = bio
    sh = Shield(sc, spec, names, plant=plant)
    ia, ag = sh.act_u, names.index("agitation_power")
    y, u = spec.nominal("outputs"), spec.nominal("inputs")
    y[spec.index("outputs", "dissolved_oxygen")] = 30.0
    prop = np.array([0.0003, 20.0]) if names[0] == "base_flow" else np.array([20.0, 0.0003])
    u[ia] = prop
    out = np.zeros(len(names))
    for k in range(10):
        assert sh.step(k, prop, k, y, u, u[ia].copy(), STEP_S, out, True) == POLICY
        u[ia] = out
    applied = []
    for k in range(10, 16):
        assert sh.step(k, prop, k, y, u, u[ia].copy(), STEP_S, out, False) == FALLBACK_MODE
        applied.append(out[ag])
        u[ia] = out
    kp, ki, kd = LOOPS[0]["kp"], LOOPS[0]["ki"], LOOPS[0]["kd"]
    # first fallback step: the integral was tracked to 20 W at e = 10, so the output is 20 W
    # plus one step of integral action (ki e dt) and no derivative (DO constant)
    assert kd and applied[0] == pytest.approx(20.0 + ki * 10.0 * STEP_S, abs=1e-12)
    assert all(b > a for a, b in zip(applied, applied[1:]))  # integral action: more agitation each step
    assert all(b - a <= 2.0 * STEP_S + 1e-12 for a, b in zip([20.0] + applied, applied))  # rate 2 W/s
    assert kp == 1.0
