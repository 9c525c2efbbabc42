"""PID block (hil/control/pid.py): closed-loop behaviour, limits, anti-windup, bumpless reset."""

import math

import numpy as np
import pytest

from hil.control.pid import PID


def _lag_step(y, u, gain, tau_s, dt):
    """Exact step of y' = (gain * u - y) / tau over dt with u held."""
    return gain * u + (y - gain * u) * math.exp(-dt / tau_s)


def _closed_loop(pid, sp, n, gain=2.0, tau_s=5.0, dt=0.1, y0=0.0):
    y, ys, us = y0, [], []
    for _ in range(n):
        u = pid.update(sp, y, dt)
        y = _lag_step(y, u, gain, tau_s, dt)
        ys.append(y)
        us.append(u)
    return np.array(ys), np.array(us)


def test_p_only_leaves_the_analytic_offset_and_pi_removes_it():
    gain, kp, sp = 2.0, 1.5, 10.0
    ys, _ = _closed_loop(PID(kp=kp), sp, 2000, gain=gain)
    # steady state of y = gain * kp * (sp - y): y = sp * g kp / (1 + g kp)
    assert ys[-1] == pytest.approx(sp * gain * kp / (1 + gain * kp), rel=1e-9)
    ys, _ = _closed_loop(PID(kp=kp, ki=0.5), sp, 2000, gain=gain)
    assert ys[-1] == pytest.approx(sp, abs=1e-6)


def test_step_response_settles_without_large_overshoot():
    ys, us = _closed_loop(PID(kp=1.0, ki=0.3, out_min=0.0, out_max=20.0), 10.0, 600)
    assert ys.max() < 10.0 * 1.10  # a well-tuned PI on a lag: < 10 % overshoot
    t_settle = np.flatnonzero(np.abs(ys - 10.0) > 0.2)[-1] * 0.1
    assert t_settle < 30.0
    assert us.min() >= 0.0 and us.max() <= 20.0


def test_output_never_leaves_its_limits():
    rng = np.random.default_rng(0)
    pid = PID(kp=5.0, ki=2.0, kd=0.5, out_min=-1.0, out_max=3.0)
    for _ in range(5000):
        u = pid.update(rng.normal(0, 10), rng.normal(0, 10), 0.05)
        assert -1.0 <= u <= 3.0


def test_anti_windup_leaves_the_limit_as_soon_as_the_error_changes_sign():
    """After a long saturation the output comes off the limit on the first step of opposite error."""
    pid = PID(kp=0.5, ki=1.0, out_min=0.0, out_max=10.0)
    for _ in range(10_000):  # 1000 s asking for more than the limit can give
        assert pid.update(100.0, 5.0, 0.1) == 10.0
    u = pid.update(4.0, 5.0, 0.1)  # now the measurement is above the setpoint
    assert u < 10.0
    # the scenario discriminates: an integrator without anti-windup is still pinned at the limit
    integral = 0.0
    for _ in range(10_000):
        integral += 1.0 * (100.0 - 5.0) * 0.1
    integral += 1.0 * (4.0 - 5.0) * 0.1
    assert min(max(0.5 * (4.0 - 5.0) + integral, 0.0), 10.0) == 10.0


def test_reverse_acting_output_rises_above_setpoint():
    pid = PID(kp=2.0, reverse=True, out_min=0.0, out_max=100.0)
    assert pid.update(300.0, 305.0, 0.1) == pytest.approx(10.0)
    assert pid.update(300.0, 295.0, 0.1) == 0.0


def test_bumpless_reset_continues_from_the_held_output():
    pid = PID(kp=0.8, ki=0.4, out_min=0.0, out_max=50.0)
    # at zero error the next output is exactly the preloaded one
    pid.reset(output=17.0, measurement=20.0)
    assert pid.update(20.0, 20.0, 0.1) == pytest.approx(17.0, abs=1e-12)
    # with an error, preloading (held - P) moves the output by the integral step only
    sp, pv, dt = 25.0, 20.0, 0.1
    pid.reset(output=17.0 - 0.8 * (sp - pv), measurement=pv)
    assert pid.update(sp, pv, dt) == pytest.approx(17.0 + 0.4 * (sp - pv) * dt, abs=1e-12)


def test_derivative_acts_on_the_measurement_not_the_setpoint():
    pid = PID(kp=0.0, kd=2.0)
    pid.update(0.0, 1.0, 0.1)
    assert pid.update(50.0, 1.0, 0.1) == 0.0  # setpoint step: no kick
    assert pid.update(50.0, 1.5, 0.1) == pytest.approx(-2.0 * 0.5 / 0.1)


def test_bad_inputs_hold_the_output():
    pid = PID(kp=1.0, ki=1.0, out_min=0.0, out_max=10.0)
    u = pid.update(5.0, 3.0, 0.1)
    held = pid.update(5.0, math.nan, 0.1)
    assert held == pytest.approx(pid.integral) and held <= u
    assert pid.update(5.0, 3.0, 0.0) == held  # dt = 0: no execution


def test_inverted_limits_are_rejected():
    with pytest.raises(ValueError, match="inverted"):
        PID(kp=1.0, out_min=2.0, out_max=1.0)
