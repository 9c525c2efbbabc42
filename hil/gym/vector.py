"""`HilVectorEnv`: N randomized instances of a scenario stepped in one compiled call per core.

Every instance runs exactly the single env's step (hil/gym/env.py, itself the lockstep
loop's): the loop's compiled step (hil/loop/step.py `row_step`: clip, actuation gaps, plant,
residual correction, sensor gaps, recording row). For "ode" plants whose step is specialised
(hil/loop/specialize.py) the whole env step is one compiled call over every instance
(hil/gym/fused.py: profiles, action, row_step, features, stops, the reward compiled from its
expression; without the GIL, one block of rows per core from Python threads, the next
instances' gap arenas prefetched); otherwise, or with
`fused=False`, the loop's `batch_step` (a prange; "step"-form plants: the row kernel per instance) with
features, reward and stops in numpy over the N rows (the reference the fused step is tested
against, bit for bit). Instance i with seed s_i and episode e is bit for bit the single env's
episode e of seed s_i.

Seeding: `reset(seed=s)` gives instance i the seed s + i (episode 0); a list gives each its
own; `reset()` without a seed starts each instance's next episode (the very first reset uses
loop.seed + i). Autoreset: gymnasium's NEXT_STEP mode: the step after an instance terminated
or truncated resets it (next episode of its seed; reward 0, not done) instead of stepping it.
`options={"reset_mask": mask}` resets only the masked instances.

info (arrays over the instances): `x` true states, `y` true outputs, `u_applied`, `clipped`
(loop clips this step), `diverged`, `state_out_of_bounds`, `limit` (bool), `episode_index`, `seed`, `bad_outputs`,
`t_s`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from numba.core.typing.typeof import Purpose, typeof

from hil.gaps.compact import CompactGaps
from hil.gym.fused import MODES, PREFETCH_DISTANCE, fusable, gym_kernels
from hil.loop.step import LoopStep, fused_kernels, is_compiled, no_correction, outputs_ode
from hil.gym.model import ScenarioModel
from hil.gym.signals import Features, limits_violated
from hil.recorder import columns_for


class _RowGaps:
    """A row's gap arenas (what LoopStep reads of a GapPipeline)."""

    def __init__(self, act_buf, sense_buf):
        self._act_buf, self._sense_buf = act_buf, sense_buf


PARALLEL_MIN = 16  # instances from which a parallel region pays for its barrier


class HilVectorEnv(VectorEnv):
    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, scenario, num_envs: int, *, scenario_path: str | None = None,
                 parallel: bool | None = None, fused: bool | None = None, record_rows: bool = False):
        """parallel: step the instances on every core (default: from PARALLEL_MIN instances on).
        fused: the whole step in one compiled call (hil/gym/fused.py; default wherever the
        plant's step is specialised); False: numpy around the loop's batch kernel (the reference).
        record_rows: the fused step also keeps each instance's recording row in `Rows` (the loop's
        row, hil/recorder.py columns_for; the numpy path always does); off, one scratch row per block."""
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, not {num_envs}")
        self.model = m = ScenarioModel(scenario)
        self.scenario_path = scenario_path
        self.num_envs = N = int(num_envs)
        self.record_rows = bool(record_rows)
        self.action_names, self.feature_names = m.action_names, m.feature_names
        self.metadata = {**type(self).metadata, "action_names": list(m.action_names),
                         "observation_names": list(m.feature_names),
                         "action_order": m.action_order, "observation_order": m.observation_order}
        n_f = len(m.feature_names)
        self.single_action_space = spaces.Box(m.a_lo.copy(), m.a_hi.copy(), dtype=np.float64)
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (n_f,), dtype=np.float64)
        self.action_space = batch_space(self.single_action_space, N)
        self.observation_space = batch_space(self.single_observation_space, N)
        self.template = m.gaps(m.seed)
        self.seeds = m.seed + np.arange(N, dtype=np.int64)
        self.episodes = np.full(N, -1, dtype=np.int64)
        self.K = np.zeros(N, dtype=np.int64)
        self.Tp = np.zeros(N)
        self.X = np.repeat(m.x0[None, :], N, axis=0)
        self.P = np.repeat(m.p0[None, :], N, axis=0)
        self.Ucmd = np.repeat(m.u0[None, :], N, axis=0)
        self.Uclip = np.zeros((N, m.n_u))
        self.Uapp = self.Ucmd.copy()
        self.Uprev = self.Ucmd.copy()
        self.Y = np.zeros((N, m.n_y))
        self.Ymeas = np.zeros((N, m.n_y))
        self.batched = m.plant_model.form == "ode" and is_compiled(m.plant_step) and is_compiled(m.plant_outputs)
        self.parallel = N >= PARALLEL_MIN if parallel is None else bool(parallel)
        # the fused step reads the gaps in the shared-parameter layout (hil/gaps/compact.py), with
        # gap kernels generated for this scenario's parameters (hil/gaps/specialize.py)
        self.gaps = None
        gk = None
        if self.batched and fused is not False and fusable(m):
            # blocks of rows stepped concurrently (one per core, each >= PARALLEL_MIN rows)
            n_blocks = max(1, min(numba.config.NUMBA_NUM_THREADS, N // PARALLEL_MIN)) if self.parallel else 1
            self._blocks = [(N * b // n_blocks, N * (b + 1) // n_blocks) for b in range(n_blocks)]
            self.gaps = CompactGaps(self.template, N, n_blocks)
            gk = gym_kernels(m, self.gaps)
            if gk is None:
                self.gaps = None
        # the gap arenas per instance (the loop's layout: the numpy path, "step" plants), or, for
        # the fused step, the shared-parameter layout (hil/gaps/compact.py, set up in _fused_setup)
        self.Aact = self.Asen = None
        if gk is None:
            self.Aact = np.repeat(self.template._act_buf[None, :], N, axis=0)
            self.Asen = np.repeat(self.template._sense_buf[None, :], N, axis=0)
        self.Z = np.repeat(m.snapshot0.z[None, :], N, axis=0)
        self.D = np.repeat(m.snapshot0.d[None, :], N, axis=0)
        self.counts = np.zeros((N, 2), dtype=np.int64)
        self.Xout = np.zeros((N, m.n_x), dtype=np.int64)
        self.Rows = np.zeros((N, len(columns_for(m.spec))))
        corr = m.correction if m.correction is not None else no_correction(m.spec)
        self.corr = corr[:4]
        self.C_incr = np.zeros((N, corr[4].size))
        # "ode" plants with compiled kernels: every row in one batch call; others ("step" form:
        # per-instance work arrays, or a Python step) the same row kernel through one LoopStep
        # per instance over views of the rows (self.batched, above)
        self.W = np.zeros((N, 5, m.n_x))
        self.rows_steps: list[LoopStep] = []
        if not self.batched:
            for i in range(N):
                pl = m.new_plant()
                pl.x, pl.z, pl.d, pl.p, pl.u, pl.y = self.X[i], self.Z[i], self.D[i], self.P[i], self.Uapp[i], self.Y[i]
                ls = LoopStep(pl, self.template, m.correction, step_s=m.step_s, x_tol=m.x_tol, x_out=self.Xout[i],
                              n_columns=self.Rows.shape[1])
                ls.u_cmd, ls.u_clip, ls.y_meas, ls.counts, ls.row = (self.Ucmd[i], self.Uclip[i], self.Ymeas[i],
                                                                     self.counts[i], self.Rows[i])
                ls.gaps = _RowGaps(self.Aact[i], self.Asen[i])  # views of the rows, for good
                ls.tp = self.Tp[i:i + 1]
                self.rows_steps.append(ls)
        self.status = np.zeros(N, dtype=np.int64)
        self.run = np.ones(N, dtype=np.bool_)
        self.features = Features(m, (N,))
        self.obs = np.zeros((N, n_f))
        self.reward = np.zeros(N)
        self.autoreset = np.zeros(N, dtype=bool)
        self.drawn: list[dict] = [{} for _ in range(N)]
        kern = fused_kernels(m.plant_model) if self.batched else None  # specialised: Numba caches it
        self._kernel = (kern.batch_step if self.parallel else kern.batch_step_serial) if kern else None
        self._prefix = kern.prefix if kern else ()
        self._y0 = np.zeros(m.n_y)
        self._ym0 = np.zeros(m.n_y)
        self._x0 = m.x0.copy()
        self._u0 = m.u0.copy()
        self.fused = gk is not None
        self._fused_kernel = gk.step if gk else None
        self._fused_calls: list | None = None  # per block of rows: (entry point, its arguments)
        self._pool = None
        if gk is not None:
            self._fused_setup()

    def _fused_setup(self) -> None:
        """Arrays of the fused step (hil/gym/fused.py ARGS), allocated once."""
        m, N = self.model, self.num_envs
        self.A = np.zeros((N, len(self.action_names)))
        # scratch of the fused step, one per thread (numba.get_thread_id): RK4 work, recording
        # row (written by row_step, not kept per instance: self.Rows is the numpy path's),
        # feature inputs, du
        self._scratch = [(np.zeros((1, 5, m.n_x)), np.zeros((1, self.Rows.shape[1])), np.zeros((1, m.n_y + m.n_u)),
                          np.zeros((1, m.n_u))) for _ in self._blocks]
        self.terminated, self.truncated = np.zeros(N, bool), np.zeros(N, bool)
        self.diverged, self.out_b, self.limit_b = np.zeros(N, bool), np.zeros(N, bool), np.zeros(N, bool)
        self.clipped = np.zeros(N, dtype=np.int64)
        profs = m.profiles
        self._prof = (np.array([p.index for p in profs], dtype=np.int64),
                      np.cumsum([0] + [p.times.size for p in profs]).astype(np.int64),
                      np.concatenate([p.times for p in profs] + [np.zeros(0)]),
                      np.concatenate([p.values for p in profs] + [np.zeros(0)]))
        self._lim = (np.array([b == "y" for b, _, _, _ in m.limits], dtype=np.bool_),
                     np.array([i for _, i, _, _ in m.limits], dtype=np.int64),
                     np.array([lo for _, _, lo, _ in m.limits], dtype=np.float64),
                     np.array([hi for _, _, _, hi in m.limits], dtype=np.float64))
        self._pf = self.gaps.plans()

    def _fused_args(self, block: int) -> tuple:
        """hil/gym/fused.py ARGS for one block of rows: views of the per-instance arrays, the
        block's own scratch, the shared tables."""
        m, c, f = self.model, self.corr, self.features
        pf = self._pf
        lo, hi = self._blocks[block]
        w, rows, fo, du = self._scratch[block]

        def r(a):
            return a[lo:hi]

        return (r(self.run), r(self.autoreset), r(self.K), r(self.Tp), r(self.X), r(self.Z), r(self.D), r(self.P),
                r(self.Ucmd), r(self.Uclip), r(self.Uapp), r(self.Uprev), r(self.Y), r(self.Ymeas), w, (),
                r(self.gaps.REC), r(self.counts), r(self.status),
                m.u_lo, m.u_hi, m.x_lo, m.x_hi, m.x_tol, r(self.Xout), c[0], c[1], c[2], c[3], r(self.C_incr),
                r(self.Rows) if self.record_rows else rows,
                m.step_s, m.dt_plant, m.substeps,
                r(self.A), m.action_index.astype(np.int64), *self._prof,
                f.index.astype(np.int64), f.dpos.astype(np.int64), fo, r(f.good), r(f.bad), r(f.prev), r(f.first),
                r(self.obs), MODES[f.mode], f.sub_index.astype(np.int64), f.sub_value,
                du, r(self.reward), r(self.terminated), r(self.truncated), r(self.diverged), r(self.out_b),
                r(self.limit_b), r(self.clipped), *self._lim, bool(m.gym.state_bounds), float(m.gym.terminal_reward),
                int(m.max_steps), pf[0], pf[1], pf[2], PREFETCH_DISTANCE, int(self.record_rows))

    def _bind_fused(self) -> list:
        """(compiled entry point, arguments) per block: the kernel called without Numba's
        per-call typing of ~70 arguments (the arrays are this env's, fixed for its life)."""
        calls = []
        for b in range(len(self._blocks)):
            args = self._fused_args(b)
            sig = tuple(typeof(x, Purpose.argument) for x in args)
            if sig not in self._fused_kernel.overloads:
                self._fused_kernel.compile(sig)
            calls.append((self._fused_kernel.overloads[sig].entry_point, args))
        return calls

    def close_extras(self, **kwargs) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # ---- episodes ----
    def _reset_rows(self, rows: np.ndarray) -> None:
        m, g = self.model, self.template
        self.X[rows] = m.x0
        self.Z[rows] = m.snapshot0.z
        self.D[rows] = m.snapshot0.d
        self.Xout[rows] = 0
        self.Ucmd[rows] = m.u0
        self.Uapp[rows] = m.u0
        self.Uprev[rows] = m.u0
        self.Tp[rows] = 0.0
        self.K[rows] = 0
        self.counts[rows] = 0
        self.C_incr[rows] = 0.0  # the residual model's event state: an episode starts fresh
        for i in rows:
            self.episodes[i] += 1
            self.drawn[i] = m.begin_episode(g, int(self.seeds[i]), int(self.episodes[i]), self.P[i])
            if self.batched:
                outputs_ode(m.plant_outputs, self.X[i], self.Z[i], self.D[i], self.Uapp[i], self.P[i], self.Y[i], ())
            else:
                self.rows_steps[i].plant.compute_outputs()  # into Y[i]
            g.sense(0.0, self.Y[i], self._ym0)  # the loop's initial publish
            if self.fused:
                self.gaps.load(i)
            else:
                self.Aact[i] = g._act_buf
                self.Asen[i] = g._sense_buf
            self.Ymeas[i] = self._ym0
        self.features.forget(rows)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=int(seed) if seed is not None and np.isscalar(seed) else None)
        N = self.num_envs
        mask = np.ones(N, dtype=bool)
        if options and "reset_mask" in options:
            mask = np.asarray(options["reset_mask"], dtype=bool)
        if seed is not None:
            seeds = (int(seed) + np.arange(N)) if np.isscalar(seed) else np.asarray(seed, dtype=np.int64)
            if seeds.shape != (N,):
                raise ValueError(f"seed: one int or {N} ints")
            self.seeds[mask] = seeds[mask]
            self.episodes[mask] = -1
        rows = np.flatnonzero(mask)
        self._reset_rows(rows)
        self.autoreset[rows] = False
        self.features.build(self.Ymeas, self.Uapp, self.obs)
        info = {"seed": self.seeds.copy(), "episode_index": self.episodes.copy(),
                "bad_outputs": self.features.bad.copy()}
        return self.obs.copy(), info

    # ---- step ----
    def _step_rows(self) -> None:
        """The loop's compiled step (hil/loop/step.py row_step) on every running instance."""
        m, c = self.model, self.corr
        if self.batched:
            self._kernel(*self._prefix, self.run, self.K, self.Tp,
                         self.X, self.Z, self.D, self.P, self.Ucmd, self.Uclip, self.Uapp, self.Y, self.Ymeas, self.W,
                         (), self.Aact, self.Asen, self.counts, self.status, m.u_lo, m.u_hi, m.x_lo, m.x_hi, m.x_tol,
                         self.Xout, c[0], c[1], c[2], c[3], self.C_incr, self.Rows, m.step_s, m.dt_plant, m.substeps)
            return
        for i in np.flatnonzero(self.run):
            ls = self.rows_steps[i]
            self.status[i] = ls.step(int(self.K[i]))
            self.K[i] += 1

    def step(self, actions):
        m = self.model
        a = np.asarray(actions, dtype=np.float64)
        if a.shape != (self.num_envs, len(self.action_names)):
            raise ValueError(f"actions: expected shape {(self.num_envs, len(self.action_names))}, got {a.shape}")
        if self.fused:
            return self._step_fused(a)
        resetting = np.flatnonzero(self.autoreset)
        if resetting.size:
            self._reset_rows(resetting)
        np.logical_not(self.autoreset, out=self.run)
        t = self.K * m.step_s
        for prof in m.profiles:
            v = prof.value_at(t)
            ok = ~np.isnan(v)
            self.Ucmd[ok, prof.index] = v[ok]
        self.Ucmd[:, m.action_index] = a
        np.copyto(self.Uprev, self.Uapp)
        c0 = self.counts.sum(axis=1)
        self._step_rows()
        self.features.build(self.Ymeas, self.Uapp, self.obs)
        t_end = self.K * m.step_s
        sig = {"x": self.X, "y": self.Y, "meas": self.Ymeas, "u": self.Uapp, "cmd": self.Uclip,
               "du": self.Uapp - self.Uprev, "t_s": t_end}
        diverged = self.status < 0
        out = self.status > 0 if m.gym.state_bounds else np.zeros(self.num_envs, dtype=bool)
        limit = limits_violated(m, self.X, self.Y) & ~diverged if m.limits else np.zeros(self.num_envs, bool)
        terminated = (diverged | out | limit) & self.run
        with np.errstate(all="ignore"):
            reward = np.broadcast_to(np.asarray(m.reward(sig), dtype=np.float64), (self.num_envs,)).copy()
        reward[diverged] = 0.0
        reward[terminated] += m.gym.terminal_reward
        reward[~self.run] = 0.0
        truncated = (self.K >= m.max_steps) & ~terminated & self.run
        self.autoreset = terminated | truncated
        info = {"x": self.X.copy(), "y": self.Y.copy(), "u_applied": self.Uapp.copy(),
                "clipped": self.counts.sum(axis=1) - c0, "diverged": diverged & self.run,
                "state_out_of_bounds": out & self.run, "limit": limit & self.run,
                "episode_index": self.episodes.copy(), "seed": self.seeds.copy(), "t_s": t_end,
                "bad_outputs": self.features.bad.copy()}
        return self.obs.copy(), reward, terminated, truncated, info

    def _step_fused(self, a: np.ndarray):
        """The step in one compiled call (hil/gym/fused.py): the same results as the numpy path."""
        resetting = np.flatnonzero(self.autoreset)
        if resetting.size:
            self._reset_rows(resetting)
        np.copyto(self.A, a)
        calls = self._fused_calls
        if calls is None:  # first step: compile or load from Numba's cache, bind the blocks
            calls = self._fused_calls = self._bind_fused()
        if len(calls) == 1:
            calls[0][0](*calls[0][1])
        else:  # one block per core: the kernel releases the GIL; this thread takes the first
            if self._pool is None:
                self._pool = ThreadPoolExecutor(len(calls) - 1, thread_name_prefix="hil-gym")
            futures = [self._pool.submit(fn, *args) for fn, args in calls[1:]]
            calls[0][0](*calls[0][1])
            for fut in futures:
                fut.result()
        t_end = self.K * self.model.step_s
        info = {"x": self.X.copy(), "y": self.Y.copy(), "u_applied": self.Uapp.copy(), "clipped": self.clipped.copy(),
                "diverged": self.diverged.copy(), "state_out_of_bounds": self.out_b.copy(),
                "limit": self.limit_b.copy(), "episode_index": self.episodes.copy(), "seed": self.seeds.copy(),
                "t_s": t_end, "bad_outputs": self.features.bad.copy()}
        return self.obs.copy(), self.reward.copy(), self.terminated.copy(), self.truncated.copy(), info
