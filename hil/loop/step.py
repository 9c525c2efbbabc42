"""The loop step: one compiled kernel every mode calls (`hil run` lockstep and real time,
hil.gym's HilEnv and HilVectorEnv, campaign workers through Runtime, the sysid simulator).

One step k of one plant instance (simulated seconds t = k * step_s; plant time unit inside
the plant; every array preallocated, nothing allocated):

    decide                (outside: image / profiles / bus / action -> u_cmd; later the shield)
    actuate_stage         clip u_cmd to the physical bounds (a non-finite command holds the
                          applied one) -> u_clip; actuation latency + actuator gap -> u_app
    [hooks.actuate]       (staged path only: campaign faults on u_app)
    advance               the plant's own kernel, sub-steps, zero-order hold on u_app
    correct_stage         residual correction (hil/calibration/residual.py), then the state
                          check: status -1 non-finite state, else states outside their bounds
    outputs               true outputs y (skipped when the state is not finite)
    sense_stage           sensor gap + observation latency -> y_meas (at t + step_s)
    [hooks.sense]         (staged path only: campaign faults on y_meas)
    record_stage          the recording row (hil/recorder.py columns_for): k, t_end, wall ns,
                          lateness us, cmd, app, x, y, meas, z, d

`row_step` is that sequence as one Numba call (the fused path). `LoopStep.step` calls it
when the plant's kernels are compiled and no Python hook is set; otherwise (a campaign's
FaultStage, or a plant whose step is Python orchestrating Numba kernels, as the grid's) it
calls the very same stage kernels one by one with the hooks and the plant call between
them (the staged path): both paths give bit-identical results (tests/hil/loop/test_step.py).
The batch form (`batch_step`) is `row_step` over the rows of 2-D arrays (one row per
instance), in a prange or on the calling thread.

A shield (issue 22) is a stage between decide and actuate_stage: it rewrites u_cmd.
"""

from __future__ import annotations

import warnings

import numpy as np
from numba import njit, prange
from numba.core.errors import NumbaExperimentalFeatureWarning
from numba.core.registry import CPUDispatcher
from numba.core.typing.typeof import Purpose, typeof

from hil.calibration.residual import apply_correction
from hil.gaps.pipeline import GapPipeline, _actuate, _sense
from hil.loop.specialize import FusedKernels, specialised
from hil.loop.kernels import check_state, clip_inputs

# plant kernels passed as arguments are Numba's "first-class functions", which it still labels
# experimental; they are what makes one step serve every plant (and are tested bit for bit)
warnings.filterwarnings("ignore", message=".*First-class function type feature is experimental",
                        category=NumbaExperimentalFeatureWarning)

# ---- plant-contract adapters (plants/base.py: "ode" and "step" forms) ----
#
# The kernels that take a plant's kernels as arguments (these adapters, row_step, batch_step)
# are not cached on disk: Numba cannot pickle a dispatcher-typed signature into its cache
# index (numba/numba#2956: ReferenceError from the dispatcher's weakref when the index is
# saved) and a dispatcher's type changes every process, so such a cache would never hit.
# They compile once per process and plant (LoopStep.warm_up, before the clock starts); the
# stages and the plants' own kernels they call stay cached.


@njit(nogil=True)
def advance_ode(step, t, x, z, d, u, p, dt, n_sub, W, aux):
    """"ode" form: step(t, x, u, p, dt, n_sub, work) -> t + dt (plant time unit)."""
    return step(t, x, u, p, dt, n_sub, W)


@njit(nogil=True)
def advance_hybrid(step, t, x, z, d, u, p, dt, n_sub, W, aux):
    """"step" form: step(t, x, z, d, u, p, dt, n_sub, *aux) -> t + dt (plant time unit)."""
    return step(t, x, z, d, u, p, dt, n_sub, *aux)


@njit(nogil=True)
def outputs_ode(outputs, x, z, d, u, p, y, aux):
    outputs(x, u, p, y)


@njit(nogil=True)
def outputs_hybrid(outputs, x, z, d, u, p, y, aux):
    outputs(x, z, d, u, p, y, *aux)


# ---- the stages ----


@njit(cache=True, nogil=True)
def actuate_stage(t, u_cmd, u_lo, u_hi, u_app, u_clip, counts, act_buf):
    """Commands -> applied inputs: clip (counts[0] clipped, counts[1] non-finite, held at
    u_app), then the actuation latency and actuator gap (hil/gaps/pipeline.py) at t (s)."""
    clip_inputs(u_cmd, u_lo, u_hi, u_app, u_clip, counts)
    _actuate(act_buf, t, u_clip, u_app)


@njit(cache=True, nogil=True)
def correct_stage(x, u_app, dt, c_W, c_lo, c_scale, c_idx, c_incr, x_lo, x_hi, x_tol, x_out):
    """Residual correction over dt (plant time unit; none when c_idx is empty; c_incr also
    carries the per-instance state of its event features: hil/calibration/residual.py), then
    the state check: -1 if a state is not finite, else the number outside [lo - tol, hi + tol]
    (x_out[i] += 1 for each).

    Its disk cache is keyed on apply_correction's file too (hil/loop/jitcache.py): an edit of
    the correction kernel recompiles it."""
    if c_idx.size:
        apply_correction(x, u_app, dt, c_W, c_lo, c_scale, c_idx, c_incr)
    return check_state(x, x_lo, x_hi, x_tol, x_out)


@njit(cache=True, nogil=True)
def sense_stage(sense_buf, t_end, y, y_meas):
    """True -> measured outputs: sensor gap + observation latency at t_end (s)."""
    _sense(sense_buf, t_end, y, y_meas)


@njit(cache=True, nogil=True)
def record_stage(row, k, t_end, wall_ns, late_us, u_cmd, u_app, x, y, y_meas, z, d):
    """The recording row (hil/recorder.py columns_for): step, sim_time_s (end of the step),
    wall_ns, late_us, then cmd, app, x, y, meas, z, d (d int64 -> float64, exact < 2**53)."""
    row[0] = k
    row[1] = t_end
    row[2] = wall_ns
    row[3] = late_us
    o = 4
    for blk in (u_cmd, u_app, x, y, y_meas, z):
        for i in range(blk.size):
            row[o + i] = blk[i]
        o += blk.size
    for i in range(d.size):
        row[o + i] = d[i]


@njit(nogil=True)
def row_step(advance, plant_step, outputs_of, plant_outputs, k, tp, x, z, d, p, u_cmd, u_clip, u_app, y, y_meas,
             W, aux, act_buf, sense_buf, counts, u_lo, u_hi, x_lo, x_hi, x_tol, x_out,
             c_W, c_lo, c_scale, c_idx, c_incr, row, step_s, dt, n_sub, wall_ns, late_us):
    """One loop step of one instance (module docstring), fused. tp[0]: plant time (plant
    unit), advanced. Returns the state status (-1 diverged, else states out of bounds);
    on divergence y and y_meas keep the previous step's values (the row records them)."""
    t = k * step_s
    t_end = t + step_s
    actuate_stage(t, u_cmd, u_lo, u_hi, u_app, u_clip, counts, act_buf)
    tp[0] = advance(plant_step, tp[0], x, z, d, u_app, p, dt, n_sub, W, aux)
    status = correct_stage(x, u_app, dt, c_W, c_lo, c_scale, c_idx, c_incr, x_lo, x_hi, x_tol, x_out)
    if status >= 0:
        outputs_of(plant_outputs, x, z, d, u_app, p, y, aux)
        sense_stage(sense_buf, t_end, y, y_meas)
    record_stage(row, k, t_end, wall_ns, late_us, u_cmd, u_app, x, y, y_meas, z, d)
    return status


@njit(nogil=True, parallel=True)
def batch_step(advance, plant_step, outputs_of, plant_outputs, run, K, Tp, X, Z, D, P, Ucmd, Uclip, Uapp, Y, Ymeas,
               W, aux, Aact, Asen, counts, status, u_lo, u_hi, x_lo, x_hi, x_tol, Xout,
               c_W, c_lo, c_scale, c_idx, C_incr, Rows, step_s, dt, n_sub):
    """row_step over every instance i with run[i] (row i of every 2-D array), on every core;
    K[i] += 1 after the step. `aux` is shared: plants whose aux holds per-call work arrays
    ("step" form) are stepped per row by LoopStep instead (HilVectorEnv)."""
    for i in prange(X.shape[0]):
        if run[i]:
            status[i] = row_step(advance, plant_step, outputs_of, plant_outputs, K[i], Tp[i:i + 1], X[i], Z[i], D[i], P[i],
                                 Ucmd[i], Uclip[i], Uapp[i], Y[i], Ymeas[i], W[i], aux, Aact[i], Asen[i], counts[i],
                                 u_lo, u_hi, x_lo, x_hi, x_tol, Xout[i], c_W, c_lo, c_scale, c_idx, C_incr[i], Rows[i],
                                 step_s, dt, n_sub, 0, 0.0)
            K[i] += 1


@njit(nogil=True)
def batch_step_serial(advance, plant_step, outputs_of, plant_outputs, run, K, Tp, X, Z, D, P, Ucmd, Uclip, Uapp, Y,
                      Ymeas, W, aux, Aact, Asen, counts, status, u_lo, u_hi, x_lo, x_hi, x_tol, Xout,
                      c_W, c_lo, c_scale, c_idx, C_incr, Rows, step_s, dt, n_sub):
    """batch_step on the calling thread (a few instances: a parallel region's barrier costs
    more than the work on a loaded machine)."""
    for i in range(X.shape[0]):
        if run[i]:
            status[i] = row_step(advance, plant_step, outputs_of, plant_outputs, K[i], Tp[i:i + 1], X[i], Z[i], D[i], P[i],
                                 Ucmd[i], Uclip[i], Uapp[i], Y[i], Ymeas[i], W[i], aux, Aact[i], Asen[i], counts[i],
                                 u_lo, u_hi, x_lo, x_hi, x_tol, Xout[i], c_W, c_lo, c_scale, c_idx, C_incr[i], Rows[i],
                                 step_s, dt, n_sub, 0, 0.0)
            K[i] += 1


# ---- one instance's state and its step ----


def no_correction(spec) -> tuple:
    """The residual-correction arrays of 'no model' (c_idx empty: the stage does nothing)."""
    nx, nu = spec.n_states, spec.n_inputs
    return (np.zeros((0, 1 + nx + nu)), np.zeros(nx + nu), np.ones(nx + nu), np.zeros(0, dtype=np.int64),
            np.zeros(0))


def is_compiled(fn) -> bool:
    """A Numba dispatcher (callable from the fused kernel), not Python."""
    return isinstance(fn, CPUDispatcher)


def plant_adapters(model) -> tuple:
    """(advance, outputs_of) for a PlantModel's form."""
    return (advance_ode, outputs_ode) if model.form == "ode" else (advance_hybrid, outputs_hybrid)


def fused_kernels(model) -> FusedKernels:
    """The fused step for a PlantModel: written for its kernels and cached on disk by Numba
    (hil/loop/specialize.py), else the generic kernels with the plant's as `prefix`."""
    kern = specialised(model)
    if kern is not None:
        return kern
    advance, outputs_of = plant_adapters(model)
    return FusedKernels(row_step, batch_step, batch_step_serial, (advance, model.step, outputs_of, model.outputs),
                        False)


class LoopStep:
    """One instance's preallocated step state over a plants.base.Plant (its x, z, d, p, y and
    its u as the applied inputs), a GapPipeline (identity when None) and a residual model's
    arrays (None: no correction). See the module docstring for the stages.

    Arrays (plant units, spec order): u_cmd (commanded; the caller's decide stage writes it),
    u_clip, u_app (= plant.u), y (= plant.y), y_meas, counts[2] (clipped, non-finite),
    x_out (steps outside bounds per state), row (the recording row), tp[1] (plant time).
    """

    def __init__(self, plant, gaps: GapPipeline | None, correction, *, step_s: float, seed: int = 0,
                 x_tol: np.ndarray | None = None, x_out: np.ndarray | None = None, n_columns: int | None = None):
        spec = plant.spec
        self.plant, self.spec = plant, spec
        self.step_s = float(step_s)
        self.dt = self.step_s / plant.model.time_unit_s
        self.n_sub = int(plant.substeps)
        if gaps is None:  # identity pipeline: its kernels copy (bit for bit)
            gaps = GapPipeline.build(None, spec, self.step_s, seed)
        self.gaps = gaps
        # the last array is this instance's buffer (increments and event state): never shared
        self.corr = no_correction(spec) if correction is None else (*correction[:4], np.zeros_like(correction[4]))
        self.u_cmd = spec.nominal("inputs")
        self.u_clip = np.zeros(spec.n_inputs)
        self.y_meas = np.zeros(spec.n_outputs)
        self.counts = np.zeros(2, dtype=np.int64)
        self.u_lo, self.u_hi = spec.lows("inputs"), spec.highs("inputs")
        self.x_lo, self.x_hi = spec.lows("states"), spec.highs("states")
        self.x_tol = 1e-9 * (self.x_hi - self.x_lo) if x_tol is None else x_tol
        self.x_out = np.zeros(spec.n_states, dtype=np.int64) if x_out is None else x_out
        n_cols = n_columns if n_columns is not None else 4 + 2 * spec.n_inputs + spec.n_states + 2 * spec.n_outputs \
            + spec.n_algebraic + spec.n_discrete
        self.row = np.zeros(n_cols)
        self.tp = np.zeros(1)
        model = plant.model
        self.advance, self.outputs_of = plant_adapters(model)  # the staged path's adapters
        self.W = plant._work if plant._work is not None else np.zeros((1, 1))
        self.aux = tuple(plant.aux)
        self.fused = is_compiled(model.step) and is_compiled(model.outputs)
        self.kern = None  # hil.loop.specialize.FusedKernels of the plant's kernels (at the first fused step)
        self.hooks = None
        self._entry = None  # row_step's compiled entry point for this instance's arrays (rebind)
        self._argv: list = []  # its arguments, bound with it
        self._state = self._state_entry = None  # the same, specialised: a StepState and row_step_state's entry
        self._fast = None  # what step() checks and calls on the StepState path (set with _state)
        self._bound_to = (None, None, None)  # the plant kernels and aux it was bound with
        self._staged_for = None  # the plant kernels _staged_pair was chosen for
        self._staged_pair = None

    def rebind(self) -> None:
        """Forget the bound entry point and arguments: call after replacing (not writing
        into) an array the step reads; the next fused step binds them again. A plant
        kernel or `aux` replaced is noticed without it. Arrays are bound at the first
        fused step: replace them before it, or call this."""
        self._entry = None
        self._state = self._fast = None

    def _fused_args(self, k: int, wall_ns: int, late_us: float) -> tuple:
        pl, g, c = self.plant, self.gaps, self.corr
        return (*self.kern.prefix, k, self.tp, pl.x, pl.z, pl.d, pl.p,
                self.u_cmd, self.u_clip, pl.u, pl.y, self.y_meas, self.W, self.aux, g._act_buf, g._sense_buf,
                self.counts, self.u_lo, self.u_hi, self.x_lo, self.x_hi, self.x_tol, self.x_out, c[0], c[1], c[2],
                c[3], c[4], self.row, self.step_s, self.dt, self.n_sub, wall_ns, late_us)

    @property
    def u_app(self) -> np.ndarray:
        return self.plant.u

    def sync_in(self) -> None:
        """Take the plant's time (after a restore or reset of the Plant)."""
        self.tp[0] = self.plant.t

    def publish_initial(self) -> np.ndarray:
        """Outputs of the initial state, sensed at t = 0 (the loop's initial publish)."""
        y = self.plant.compute_outputs()
        sense_stage(self.gaps._sense_buf, 0.0, y, self.y_meas)
        return self.y_meas

    def warm_up(self) -> None:
        """Compile (or load from the cache) the fused and the staged path before the clock
        starts; every array the step touches (plant, gap arenas, counters) is restored."""
        pl, g = self.plant, self.gaps
        snap = pl.snapshot()
        saved = [(a, a.copy()) for a in (g._act_buf, g._sense_buf, self.u_cmd, self.u_clip, pl.u, pl.y, self.y_meas,
                                         self.counts, self.x_out, self.row, self.tp, self.corr[4])]
        hooks, fused = self.hooks, self.fused
        self._entry = self._fast = None
        try:
            self.hooks = None
            self.step(0)
            self._staged(0, 0, 0.0)
        finally:
            self.hooks, self.fused = hooks, fused
            pl.restore(snap)
            for a, copy in saved:
                np.copyto(a, copy)

    def step(self, k: int, wall_ns: int = 0, late_us: float = 0.0) -> int:
        """Step k (decide done: u_cmd holds the commands). Returns the state status
        (-1 diverged, else the number of states outside their bounds); row holds the
        recording row. Fused unless hooks are set or the plant's step is Python."""
        fast = self._fast  # specialised: (plant, its step and outputs kernels and aux as bound, entry, StepState, tp)
        if fast is not None and self.fused and self.hooks is None:
            model = fast[0].model
            if model.step is fast[1] and model.outputs is fast[2] and self.aux is fast[3]:
                status = fast[4](fast[5], k, wall_ns, late_us)
                fast[0].t = fast[6][0]
                return status
        if self.fused and self.hooks is None:
            entry = self._entry
            model = self.plant.model
            if entry is None or self._bound_to[0] is not model.step or self._bound_to[1] is not model.outputs \
                    or self._bound_to[2] is not self.aux:
                self.kern = fused_kernels(model)  # specialised to this plant, cached by Numba
                args = self._fused_args(k, wall_ns, late_us)
                status = self.kern.row_step(*args)
                self._entry = self._bind(self.kern.row_step, args)
                self._argv = list(args)
                self._bound_to = (model.step, model.outputs, self.aux)
                self._state, self._state_entry = self._bind_state(self.kern, args)
                self._fast = None if self._state is None else \
                    (self.plant, model.step, model.outputs, self.aux, self._state_entry, self._state, self.tp)
            else:  # no StepState (the generic kernels): the 33 arguments
                argv = self._argv  # the bound arrays; only the step and the wall-clock figures change
                argv[len(self.kern.prefix)] = k
                argv[-2] = wall_ns
                argv[-1] = late_us
                status = entry(*argv)
            self.plant.t = self.tp[0]
            return status
        return self._staged(k, wall_ns, late_us)

    @staticmethod
    def _bind(kernel, args: tuple):
        """row_step's compiled entry point for these arguments' types: the same machine code,
        called without the dispatcher's per-call typing of 37 arguments (two of them
        dispatchers: ~30 us a step, benchmarks/loop_overhead.py). The types are those of
        this instance's arrays, fixed from the first step on (see rebind), and of the
        plant's kernels (checked by identity every step); None if Numba
        holds no exact match (then every step goes through the dispatcher)."""
        sig = tuple(typeof(a, Purpose.argument) for a in args)
        cres = kernel.overloads.get(sig)
        return cres.entry_point if cres is not None else None

    @staticmethod
    def _bind_state(kern, args: tuple):
        """(StepState of the bound arguments, row_step_state's compiled entry point) for a
        specialised step (hil/loop/stepstate.py: one object unboxed per call instead of 30
        arguments; the arrays are referenced, not copied), or (None, None): the generic kernels."""
        if kern.row_step_state is None or kern.prefix:
            return None, None
        from hil.loop.stepstate import StepState

        state = StepState(*args[1:-2])
        sig = (typeof(state, Purpose.argument), typeof(args[0]), typeof(args[-2]), typeof(args[-1]))
        kern.row_step_state.compile(sig)
        cres = kern.row_step_state.overloads.get(sig)
        return (state, cres.entry_point) if cres is not None else (None, None)

    def _staged_kernels(self):
        """(advance, outputs) specialised to the plant (hil/loop/specialize.py), or None: the
        generic adapters with the plant's kernels as arguments (typed by the dispatcher at every
        call: the cost of a campaign's hooked steps, issue 20's profile)."""
        model = self.plant.model
        done = self._staged_for
        if done is None or done[0] is not model.step or done[1] is not model.outputs:
            kern = fused_kernels(model)
            self._staged_pair = (kern.advance, kern.outputs) if kern.cached and kern.advance is not None else None
            self._staged_for = (model.step, model.outputs)
        return self._staged_pair

    def _staged(self, k: int, wall_ns: int, late_us: float) -> int:
        """The same stages one by one, with the Python hooks and a Python plant step between."""
        pl, g, c, hooks = self.plant, self.gaps, self.corr, self.hooks
        t = k * self.step_s
        t_end = t + self.step_s
        actuate_stage(t, self.u_cmd, self.u_lo, self.u_hi, pl.u, self.u_clip, self.counts, g._act_buf)
        if hooks is not None:
            hooks.actuate(k, t, pl.u)
        pl.t = self.tp[0]
        staged = self._staged_kernels() if self.fused else None
        if staged is not None:  # the plant's own kernels as globals: no dispatcher typed per call
            self.tp[0] = pl.t = staged[0](pl.t, pl.x, pl.z, pl.d, pl.u, pl.p, self.dt, self.n_sub, self.W, self.aux)
        elif self.fused:
            self.tp[0] = pl.t = self.advance(pl.model.step, pl.t, pl.x, pl.z, pl.d, pl.u, pl.p, self.dt, self.n_sub,
                                             self.W, self.aux)
        else:
            pl.step(self.dt)
            self.tp[0] = pl.t
        status = correct_stage(pl.x, pl.u, self.dt, c[0], c[1], c[2], c[3], c[4], self.x_lo, self.x_hi, self.x_tol,
                               self.x_out)
        if status >= 0:
            if staged is not None:
                staged[1](pl.x, pl.z, pl.d, pl.u, pl.p, pl.y, self.aux)
            elif self.fused:
                self.outputs_of(pl.model.outputs, pl.x, pl.z, pl.d, pl.u, pl.p, pl.y, self.aux)
            else:
                pl.compute_outputs()
            sense_stage(g._sense_buf, t_end, pl.y, self.y_meas)
            if hooks is not None:
                hooks.sense(k, t_end, self.y_meas)
        record_stage(self.row, k, t_end, wall_ns, late_us, self.u_cmd, pl.u, pl.x, pl.y, self.y_meas, pl.z, pl.d)
        return status
