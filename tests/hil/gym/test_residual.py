"""hil.gym.residual and hil.gym.sb3_recipe: the residual action on the baseline reproduces the
baseline exactly at zero correction (the held-out return train_example scores it with, and
the SB3 VecEnv's trajectories across autoresets), a correction moves the action by its scale
of the span, bad arguments are refused by name, and the SB3 recipe runs end to end at smoke
scale, scoring the baseline exactly as train_example does."""

import numpy as np
import pytest

import hil.gym
from hil.gym.residual import ResidualActions, residual_act_fn
from hil.gym.train_example import HELDOUT_SEED, baseline_actions_fn, heldout_evaluation, rollout_returns
from tests.hil.gym.helpers import CONFIG


def _zero(venv):
    return residual_act_fn(venv, 0.1, lambda obs: np.zeros((venv.num_envs, len(venv.action_names))))


def test_zero_correction_is_the_baseline_on_the_heldout_evaluation():
    ev = heldout_evaluation(CONFIG, _zero, episodes=3, episode_s=240.0)
    assert ev["seeds"] == [HELDOUT_SEED, HELDOUT_SEED + 1, HELDOUT_SEED + 2] and ev["episode_s"] == 240.0
    assert np.array_equal(ev["policy"]["returns"], ev["baseline"]["returns"])
    assert np.array_equal(ev["policy"]["features"], ev["baseline"]["features"])
    assert ev["baseline"]["mean"] < 0  # the reward is a cost: a real score, not an empty rollout


def test_heldout_baseline_is_train_examples_rollout():
    """The evaluation's baseline side is baseline_actions_fn rolled out on the held-out seeds."""
    ev = heldout_evaluation(CONFIG, _zero, episodes=2, episode_s=120.0)
    sc = hil.gym.load(CONFIG, {"episode_s": 120.0})
    v = hil.gym.make_vec(CONFIG, 2, episode_s=120.0)
    ret, term, _ = rollout_returns(v, baseline_actions_fn(sc, v.model.spec, v.action_names, 2)(v),
                                   HELDOUT_SEED + np.arange(2), v.model.max_steps)
    assert np.array_equal(ret, ev["baseline"]["returns"])
    assert not term.any() and ev["baseline"]["safety_stops"] == 0


def test_correction_moves_the_action_by_its_scale_of_the_span():
    v = hil.gym.make_vec(CONFIG, 2, episode_s=60.0)
    v.reset(seed=3)
    base = ResidualActions(v, 0.1)
    plus = ResidualActions(v, 0.1)
    b = base.actions(np.zeros((2, 2)))
    corr = np.array([[0.5, -0.5], [2.0, np.nan]])  # clipped to 1; NaN -> 0
    p = plus.actions(corr)
    span = v.model.a_hi - v.model.a_lo
    want = np.clip(b + 0.1 * span * np.array([[0.5, -0.5], [1.0, 0.0]]), plus.lo, plus.hi)
    assert np.allclose(p, want, rtol=0, atol=1e-15)
    assert not np.array_equal(p, b)
    names = v.action_names
    box = hil.gym.load(CONFIG).safety.projection.box
    for j, n in enumerate(names):
        assert (plus.lo[j], plus.hi[j]) == tuple(box[n])


@pytest.mark.parametrize("scale", [0.0, -0.1, np.nan, [0.1, 0.1, 0.1]])
def test_bad_scale_is_refused(scale):
    v = hil.gym.make_vec(CONFIG, 1, episode_s=60.0)
    with pytest.raises(ValueError, match="scale"):
        ResidualActions(v, scale)


def test_no_baseline_is_refused():
    """A scenario without [safety] has no baseline to add a correction to (one with [safety]
    has a fallback for every action: the scenario's validation demands it)."""
    from types import SimpleNamespace

    v = hil.gym.make_vec(CONFIG, 1, episode_s=60.0)
    bare = SimpleNamespace(model=SimpleNamespace(scenario=v.model.scenario.model_copy(update={"safety": None})),
                           action_names=v.action_names, num_envs=1)
    with pytest.raises(ValueError, match="baseline controller"):
        ResidualActions(bare, 0.1)


def test_sb3_residual_env_is_the_baseline_across_autoresets():
    """Zero corrections through the SB3 VecEnv for two 30-step episodes per instance: every
    reward is the baseline's on the same seed and episode (the controllers restart with each
    episode, as the baseline's do)."""
    pytest.importorskip("stable_baselines3")
    from hil.gym.residual import make_residual_sb3_vec

    venv = make_residual_sb3_vec(CONFIG, 2, scale=0.1, episode_s=30.0, parallel=False)
    assert venv.action_space.shape == (2,) and venv.action_space.low.min() == -1.0
    venv.seed(11)
    venv.reset()
    got = []
    for _ in range(60):
        _, r, dones, _ = venv.step(np.zeros((2, 2), dtype=np.float32))
        got.append(r)
    got = np.array(got)
    sc = hil.gym.load(CONFIG, {"episode_s": 30.0})
    for i in range(2):
        for ep in range(2):
            env = hil.gym.make(CONFIG, episode_s=30.0)
            env.reset(seed=11 + i)
            for _ in range(ep):
                env.reset()
            base = baseline_actions_fn(sc, env.model.spec, env.action_names, 1)

            class One:  # the single env as the baseline's view of a vector env
                model = env.model
                Ymeas = env.y_meas[None]
                Uapp = env.u_app[None]
            act = base(One)
            rew = []
            for _ in range(30):
                One.Ymeas, One.Uapp = env.y_meas[None], env.u_app[None]
                _, r, _, _, _ = env.step(act(None)[0])
                rew.append(r)
            assert np.allclose(got[30 * ep:30 * ep + 30, i], np.float32(rew), rtol=0, atol=0), (i, ep)


def test_sb3_recipe_smoke(tmp_path):
    """A few hundred PPO steps end to end: the JSON record, the saved model and normalizer, the
    baseline scored exactly as heldout_evaluation / train_example score it."""
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("torch")
    from hil.gym import sb3_recipe

    rec = sb3_recipe.train(str(CONFIG), out=str(tmp_path), timesteps=256, n_envs=2, n_steps=128, batch_size=64,
                           n_epochs=1, episode_s=60.0, eval_every=128, eval_episodes=2, log=lambda s: None)
    ev = heldout_evaluation(CONFIG, _zero, episodes=8, episode_s=60.0)
    assert rec["baseline_returns"] == [round(float(r), 3) for r in ev["baseline"]["returns"]]
    assert rec["heldout_seeds"] == ev["seeds"] and rec["episode_s"] == 60.0
    assert rec["steps"] >= 256 and [h["steps"] for h in rec["validation"]][0] == 0
    assert np.isfinite(rec["policy_return"])
    assert rec["beats_baseline"] == (rec["policy_return"] > rec["baseline_return"])
    assert rec["rides_on_return"] == round(float(ev["policy"]["mean"]), 3)  # nothing open: the baseline
    assert "--residual-scale 0.1" in rec["import_command"] and rec["steps_per_s"] > 0
    for f in ("ppo_best.zip", "vecnormalize_best.pkl", "ppo_last.zip", "result.json"):
        assert (tmp_path / f).is_file()
    with pytest.raises(ValueError, match="n_envs"):
        sb3_recipe.train(str(CONFIG), out=str(tmp_path), n_envs=0)


def test_track_carries_a_correction_into_the_pid():
    """track=True: the PID continues from the corrected action (its integral takes the
    correction, as the HIL wrapper's baseline tracks what acted); track=False: the PID's
    command ignores it. Two decisions on the same observation (no plant step between: the
    same error, so the second PID command differs from the first only by the integration)."""
    v = hil.gym.make_vec(CONFIG, 1, episode_s=60.0)
    v.reset(seed=5)
    ia = v.action_names.index("agitation_power")
    kick = np.zeros((1, 2))
    kick[0, ia] = 1.0
    out = {}
    for track in (True, False):
        res = ResidualActions(v, 0.01, track=track)
        first = res.actions(kick)
        second = res.actions(np.zeros((1, 2)))
        out[track] = (first, second)
    amp = 0.01 * (v.model.a_hi - v.model.a_lo)[ia]
    assert np.array_equal(out[True][0], out[False][0])  # the first decision: same PID, same kick
    assert out[True][1][0, ia] - out[False][1][0, ia] == pytest.approx(amp, rel=1e-9)


def test_open_loops_holds_the_input_at_its_loop_bias():
    """open_loops: the named loop leaves the PID block and its input is held at the loop's bias
    (what the recipe rides on for the pH loop); the other loops are untouched; an input
    without a loop is refused by name."""
    from hil.gym.residual import open_loops

    sc = hil.gym.load(CONFIG)
    section = open_loops(sc.safety.fallback, ["base_flow"])
    assert [lp.input for lp in section.loops] == ["agitation_power"]
    assert section.fixed == {"base_flow": 0.0003}
    assert len(sc.safety.fallback.loops) == 2  # the scenario's own section is not modified
    v = hil.gym.make_vec(CONFIG, 2, episode_s=60.0)
    v.reset(seed=4)
    shut = ResidualActions(v, 0.1, fallback=section)
    full = ResidualActions(v, 0.1)
    ib, ia = v.action_names.index("base_flow"), v.action_names.index("agitation_power")
    for _ in range(30):
        a = shut.actions(np.zeros((2, 2)))
        b = full.actions(np.zeros((2, 2)))
        assert np.all(a[:, ib] == 0.0003)
        assert np.array_equal(a[:, ia], b[:, ia])  # same observations, same DO loop
        v.step(a)
    assert np.any(b[:, ib] != 0.0003)  # the closed pH loop would have moved the base flow
    with pytest.raises(ValueError, match="feed_rate"):
        open_loops(sc.safety.fallback, ["feed_rate"])
