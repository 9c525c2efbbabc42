"""hil/gym/fused.py, exprgen.py, prefetch.py: the vector env's step in one compiled call gives
exactly (bit for bit) what the numpy path gives, on a scenario that exercises every branch."""

import math

import numpy as np
import pytest

pytest.importorskip("gymnasium")

import hil.gym  # noqa: E402
from hil.gym.expr import Expression  # noqa: E402
from tests.hil.gym.helpers import CONFIG  # noqa: E402

# Bad (NaN) pH readings and stuck DO often, a profile-driven feed, a DO limit some instances
# cross (terminated), short episodes (truncated), substitution of Bad readings, and a reward
# that reads every signal block and most functions
BRANCHY = dict(
    episode_s=25.0, bad_observation="substitute", bad_substitute={"ph": 7.0},
    limits={"dissolved_oxygen": [37.0, 43.0], "temperature": [200.0, 400.0]},
    observation=["ph", "d.ph", "dissolved_oxygen", "d.u.agitation_power", "u.base_flow", "glucose"],
    reward="-abs(y.dissolved_oxygen - 40.0) / 10.0 - 0.1 * where(meas.ph > 5.1, 1.0, 0.0) "
           "- max(du.agitation_power, 0.0) ** 2 / (cmd.base_flow * 0.0 + 1.0) + 1e-3 * sqrt(x.volume) "
           "+ min(exp(-t_s / 30.0), 0.5) + clip(log(u.agitation_power + 1.0), 0.0, 3.0)",
    gaps={"sensors": {"ph": {"dropout_rate_per_s": 0.05, "dropout_duration_s": 3.0, "dropout_mode": "bad"}}},
    inputs={"feed_rate": {"driver": "profile", "profile": [[5.0, 0.02], [20.0, 0.1], [45.0, 0.04]]}},
)


def _actions(rng, space, n):
    return rng.uniform(space.low, space.high, (n, space.shape[0]))


@pytest.mark.parametrize("parallel, n_env", [(False, 6), (True, 40)])
def test_fused_step_is_the_numpy_path_bit_for_bit(parallel, n_env):
    """(True, 40): two blocks of 20 rows stepped from two threads."""
    steps = 150
    fused = hil.gym.make_vec(CONFIG, n_env, parallel=parallel, **BRANCHY)
    ref = hil.gym.make_vec(CONFIG, n_env, parallel=parallel, fused=False, **BRANCHY)
    assert fused.fused and not ref.fused
    assert len(fused._blocks) == (2 if parallel else 1)
    o1, _ = fused.reset(seed=5)
    o2, _ = ref.reset(seed=5)
    np.testing.assert_array_equal(o1, o2)
    rng = np.random.default_rng(1)
    seen = {"terminated": 0, "truncated": 0, "bad": 0}
    for k in range(steps):
        a = _actions(rng, fused.single_action_space, n_env)
        if k == 40:
            a[2, 0] = np.nan  # a non-finite action: held and counted
        if k == 70:  # a partial reset in the middle of episodes
            mask = np.zeros(n_env, bool)
            mask[[0, 3, n_env - 1]] = True
            o1, _ = fused.reset(options={"reset_mask": mask})
            o2, _ = ref.reset(options={"reset_mask": mask})
            np.testing.assert_array_equal(o1, o2)
        r1, r2 = fused.step(a), ref.step(a)
        for x, y in zip(r1[:4], r2[:4]):
            np.testing.assert_array_equal(x, y)
        assert set(r1[4]) == set(r2[4])
        for key in r2[4]:
            np.testing.assert_array_equal(r1[4][key], r2[4][key], err_msg=f"info[{key!r}] at step {k}")
        seen["terminated"] += int(r1[2].sum())
        seen["truncated"] += int(r1[3].sum())
        seen["bad"] += int(r1[4]["bad_outputs"].sum())
    # the branches were taken (else this test proves less than it says)
    assert all(v > 0 for v in seen.values()), seen
    np.testing.assert_array_equal(fused.Ucmd, ref.Ucmd)  # the profile's command too
    assert fused.episodes.tolist() == ref.episodes.tolist()
    assert (fused._pool is not None) is parallel  # the second block's thread
    fused.close()
    assert fused._pool is None


def test_fused_step_is_the_single_env_across_autoresets():
    """The fused vector env against HilEnv (tests/hil/gym/test_vector.py does it for the
    default path; here explicitly fused, with the branchy scenario)."""
    n_env, steps = 3, 90
    venv = hil.gym.make_vec(CONFIG, n_env, **BRANCHY)
    assert venv.fused
    env = hil.gym.make(CONFIG, **BRANCHY)
    rng = np.random.default_rng(2)
    acts = [_actions(rng, venv.single_action_space, n_env) for _ in range(steps)]
    obs_v, _ = venv.reset(seed=21)
    hist = [venv.step(a) for a in acts]
    for i in range(n_env):
        obs, _ = env.reset(seed=21 + i)
        np.testing.assert_array_equal(obs, obs_v[i])
        done = False
        for k in range(steps):
            o_v, r_v, te_v, tr_v, info_v = hist[k]
            if done:
                obs, _ = env.reset()
                np.testing.assert_array_equal(obs, o_v[i])
                assert r_v[i] == 0.0 and not te_v[i] and not tr_v[i]
                done = False
                continue
            obs, r, te, tr, info = env.step(acts[k][i])
            np.testing.assert_array_equal(obs, o_v[i])
            np.testing.assert_array_equal(info["x"], info_v["x"][i])
            assert r == r_v[i] and te == te_v[i] and tr == tr_v[i]
            done = te or tr


def _signals(rng, spec, n):
    sig = {"x": rng.uniform(-2, 50, (n, spec.n_states)), "y": rng.uniform(-2, 50, (n, spec.n_outputs)),
           "meas": rng.uniform(-2, 50, (n, spec.n_outputs)), "u": rng.uniform(-1, 80, (n, spec.n_inputs)),
           "cmd": rng.uniform(0, 1, (n, spec.n_inputs)), "du": rng.uniform(-1, 1, (n, spec.n_inputs)),
           "t_s": rng.uniform(0, 100, n)}
    sig["y"][::7, 1] = np.nan
    sig["u"][::5, 4] = 0.0  # log(0), x / 0
    sig["cmd"][::3, 1] = 0.0
    return sig


@pytest.mark.parametrize("text", [
    "-((y.dissolved_oxygen - 40.0) / 10.0)**2 - ((y.ph - 5.0) / 0.2)**2 - 0.002 * u.agitation_power",
    "abs(meas.ph - 5) + sqrt(x.volume) - exp(-t_s / 60) * log(u.agitation_power) + pi * e",
    "min(y.dissolved_oxygen, 30) + max(y.dissolved_oxygen, 50) + clip(du.base_flow, -0.1, 0.1)",
    "where(y.ph >= 5, 1, -1) + (u.agitation_power < 10) + (x.glucose <= 1) + (meas.glucose > 2)",
    "1 / cmd.base_flow + u.agitation_power / u.agitation_power + +y.ph ** 0.5 + (-x.biomass) ** 3",
    "0",
])
def test_compiled_reward_is_the_expression_bit_for_bit(text):
    from numba import njit

    from hil.gym.exprgen import HELPERS, reward_source
    from hil.gym.model import ScenarioModel

    spec = ScenarioModel(hil.gym.load(CONFIG)).spec
    expr = Expression(text, spec)
    def njit_here(*args, **kw):  # the generated text, compiled without a file to cache it in
        return njit(*args, **{**kw, "cache": False})

    ns = {"np": np, "njit": njit_here}
    exec(HELPERS + "\n" + reward_source(expr), ns)  # noqa: S102 (the generated module's text)
    fn = ns["reward_of"]
    rng = np.random.default_rng(3)
    n = 64
    sig = _signals(rng, spec, n)
    with np.errstate(all="ignore"):
        want = np.broadcast_to(np.asarray(expr(sig), dtype=np.float64), (n,))
        got = np.array([fn(sig["x"][i], sig["y"][i], sig["meas"][i], sig["u"][i], sig["cmd"][i], sig["du"][i],
                           float(sig["t_s"][i])) for i in range(n)])
    np.testing.assert_array_equal(got, want)  # NaN where NaN, inf where inf
    if text != "0" and "1 / cmd" in text:
        assert np.isinf(got).any()  # division by zero gives inf, as numpy, not an exception


def test_prefetch_plan_is_the_arena_layout():
    """The prefetched ranges are every slot of the gap arenas but the rings, and the ring
    description points at the delay lines' own counters, times and values."""
    from hil.gaps.pipeline import A_AS, A_I, A_T, A_V, S_I, S_PROF, S_T, S_V
    from hil.gym.prefetch import arena_plan

    venv = hil.gym.make_vec(CONFIG, 2)
    g = venv.template

    def offset(buf, view):
        return (view.__array_interface__["data"][0] - buf.__array_interface__["data"][0]) // 8

    for buf, n_slots, (si, st, sv), line, others in (
            (g._act_buf, A_AS + 1, (A_I, A_T, A_V), g.actuation,
             [g._work_in, g.actuation.L, g.actuators.P, g.actuators.S]),
            (g._sense_buf, S_PROF + 1, (S_I, S_T, S_V), g.observation,
             [g._work_out, g.sensors.P, g.sensors.X, g.sensors.R, g.observation.L])):
        ranges, ring = arena_plan(buf, n_slots, si, st, sv)
        assert ring.tolist() == [offset(buf, line.I), line.L.shape[0], offset(buf, line.T), line.m,
                                 offset(buf, line.V), line.V.shape[1]]
        covered = np.zeros(buf.size, bool)
        for lo, hi in ranges:
            covered[lo:hi] = True
        for arr in others:  # every hot array lies in the prefetched ranges
            o = offset(buf, arr)
            assert covered[o:o + arr.size].all()
        assert not covered[offset(buf, line.V): offset(buf, line.V) + line.V.size].any()  # rings: by line
    with pytest.raises(ValueError, match="layout"):
        arena_plan(g._sense_buf, S_PROF + 1, S_T, S_I, S_V)  # slots swapped


def test_numpy_path_is_used_where_the_step_is_not_specialised():
    venv = hil.gym.make_vec(CONFIG, 2, fused=False)
    assert not venv.fused and venv._fused_kernel is None
    assert math.isfinite(float(venv.reset(seed=0)[0].sum()))


def test_fused_step_hands_out_fresh_arrays():
    """Arrays a caller kept from a step (a replay buffer) are never overwritten by a later
    step, and no result shares memory with another or with the env's own arrays."""
    venv = hil.gym.make_vec(CONFIG, 40, parallel=True)
    assert venv.fused and len(venv._blocks) == 2  # both blocks write into the fresh arrays
    venv.reset(seed=5)
    a = np.tile(venv.single_action_space.sample(), (40, 1))
    first = venv.step(a)
    kept = [np.array(x, copy=True) for x in first[:4]] + [np.array(first[4][k], copy=True) for k in ("x", "y", "u_applied")]
    second = venv.step(a)
    for was, now in zip(kept, [*first[:4], first[4]["x"], first[4]["y"], first[4]["u_applied"]]):
        np.testing.assert_array_equal(was, now)  # untouched by the second step
    assert not np.array_equal(first[4]["x"], second[4]["x"])  # the state moved on
    arrays = [*second[:4], *(second[4][k] for k in ("x", "y", "u_applied", "clipped", "diverged",
                                                    "state_out_of_bounds", "limit", "bad_outputs"))]
    arrays += [venv.X, venv.Y, venv.Uapp, venv.obs, venv.features.bad]
    for i, p in enumerate(arrays):
        for q in arrays[i + 1:]:
            assert not np.shares_memory(p, q)
