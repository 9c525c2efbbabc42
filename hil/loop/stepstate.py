"""One instance's step arrays as one Numba object, so that a step is one cheap compiled call.

Calling a compiled function from Python unboxes every argument: the fused step of
hil/loop/step.py takes 33 (27 arrays), about 2.5 us per call on this project's machine before any
arithmetic (benchmarks/loop_overhead.py). A `StepState` holds the same arrays once (a Numba
StructRef: a reference to each array, no copy; writes through it are writes to the arrays), so
the per-step call unboxes one pointer and three numbers:

    state = StepState(*args)                        # row_step's arguments after k, before wall_ns
    kern.row_step_state(state, k, wall_ns, late_us) # == kern.row_step(k, *args, wall_ns, late_us)

`row_step_state` is written per plant with the fused step (hil/loop/specialize.py) and cached
by Numba like it. Its fields are FIELDS, in row_step's order (hil/loop/specialize.py _ROW_ARGS).
The StructRef's constructor is compiled once per process and plant (about 0.3 s; LoopStep.warm_up,
before the clock starts).
"""

from __future__ import annotations

from numba.core import types
from numba.experimental import structref

FIELDS = ("tp", "x", "z", "d", "p", "u_cmd", "u_clip", "u_app", "y", "y_meas", "W", "aux", "act_buf", "sense_buf",
          "counts", "u_lo", "u_hi", "x_lo", "x_hi", "x_tol", "x_out", "c_W", "c_lo", "c_scale", "c_idx", "c_incr",
          "row", "step_s", "dt", "n_sub")


@structref.register
class StepStateType(types.StructRef):
    """The Numba type of a StepState: one field per row_step argument (FIELDS)."""

    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class StepState(structref.StructRefProxy):
    """The step's arrays (and step_s, dt in s and plant units, n_sub) of one instance."""


structref.define_proxy(StepState, StepStateType, list(FIELDS))
