"""Fixed-step integrators shared by the ODE plants ("ode" form, plants/base.py).

Plants of the "step" form (a model built at load time: algebraic unknowns, events,
semi-implicit or quasi-static steps) bring their own integrator in their `step` kernel and
use none of this; the (5, n_states) RK4 workspace exists only for "ode" plants.

The derivative function is passed in as a Numba dispatcher, so any plant can be integrated
with them. Numba cannot cache a kernel that takes (or closes over) a dispatcher: the cache
never hits and grows in every process. So these are not cached; they are the reference
the plants' own cached kernels (which call their `derivatives` as a plain global, e.g.
plants/bioreactor.py `step`) are tested against bit for bit, and the generic path for
ad-hoc integration of a new model.

Derivative contract (all float64, SI or the plant's stated units, time in the plant's
time unit):

    derivatives(t, x, u, p, dxdt) -> None   # writes dx/dt into dxdt, allocates nothing

`work` is a preallocated (5, n_states) float64 buffer; nothing is allocated per step.
"""

from __future__ import annotations

from numba import njit


@njit(nogil=True)
def rk4_step(derivatives, t, x, u, p, dt, n_sub, work):
    """Advance x in place by dt with n_sub classical RK4 sub-steps of dt / n_sub.

    t: time at the start of the step; dt: step length (plant time unit); u is held
    constant over the step (zero-order hold, as a PLC output is). Returns t + dt.
    """
    k1 = work[0]
    k2 = work[1]
    k3 = work[2]
    k4 = work[3]
    tmp = work[4]
    n = x.size
    h = dt / n_sub
    for s in range(n_sub):
        ts = t + s * h
        derivatives(ts, x, u, p, k1)
        for i in range(n):
            tmp[i] = x[i] + 0.5 * h * k1[i]
        derivatives(ts + 0.5 * h, tmp, u, p, k2)
        for i in range(n):
            tmp[i] = x[i] + 0.5 * h * k2[i]
        derivatives(ts + 0.5 * h, tmp, u, p, k3)
        for i in range(n):
            tmp[i] = x[i] + h * k3[i]
        derivatives(ts + h, tmp, u, p, k4)
        for i in range(n):
            x[i] += (h / 6.0) * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i])
    return t + dt
