"""The vector env's whole step as one compiled call over every instance (issue 18, "Gym").

`HilVectorEnv.step` used to be the loop's batch kernel plus numpy over the N rows (profiles,
action, features, reward, limits, stops): ~20 numpy calls, each a pass over N rows and a
temporary. Here one Numba kernel does, per instance i and in the very order and arithmetic of
hil/gym/vector.py's numpy path (which stays as the reference, `fused=False`):

    run_i = not autoreset_i                      (the autoreset rows were reset before, in Python)
    profiles -> Ucmd_i, action -> Ucmd_i, Uprev_i = Uapp_i
    the loop's step if run_i (the stages of hil/loop/specialize.py's generated row_step, in its
    order: clip_inputs, actuation gaps, plant advance, correct_stage, outputs, sensing gaps,
    record_stage only when the env keeps rows); K_i += 1
    clipped_i, features (Bad outputs held/substituted, deltas) -> obs_i
    status -> diverged / out of bounds, [gym].limits -> terminated_i, reward_of(...) -> reward_i,
    truncated_i, autoreset_i

with the reward expression compiled into the kernel (hil/gym/exprgen.py) and the next
instances' gap records and rows prefetched (hil/gym/prefetch.py).

The gaps are read in the record layout of hil/gaps/compact.py, not through the loop's
per-instance arenas: instance i brings only its record (states, streams, the rows its
randomization drew, delay rings), and the gap kernels are generated for the scenario
(hil/gaps/specialize.py: `actuate_spec`, `sense_spec`): every parameter the scenario fixes is a
literal, features it leaves off are compiled out, the drawn rows are read from the record, the
states at constant offsets of it. Same operations in the same order as the arena's kernels
(delay_apply, actuator_apply, sensor_apply): bit-identical (tests/hil/gaps/test_specialize.py),
at about two thirds of the serial step's CPU time of the generic kernels on the shared layout
(A/B in the commit that made them). This is why the kernel composes the loop's stages itself
instead of calling row_step (which takes arena buffers and the generic gap kernels): a change of
the loop's stage sequence must be mirrored in _ROW (tests/hil/gym/test_fused.py compares it with
the numpy path, which calls row_step, bit for bit). The recording row is written only when
the env keeps rows (rows_step 1, Rows[i]); nothing reads it otherwise. Scratch (the RK4 work
arrays, the feature inputs, du) is one row per call (W[0], FO[0], DU[0]), not per instance.
Rows are handed to the stages and reward_of as views
without a reference to their owner (prefetch.row_of): a sliced view (X[i]) costs an atomic
increment and decrement of the owner's reference count (NRT_incref/decref, not inlined), and
the ~25 views per instance-step cost ~7 % of the step (A/B at load 3-5).

Several cores: not a prange. A prange's OpenMP workers spin at the barrier (libgomp), which
costs CPU time that grows with the machine's load (measured here: the prange step's process
CPU time per instance-step 1.3-2x the 1-thread step's at load 6-8 on 2 cores). The kernel is
nogil; HilVectorEnv calls it on contiguous blocks of rows from one Python thread per core
(views of its arrays, its own scratch), and waits on a lock, not a spin.

Like hil/loop/specialize.py, the kernel is written as a small module per (plant step,
reward, generated gap kernels) into `<cache>/hil/gym_steps/`, so Numba caches it on disk; a
scenario whose gap parameters differ gets other gap kernels (named after their text's digest)
and so another gym step. It is None (the env uses the numpy path) when the plant's step is not
specialised (a factory's closure, a Python step, a read-only cache).

    kern = gym_kernels(model, gaps) # GymKernels(step) or None; gaps: the env's CompactGaps
    kern.step(*args)                # args: see ARGS (the names of HilVectorEnv's arrays)
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from hil.gaps.specialize import specialised_gaps
from hil.loop.specialize import cache_dir, load_generated, specialised

log = logging.getLogger("hil.gym")

#: kernel arguments, in order (HilVectorEnv._fused_args builds them)
ARGS = ("run, autoreset, K, Tp, X, Z, D, P, Ucmd, Uclip, Uapp, Uprev, Y, Ymeas, W, aux, REC, "
        "counts, status, u_lo, u_hi, x_lo, x_hi, x_tol, Xout, c_W, c_lo, c_scale, c_idx, C_incr, Rows, step_s, dt, n_sub, "
        "A, action_index, prof_index, prof_start, prof_t, prof_v, "
        "feat_index, feat_dpos, FO, good, bad, fprev, first, obs, mode, sub_index, sub_value, "
        "DU, reward, terminated, truncated, diverged, out_b, limit_b, clipped, "
        "lim_y, lim_index, lim_lo, lim_hi, state_bounds, terminal_reward, max_steps, "
        "pf_rec, pf_act_ring, pf_sen_ring, pf_dist, rows_step")

MODE_HOLD, MODE_SUBSTITUTE, MODE_NAN = 0, 1, 2
MODES = {"hold": MODE_HOLD, "substitute": MODE_SUBSTITUTE, "nan": MODE_NAN}
PREFETCH_DISTANCE = 2  # instances ahead: ring lines at d, front and tail at 2 d

_ROW = '''
        ri = not autoreset[i]
        run[i] = ri
        t = K[i] * step_s
        for p in range(prof_index.size):
            lo = prof_start[p]
            hi = prof_start[p + 1]
            while lo < hi:  # first point later than t (numpy.searchsorted side="right")
                mid = (lo + hi) >> 1
                if prof_t[mid] <= t:
                    lo = mid + 1
                else:
                    hi = mid
            if lo > prof_start[p]:
                v = prof_v[lo - 1]
                if v == v:
                    Ucmd[i, prof_index[p]] = v
        for j in range(action_index.size):
            Ucmd[i, action_index[j]] = A[i, j]
        for j in range(Uapp.shape[1]):
            Uprev[i, j] = Uapp[i, j]
        c0 = counts[i, 0] + counts[i, 1]
        if ri:  # the loop's row_step (hil/loop/specialize.py), its gaps on the shared layout
            k = K[i]
            t = k * step_s
            t_end = t + step_s
            rec = row_of(REC, i)
            x, z, d, p, u_app = row_of(X, i), row_of(Z, i), row_of(D, i), row_of(P, i), row_of(Uapp, i)
            y, y_meas, u_clip = row_of(Y, i), row_of(Ymeas, i), row_of(Uclip, i)
            clip_inputs(row_of(Ucmd, i), u_lo, u_hi, u_app, u_clip, row_of(counts, i))
            actuate_spec(rec, t, u_clip, u_app)
            Tp[i] = loop_advance(Tp[i], x, z, d, u_app, p, dt, n_sub, block_of(W, 0), aux)
            st = correct_stage(x, u_app, dt, c_W, c_lo, c_scale, c_idx, row_of(C_incr, i), x_lo, x_hi, x_tol,
                               row_of(Xout, i))
            if st >= 0:
                loop_outputs(x, z, d, u_app, p, y, aux)
                sense_spec(rec, t_end, y, y_meas)
            if rows_step:
                record_stage(row_of(Rows, i), k, t_end, 0, 0.0, row_of(Ucmd, i), u_app, x, y, y_meas, z, d)
            status[i] = st
            K[i] += 1
        clipped[i] = counts[i, 0] + counts[i, 1] - c0
        # features over (measured outputs with Bad ones replaced, applied inputs): hil/gym/signals.py
        n_y = Y.shape[1]
        for j in range(n_y):
            v = Ymeas[i, j]
            b = v != v
            bad[i, j] = b
            if mode != MODE_NAN:
                if b:
                    v = good[i, j]
                good[i, j] = v
            FO[0, j] = v
        if mode == MODE_SUBSTITUTE:
            for s in range(sub_index.size):
                if bad[i, sub_index[s]]:
                    FO[0, sub_index[s]] = sub_value[s]
        for j in range(Uapp.shape[1]):
            FO[0, n_y + j] = Uapp[i, j]
        for f in range(feat_index.size):
            obs[i, f] = FO[0, feat_index[f]]
        for q in range(feat_dpos.size):
            f = feat_dpos[q]
            cur = obs[i, f]
            obs[i, f] = 0.0 if first[i] else cur - fprev[i, q]
            fprev[i, q] = cur
        first[i] = False
        # stops and reward: hil/gym/vector.py's numpy path, per instance
        st = status[i]
        dv = st < 0
        ob = state_bounds and st > 0
        lim = False
        if not dv:
            for q in range(lim_index.size):
                v = Y[i, lim_index[q]] if lim_y[q] else X[i, lim_index[q]]
                if not (v >= lim_lo[q] and v <= lim_hi[q]):
                    lim = True
        term = (dv or ob or lim) and ri
        for j in range(Uapp.shape[1]):
            DU[0, j] = Uapp[i, j] - Uprev[i, j]
        r = reward_of(row_of(X, i), row_of(Y, i), row_of(Ymeas, i), row_of(Uapp, i), row_of(Uclip, i),
                      row_of(DU, 0), K[i] * step_s)
        if dv:
            r = 0.0
        if term:
            r += terminal_reward
        if not ri:
            r = 0.0
        reward[i] = r
        tr = K[i] >= max_steps and not term and ri
        terminated[i] = term
        truncated[i] = tr
        autoreset[i] = term or tr
        diverged[i] = dv and ri
        out_b[i] = ob and ri
        limit_b[i] = lim and ri
'''

_PREFETCH = '''
        ahead = i + 2 * pf_dist
        if pf_dist >= 0 and ahead < n:
            prefetch_ranges(row_of(REC, ahead), pf_rec)
        ahead = i + pf_dist
        if pf_dist >= 0 and ahead < n:
            prefetch_ring(row_of(REC, ahead), pf_act_ring)
            prefetch_ring(row_of(REC, ahead), pf_sen_ring)
            for rows in (X, P, Ucmd, Uclip, Uapp, Uprev, Y, Ymeas, obs, good, fprev, A):
                prefetch_row_at(rows, ahead)
'''

_TEMPLATE = '''"""Generated by hil.gym.fused for {loop_module}, the gap kernels {gaps_module} and the reward
{reward_text!r}: the vector env's step over every instance. Do not edit: it is rewritten when
hil's template changes."""
# sources: {sources}
import numpy as np
from numba import njit

from {gaps_module} import actuate_spec, sense_spec
from hil.gym.prefetch import block_of, prefetch_ranges, prefetch_ring, prefetch_row_at, row_of
from hil.loop.kernels import clip_inputs
from hil.loop.step import correct_stage, record_stage
from {loop_module} import advance as loop_advance, outputs as loop_outputs

MODE_SUBSTITUTE = {mode_substitute}
MODE_NAN = {mode_nan}
{helpers}

{reward}

@njit(cache=True, nogil=True, error_model="numpy")
def gym_step({args}):
    n = X.shape[0]
    for i in range(n):{prefetch}{row}
'''


@dataclass(frozen=True)
class GymKernels:
    """The vector env's fused step for one (plant, reward): `step(*ARGS)` over the rows it is
    given, on the calling thread, without the GIL (nogil): HilVectorEnv runs one call per
    core on contiguous blocks of rows, from Python threads."""

    step: object


def _sources() -> str:
    """A hash of this package's kernel modules (Numba keys the cache on the generated file only)."""
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in ("fused.py", "prefetch.py", "exprgen.py", "expr.py"):
        h.update((here / name).read_bytes())
    for name in ("compact.py", "specialize.py"):
        h.update((here.parent / "gaps" / name).read_bytes())
    return h.hexdigest()[:16]


def source_for(loop_module: str, reward, gaps_module: str) -> str:
    """The generated module's text for a loop-step module name, a reward Expression and the
    scenario's gap kernels (a module generated by hil/gaps/specialize.py)."""
    from hil.gym.exprgen import HELPERS, reward_source

    return _TEMPLATE.format(loop_module=loop_module, gaps_module=gaps_module, reward_text=reward.text,
                            sources=_sources(),
                            mode_substitute=MODE_SUBSTITUTE, mode_nan=MODE_NAN, helpers=HELPERS,
                            reward=reward_source(reward), args=ARGS, prefetch=_PREFETCH, row=_ROW)


_LOADED: dict[tuple, GymKernels | None] = {}


def fusable(model) -> bool:
    """The vector env's step can be fused for this ScenarioModel: an "ode" plant whose loop
    step is specialised (hil/loop/specialize.py)."""
    pm = model.plant_model
    return pm.form == "ode" and specialised(pm) is not None


def gym_kernels(model, gaps) -> GymKernels | None:
    """The fused step for a hil.gym.model.ScenarioModel ("ode" plants whose loop step is
    specialised) and the gaps of its instances (a hil.gaps.compact.CompactGaps: the kernels are
    specialised to its parameters and layout), or None (then HilVectorEnv steps with numpy
    around the loop's batch kernel)."""
    if not fusable(model):
        return None
    loop = specialised(model.plant_model)
    loop_module = loop.row_step.py_func.__module__
    kern = None
    try:
        gmod = specialised_gaps(gaps).__name__
        key = (loop_module, model.reward.text, gmod)
        if key in _LOADED:
            return _LOADED[key]
        text = source_for(loop_module, model.reward, gmod)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        stem = re.sub(r"\W", "_", loop_module.removeprefix("hil_loop_step_"))
        module = load_generated(cache_dir().parent / "gym_steps" / f"gym_{stem}_{digest}.py", f"hil_gym_step_{stem}_{digest}",
                       text)
        kern = GymKernels(module.gym_step)
    except OSError as exc:
        log.debug("gym step not fused (%s): numpy path", exc)
        return None
    _LOADED[key] = kern
    return kern
