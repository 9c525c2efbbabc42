"""Train a policy on the Gymnasium env, save it where `hil policy` loads it, prove it in HIL.

    python -m hil.gym.train_example configs/bioreactor_gym.toml --out policies/bioreactor_gym
    python -m hil.gym.train_example configs/bioreactor_gym.toml --out /tmp/p --generations 2 \
        --episode-s 120 --shadow-s 60                                    # a smoke run

1. Train (numpy, CPU): evolution strategies (antithetic Gaussian perturbations, rank-shaped
   fitness, Adam; Salimans et al. 2017) over the weights of one MLP member in the hil-policy
   layout (hil/policy/ensemble.py: standardized features, tanh hidden layer beside a linear
   path, residual on the applied actions: the policy outputs the change of each action per
   step). Each generation evaluates every perturbation on the same `--episodes` randomized
   episodes (common random numbers: seeds drawn per generation) in one HilVectorEnv of
   population x episodes instances: plant, gaps and domain randomization of the scenario, the
   reward of its [gym] section. Actions are kept inside [safety.projection].box.
2. Save: the ensemble (the final mean weights and `--members - 1` draws of the final search
   distribution: their spread is the disagreement the safety wrapper reads), the training
   statistics of the features (mean, covariance: its Mahalanobis check) as a new version of
   the versioned policy directory (hil/policy/store.py), known_good = false (the release
   decision is an operator's).
3. Evaluate: the saved ensemble against the scenario's baseline controller ([safety.fallback],
   the SoftPLC's PID block) in the env on held-out seeds: mean return of each.
4. Shadow: `hil run --lockstep` of the scenario with that version in shadow mode (three
   processes over the bus, the baseline acting, every proposal logged), and the comparison
   printed (hil/gym/deploy.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from hil.gym.residual import residual_box  # the action bounds narrowed to [safety.projection].box


class MemberLayout:
    """Flat parameter vector <-> one member's (W0, W1, b1, W2, b2)."""

    def __init__(self, f: int, h: int, a: int):
        self.shapes = [(f, a), (f, h), (h,), (h, a), (a,)]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.n = sum(self.sizes)

    def unpack(self, theta: np.ndarray) -> list[np.ndarray]:
        """theta (..., n) -> arrays (..., *shape)."""
        out, o = [], 0
        lead = theta.shape[:-1]
        for s, k in zip(self.shapes, self.sizes):
            out.append(theta[..., o:o + k].reshape(lead + s))
            o += k
        return out


def policy_actions(theta, X, x_mean, x_std, y_std, res_idx, layout, lo, hi):
    """Actions (P, E, a) of P members (theta (P, n)) on features X (P, E, f), plant units."""
    W0, W1, b1, W2, b2 = layout.unpack(theta)
    Z = (X - x_mean) / x_std
    H = np.tanh(np.einsum("pef,pfh->peh", Z, W1) + b1[:, None, :])
    O = np.einsum("peh,pha->pea", H, W2) + np.einsum("pef,pfa->pea", Z, W0) + b2[:, None, :]
    return np.clip(X[..., res_idx] + y_std * O, lo, hi)


def feature_floor(spec, features: list[str]) -> np.ndarray:
    """Least scale of each feature: 1 % of its signal's span (0.1 % for a change `d.`), so a
    feature that barely moved while the scaling data was taken cannot blow up the inputs."""
    from hil.policy.features import split_feature
    from hil.safety.config import signal_span

    out = []
    for name in features:
        is_delta, sig = split_feature(name)
        out.append((1e-3 if is_delta else 1e-2) * signal_span(spec, sig))
    return np.array(out)


def rollout_returns(venv, act_fn, seeds, n_steps):
    """Undiscounted returns of one episode per instance (seeds: one per instance), each cut at
    its first termination; act_fn(obs (N, f)) -> actions (N, a). Returns (returns, terminated, X)."""
    obs, _ = venv.reset(seed=[int(s) for s in seeds])
    N = venv.num_envs
    ret = np.zeros(N)
    alive = np.ones(N, dtype=bool)
    terminated_any = np.zeros(N, dtype=bool)
    feats = []
    for _ in range(n_steps):
        feats.append(obs[alive])
        obs, r, term, trunc, _ = venv.step(act_fn(obs))
        ret[alive] += r[alive]
        terminated_any |= term & alive
        alive &= ~(term | trunc)
        if not alive.any():
            break
    return ret, terminated_any, np.concatenate(feats)


def baseline_actions_fn(scenario, spec, names, n):
    """The scenario's baseline controller ([safety.fallback]) for n instances, as act_fn over
    the vector env's state (it reads the measured outputs and applied inputs, as in HIL)."""
    from hil.safety.fallback import FallbackController

    ctrls = [FallbackController(scenario.safety.fallback, spec, names) for _ in range(n)]
    state = {"first": True}

    def act(venv):
        def fn(_obs):
            out = np.empty((n, len(names)))
            dt = 0.0 if state["first"] else venv.model.step_s
            for i, c in enumerate(ctrls):
                y, u = venv.Ymeas[i], venv.Uapp[i]
                out[i] = c.update(y, u, dt)
                c.track(out[i], y, u)
            state["first"] = False
            return out
        return fn
    return act


HELDOUT_SEED = 10_000_000  # held-out episodes: seeds HELDOUT_SEED + i, never drawn in training


def heldout_evaluation(config: str, make_act, *, episodes: int = 8, episode_s: float | None = None,
                       seed0: int = HELDOUT_SEED, baseline: bool = True) -> dict:
    """The yardstick of every trainer here: a policy against the scenario's baseline
    ([safety.fallback], the SoftPLC's PID block) on `episodes` held-out episodes (seeds
    seed0 + i, default HELDOUT_SEED + i, episode 0 each; [gym].episode_s unless `episode_s`), each in a fresh
    vector env of `episodes` instances, the undiscounted [gym].reward summed up to the
    first termination. make_act(venv) -> act_fn(obs (N, f)) -> actions (N, a) in plant units
    (it may read the venv's state, as the baseline does). Returns {"episodes", "episode_s",
    "seeds", "policy": {...}, "baseline": {...}}, each side with `returns` (N,), `mean`,
    `terminated` (N,) bool, `safety_stops` and `features` (the observations it saw);
    baseline=False scores the policy alone (e.g. on validation seeds while training)."""
    import hil.gym

    if episodes < 1:
        raise ValueError(f"episodes: at least 1 held-out episode, got {episodes}")
    over = {} if episode_s is None else {"episode_s": float(episode_s)}
    sc = hil.gym.load(config, over)
    seeds = int(seed0) + np.arange(episodes)
    out: dict = {"episodes": int(episodes), "seeds": [int(s) for s in seeds]}
    for side in ("policy", "baseline") if baseline else ("policy",):
        ev = hil.gym.make_vec(config, episodes, **over)
        m = ev.model
        if side == "policy":
            act = make_act(ev)
        else:
            act = baseline_actions_fn(sc, m.spec, ev.action_names, episodes)(ev)
        ret, term, X = rollout_returns(ev, act, seeds, m.max_steps)
        out["episode_s"] = m.max_steps * m.step_s
        out[side] = {"returns": ret, "mean": float(ret.mean()), "terminated": term,
                     "safety_stops": int(term.sum()), "features": X}
        ev.close()
    return out


def train(config: str, *, out: str, generations: int = 40, pairs: int = 16, episodes: int = 8,
          episode_s: float | None = None, hidden: int = 8, sigma: float = 0.1, lr: float = 0.05,
          members: int = 5, seed: int = 0, log=print) -> dict:
    """Steps 1-3 of the module docstring; returns the saved version's meta plus the evaluation."""
    import hil.gym
    from hil.gym.deploy import save_ensemble
    from hil.policy.ensemble import MLPEnsemble

    over = {} if episode_s is None else {"episode_s": float(episode_s)}
    sc = hil.gym.load(config, over)
    P = 2 * pairs
    venv = hil.gym.make_vec(config, P * episodes, **over)
    m = venv.model
    names, feats = venv.action_names, venv.feature_names
    res_idx = np.array([feats.index(f"u.{a}") for a in names])  # residual on the applied actions
    lo, hi = residual_box(sc, names, m.a_lo, m.a_hi)
    span = m.a_hi - m.a_lo
    y_std = 0.01 * span  # one unit of output = 1 % of the input's span per step
    f, a = len(feats), len(names)
    layout = MemberLayout(f, hidden, a)
    rng = np.random.default_rng(seed)
    n_steps = m.max_steps
    # feature scaling from episodes holding the initial actions
    hold = np.repeat(m.u0[m.action_index][None, :], venv.num_envs, axis=0)
    _, _, X0 = rollout_returns(venv, lambda o: hold, rng.integers(1 << 30, size=venv.num_envs), n_steps)
    X0 = X0[np.isfinite(X0).all(axis=1)]
    x_mean, x_std = X0.mean(0), X0.std(0)
    x_std = np.maximum(x_std, feature_floor(m.spec, feats))
    theta = np.zeros(layout.n)
    adam_m, adam_v = np.zeros_like(theta), np.zeros_like(theta)
    t0 = time.perf_counter()
    steps_total = 0
    history = []
    for gen in range(1, generations + 1):
        eps = rng.standard_normal((pairs, layout.n))
        thetas = np.concatenate([theta + sigma * eps, theta - sigma * eps])  # (P, n)
        ep_seeds = rng.integers(1 << 30, size=episodes)

        def act(obs, thetas=thetas):
            Xo = obs.reshape(P, episodes, f)
            return policy_actions(thetas, Xo, x_mean, x_std, y_std, res_idx, layout, lo, hi).reshape(-1, a)

        ret, term, _ = rollout_returns(venv, act, np.tile(ep_seeds, P), n_steps)
        steps_total += venv.num_envs * n_steps
        fit = ret.reshape(P, episodes).mean(1)
        ranks = np.empty(P)
        ranks[np.argsort(fit)] = np.arange(P)
        shaped = ranks / (P - 1) - 0.5
        grad = -(shaped[:pairs] - shaped[pairs:]) @ eps / (pairs * sigma)  # descent direction of -fitness
        adam_m = 0.9 * adam_m + 0.1 * grad
        adam_v = 0.999 * adam_v + 0.001 * grad * grad
        theta = theta - lr * (adam_m / (1 - 0.9 ** gen)) / (np.sqrt(adam_v / (1 - 0.999 ** gen)) + 1e-8)
        history.append({"generation": gen, "mean_return": float(fit.mean()), "best_return": float(fit.max()),
                        "terminated": int(term.sum())})
        log(f"gen {gen:3d}: return mean {fit.mean():12.1f} best {fit.max():12.1f}  "
            f"safety stops {int(term.sum()):4d}/{venv.num_envs}  {time.perf_counter() - t0:6.1f} s")
    train_s = time.perf_counter() - t0
    # the ensemble: the mean and draws of the final search distribution
    thetas = np.concatenate([theta[None], theta + sigma * 0.5 * rng.standard_normal((members - 1, layout.n))])
    W0, W1, b1, W2, b2 = layout.unpack(thetas)
    ens = MLPEnsemble(x_mean=x_mean, x_std=x_std, y_mean=np.zeros(a), y_std=y_std, W0=W0, W1=W1, b1=b1, W2=W2,
                      b2=b2, residual_index=res_idx)
    # evaluation on held-out seeds: the ensemble (as `hil policy` runs it) vs the baseline

    def ens_act(obs):
        out = ens.predict_batch(obs).mean(axis=0)
        return np.clip(out, lo, hi)

    ev = heldout_evaluation(config, lambda venv: ens_act, episodes=min(episodes, 8), episode_s=episode_s)
    n_eval = ev["episodes"]
    r_pol, t_pol, X = ev["policy"]["returns"], ev["policy"]["terminated"], ev["policy"]["features"]
    r_base, t_base = ev["baseline"]["returns"], ev["baseline"]["terminated"]
    Xf = X[np.isfinite(X).all(axis=1)]
    mean, cov = Xf.mean(0), np.atleast_2d(np.cov(Xf, rowvar=False))
    prec = np.linalg.inv(cov + 1e-9 * np.trace(cov) / cov.shape[0] * np.eye(cov.shape[0]))
    d = np.sqrt(np.einsum("nf,fg,ng->n", Xf - mean, prec, Xf - mean))
    evaluation = {"episodes": n_eval, "episode_s": n_steps * m.step_s,
                  "policy_return": float(r_pol.mean()), "baseline_return": float(r_base.mean()),
                  "policy_safety_stops": int(t_pol.sum()), "baseline_safety_stops": int(t_base.sum())}
    training = {"method": "evolution strategies (antithetic, rank-shaped, Adam)", "generations": generations,
                "population": P, "episodes_per_candidate": episodes, "sigma": sigma, "lr": lr, "hidden": hidden,
                "members": members, "seed": seed, "env_steps": steps_total, "train_s": round(train_s, 2),
                "history": history[-5:], "evaluation": evaluation,
                "mahalanobis": {q: float(np.percentile(d, p)) for q, p in (("p50", 50), ("p99", 99), ("p99.9", 99.9))}
                | {"max": float(d.max())}}
    meta = save_ensemble(out, ens, m.spec.name, feats, names, mean, cov, training,
                         notes=f"trained in hil.gym on {Path(config).name} by evolution strategies")
    log(f"saved {out}/{meta['version']}: return on {n_eval} held-out episodes: policy {r_pol.mean():.1f}, "
        f"baseline {r_base.mean():.1f} (safety stops: policy {int(t_pol.sum())}, baseline {int(t_base.sum())}); "
        f"{steps_total:,} env steps in {train_s:.1f} s ({steps_total / max(train_s, 1e-9):,.0f} steps/s)")
    return meta


def same_seed_returns(config: str, policy_dir: str, version: str, seconds: float) -> dict:
    """Returns in the env, with the safety wrapper in the loop, for episode 0 of the scenario's
    loop.seed (the plant and gap draws of `hil run --lockstep`): the saved policy proposing
    in mode "shadow" (the baseline acts, as in the shadow run: its return stands beside the
    run's KPI) and in mode "full" (the policy acts inside the envelope)."""
    import hil.gym
    from hil.gym.safety import SafetyWrapper
    from hil.policy.loader import load_version
    from hil.policy.store import PolicyStore

    pol = load_version(PolicyStore(policy_dir), version)
    env0 = hil.gym.make(config, episode_s=float(seconds))
    seed = int(env0.model.seed)
    out = {"seed": seed}
    for mode, key in (("shadow", "baseline"), ("full", "policy")):
        env = SafetyWrapper(hil.gym.make(config, episode_s=float(seconds)), mode=mode)
        to_env = [pol.actions.index(n) for n in env.unwrapped.action_names]  # the version's order -> the env's
        obs, _ = env.reset(seed=seed)
        ret, stop = 0.0, False
        while True:
            obs, r, term, trunc, info = env.step(np.asarray(pol.act(obs))[to_env])
            ret += r
            if term or trunc:
                stop = term
                break
        out[f"{key}_return"] = ret
        out[f"{key}_safety_stop"] = bool(stop)
        out[f"{key}_interventions"] = info["interventions"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hil.gym.train_example", description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="configs/bioreactor_gym.toml")
    ap.add_argument("--out", required=True, help="versioned policy directory (a new vN is written)")
    ap.add_argument("--generations", type=int, default=40)
    ap.add_argument("--pairs", type=int, default=16, help="antithetic pairs per generation")
    ap.add_argument("--episodes", type=int, default=8, help="randomized episodes per candidate")
    ap.add_argument("--episode-s", type=float, default=None, help="override [gym].episode_s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shadow-s", type=float, default=1800.0, help="simulated s of the shadow run (0: skip)")
    ap.add_argument("--workdir", default=None, help="where the shadow run writes (default: a temp dir)")
    args = ap.parse_args(argv)
    meta = train(args.config, out=args.out, generations=args.generations, pairs=args.pairs,
                 episodes=args.episodes, episode_s=args.episode_s, seed=args.seed)
    if args.shadow_s > 0:
        from hil.gym.deploy import print_comparison, shadow_run

        res = shadow_run(args.config, args.out, meta["version"], duration_s=args.shadow_s, workdir=args.workdir)
        print_comparison(res)
        same = same_seed_returns(args.config, args.out, meta["version"], args.shadow_s)
        print(f"  in the env with the wrapper, seed {same['seed']} (the HIL run's draws), {args.shadow_s:g} s: return "
              f"with the baseline acting (shadow) {same['baseline_return']:.1f}, with the policy acting (full) "
              f"{same['policy_return']:.1f}; interventions in full: {same['policy_interventions']}")
        print(json.dumps({"version": meta["version"], "evaluation": meta["training"]["evaluation"],
                          "shadow": res["comparison"], "same_seed_env": same}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
