"""The in-loop shield (hil/loop/shield.py) against the safety process's projection.

The reference is what the safety process runs today: `Projector.project` with the plant
families' numpy `fill` (plants/panda.py EnvelopeLimits). The shield must give the same action
(its compiled fill is the same arithmetic in another order: 1e-9 of each input's span, far
below any actuator's resolution), choose the fallback for the reasons it names, and fail closed
when a limit cannot be computed. Asserted on the panda policy scenario's three limit families
(ee_box, joint_position, joint_velocity: 42 rows on 8 actions).
"""

import numpy as np
import pytest

from hil.bus.config import action_input_names
from hil.scenario.config import load_scenario
from hil.loop.shield import (FALLBACK_BAD, FALLBACK_LATE, FALLBACK_MODE, FALLBACK_UNKNOWN, POLICY, PROJECTED,
                             Shield)
from tests.hil.safety.helpers import ROOT

STEP_S = 0.001


@pytest.fixture(scope="module")
def arm():
    sc = load_scenario(ROOT / "configs" / "panda_policy.toml")
    plant = sc.plant.load()
    spec = plant.spec
    names = action_input_names(sc, spec)
    shield = Shield(sc, spec, names, plant=plant, max_age_steps=4)
    return sc, plant, spec, names, shield


def _states(spec, rng, count):
    """Measured outputs at random joint states: positions across the joint range, speeds up to
    +-1 rad/s (the velocity family is active at the top of that)."""
    y = np.tile(spec.nominal("outputs"), (count, 1))
    iq, idq = spec.indices("outputs", "joint.q"), spec.indices("outputs", "joint.dq")
    lo = spec.lows("inputs")[spec.indices("inputs", "joint.q_target")]
    hi = spec.highs("inputs")[spec.indices("inputs", "joint.q_target")]
    y[:, iq] = lo + (hi - lo) * rng.uniform(0.1, 0.9, size=(count, iq.size))
    y[:, idq] = rng.uniform(-1.0, 1.0, size=(count, idq.size))
    return y


def test_compiled_panda_fill_equals_the_numpy_families(arm):
    sc, plant, spec, names, shield = arm
    rng = np.random.default_rng(1)
    proj = shield.projector
    u = spec.nominal("inputs")
    m0 = shield.m_static
    for y in _states(spec, rng, 50):
        proj._fill_families(y, u)
        W, b = np.zeros_like(shield.W[m0:]), np.zeros_like(shield.b0[m0:])
        shield.fill(y, W, b, *shield.fill_args)
        np.testing.assert_allclose(W, proj.W[m0:], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(b, proj.b0[m0:], rtol=1e-12, atol=1e-12)


def test_fresh_proposal_projects_exactly_as_the_safety_process(arm):
    sc, plant, spec, names, shield = arm
    rng = np.random.default_rng(2)
    proj = shield.projector
    u = spec.nominal("inputs")
    ua = shield.act_u
    out = np.zeros(len(names))
    seen = {POLICY: 0, PROJECTED: 0}
    for y in _states(spec, rng, 200):
        prev = np.clip(u[ua] + rng.normal(0.0, 2.0, len(names)), shield.lo, shield.hi)
        a = rng.uniform(shield.lo, shield.hi) * rng.choice([0.05, 1.0])  # some inside, many far out
        ref, _ = proj.project(a, prev, STEP_S, y, u)
        code = shield.step(100, a, 99, y, u, prev, STEP_S, out)
        assert code in (POLICY, PROJECTED)
        seen[code] += 1
        assert (code == POLICY) == np.array_equal(ref, a)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-9 * shield.scale.max())
    assert seen[POLICY] > 5 and seen[PROJECTED] > 50, seen  # both branches exercised


def test_fallback_reasons_and_joint_pd_hold(arm):
    sc, plant, spec, names, shield = arm
    y = _states(spec, np.random.default_rng(3), 1)[0]
    u = spec.nominal("inputs")
    prev = u[shield.act_u].copy()
    a = prev.copy()
    out = np.zeros(len(names))
    assert shield.step(10, a, 6, y, u, prev, STEP_S, out) in (POLICY, PROJECTED)  # age 4: still fresh
    assert shield.step(10, a, 5, y, u, prev, STEP_S, out) == FALLBACK_LATE  # age 5 > max_age_steps
    assert shield.step(10, a, 11, y, u, prev, STEP_S, out) == FALLBACK_LATE  # for a future step: not ours
    assert shield.step(10, a, 10, y, u, prev, STEP_S, out, allow_policy=False) == FALLBACK_MODE
    bad = a.copy()
    bad[0] = np.nan
    assert shield.step(10, bad, 10, y, u, prev, STEP_S, out) == FALLBACK_BAD
    # the joint PD holds the position latched when the fallback took over: q moved by +0.01 rad
    # since, at rest -> tau = -kp * 0.01 on the torque inputs; the gripper holds its applied value
    iq, idq = spec.indices("outputs", "joint.q"), spec.indices("outputs", "joint.dq")
    shield.state[0] = 0
    y0 = y.copy()
    y0[idq] = 0.0
    shield.step(20, a, 0, y0, u, prev, STEP_S, out)
    y1 = y0.copy()
    y1[iq] += 0.01
    assert shield.step(21, a, 0, y1, u, prev, STEP_S, out) == FALLBACK_LATE
    tau = [names.index(n) for n in spec.expand("inputs", "joint.tau_target")]
    kp = np.array(sc.safety.fallback.joint_pd[0].kp)
    np.testing.assert_allclose(shield.a[tau], -kp * 0.01, rtol=1e-12)
    grip = names.index("gripper.width_target")
    assert shield.a[grip] == u[spec.index("inputs", "gripper.width_target")]
    # and the fallback is projected as the safety process projects it
    ref, _ = shield.projector.project(shield.a.copy(), prev, STEP_S, y1, u)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-9 * shield.scale.max())


def test_a_bad_reading_a_limit_needs_fails_closed(arm):
    sc, plant, spec, names, shield = arm
    y = _states(spec, np.random.default_rng(4), 1)[0]
    y[spec.indices("outputs", "joint.dq")[2]] = np.nan
    u = spec.nominal("inputs")
    prev = u[shield.act_u].copy()
    out = np.zeros(len(names))
    code = shield.step(5, prev + 1.0, 5, y, u, prev, STEP_S, out)
    assert code == FALLBACK_UNKNOWN
    assert np.isfinite(out).all() and (out >= shield.lo).all() and (out <= shield.hi).all()


def test_bound_shield_is_step_into_bit_for_bit(arm):
    """The loop's bound form (one jitclass argument, arrays shared) against the 45-argument
    call, on two shields of the same configuration over one sequence of states and proposals:
    fresh, late, not allowed, non-finite; the fallback's latched reference included."""
    sc, plant, spec, names, _ = arm
    ref_sh = Shield(sc, spec, names, plant=plant, max_age_steps=4)
    sh = Shield(sc, spec, names, plant=plant, max_age_steps=4)
    rng = np.random.default_rng(5)
    n = len(names)
    apply_pos = np.arange(n)
    apply_index = sh.act_u.copy()
    y, u, prop = spec.nominal("outputs"), spec.nominal("inputs"), np.zeros(n)
    prev, out, u_cmd = np.zeros(n), np.zeros(n), spec.nominal("inputs")
    bound = sh.bind(prop, y, u, prev, STEP_S, out, u_cmd, apply_index, apply_pos)
    assert sh.state[0] == 0 and np.isnan(sh.q_ref).all()  # binding ran nothing
    r_prev, r_out, r_ucmd = np.zeros(n), np.zeros(n), u_cmd.copy()
    codes = set()
    for k, ys in enumerate(_states(spec, rng, 120), start=10):
        y[:] = ys
        u[sh.act_u] = np.clip(rng.normal(0.0, 3.0, n), sh.lo, sh.hi)
        prop[:] = rng.uniform(sh.lo, sh.hi) * rng.choice([0.05, 1.0])
        if k % 17 == 0:
            prop[0] = np.nan
        prop_step = k - int(rng.choice([0, 1, 4, 5, 9]))
        allow = bool(k % 11)
        want = ref_sh.step_into(k, prop, prop_step, y, u, r_prev, STEP_S, r_out, allow, r_ucmd, apply_index, apply_pos)
        got = bound.step(k, prop_step, allow)
        codes.add(got)
        assert got == want
        assert np.array_equal(out, r_out) and np.array_equal(u_cmd, r_ucmd) and np.array_equal(prev, r_prev)
        assert np.array_equal(sh.q_ref, ref_sh.q_ref, equal_nan=True) and sh.state[0] == ref_sh.state[0]
    assert {POLICY, PROJECTED, FALLBACK_LATE, FALLBACK_MODE, FALLBACK_BAD} <= codes, codes


def test_bind_refuses_a_strided_array(arm):
    sc, plant, spec, names, shield = arm
    n = len(names)
    y = np.zeros((spec.n_outputs, 2))[:, 0]
    with pytest.raises(ValueError, match="y must be a C-contiguous array"):
        shield.bind(np.zeros(n), y, spec.nominal("inputs"), np.zeros(n), STEP_S, np.zeros(n),
                    spec.nominal("inputs"), shield.act_u.copy(), np.arange(n))
