"""An SB3 recipe against the scenario's baseline: PPO on a residual action, scored by the
same held-out evaluation as hil.gym.train_example (needs the `rl` extra).

    python -m hil.gym.sb3_recipe configs/bioreactor_gym.toml --out runs/sb3 --open-loop base_flow \
        --scale 0.05,0.01 --lr 3e-4 --eval-episodes 16 --max-wall-s 900               # the recipe that wins
    python -m hil.gym.sb3_recipe configs/bioreactor_gym.toml --out /tmp/s --timesteps 512 \
        --n-envs 2 --n-steps 128 --episode-s 120 --eval-every 0                       # a smoke run

The recipe, as an RL engineer would set it up to beat a tuned PID:
- residual RL on the baseline (hil/gym/residual.py): the action is the command of the
  scenario's [safety.fallback] PID block (with the loops `--open-loop` names held at their
  bias: on bioreactor_gym the pH loop, whose electrode carries a per-episode bias) plus a
  correction in [-1, 1] x `--scale` of each input's span (one value or one per action); the
  PID keeps its own state (it does not track the correction: `--track` makes it track the
  action decided, as the HIL wrapper's baseline does, which gives the policy authority over
  the steady state but made PPO unstable in every trial here: see
  docs/guides/train-then-prove.md); the policy's last layer is zero-initialised, so the
  deterministic policy starts AT the controller it rides on (with no loop open: the
  baseline's held-out return, exactly), and its initial log std is small (`--log-std`);
- VecNormalize on observations and rewards (the bus values span six orders of magnitude:
  base flow in L/h, DO in %); gamma 0.99 (a horizon of ~100 s of a 1 s loop, the DO and pH
  loops' time scale), GAE lambda 0.95, episodes of [gym].episode_s (1800 s);
- the SB3 VecEnv adapter (hil.gym.sb3) over `--n-envs` instances of the scenario's vector env
  (plant, gaps, domain randomization of the HIL run);
- model selection as SB3's EvalCallback does it: every `--eval-every` steps the deterministic
  policy is scored on validation seeds (VALIDATION_SEED + i, disjoint from the held-out
  HELDOUT_SEED + i); the best one (the initial zero-correction policy included) is kept;
- training stops at `--timesteps` or `--max-wall-s`, whichever first.
Then the kept policy and the baseline are scored on the held-out seeds by
`hil.gym.train_example.heldout_evaluation` (the code that scores train_example's policies),
and one JSON line is printed: returns, steps, wall s, CPU s, load average, and the
`hil policy import` command that deploys the kept model (its residual recorded in meta.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

VALIDATION_SEED = 20_000_000  # model selection while training: never the held-out seeds


def _residual_policy_act(model, vecnorm, scale, track, fallback=None):
    """make_act(venv) for heldout_evaluation: the model's deterministic correction on the
    normalized observation, added to the venv's baseline (hil.gym.residual)."""
    from hil.gym.residual import residual_act_fn

    def make(venv):
        def corr(obs):
            a, _ = model.predict(vecnorm.normalize_obs(obs), deterministic=True)
            return a
        return residual_act_fn(venv, scale, corr, track, fallback)
    return make


def train(config: str, *, out: str, timesteps: int = 2_000_000, max_wall_s: float = 1500.0, n_envs: int = 16,
          n_steps: int = 256, batch_size: int = 1024, n_epochs: int = 5, lr: float = 1e-4, gamma: float = 0.99,
          gae_lambda: float = 0.95, scale: float | list = 0.1, track: bool = False, log_std: float = -1.5,
          open_loops: list[str] | tuple = (), episode_s: float | None = None,
          eval_every: int = 50_000, eval_episodes: int = 8, threads: int = 1, seed: int = 0, log=print) -> dict:
    """Train, select, evaluate (module docstring). Returns the JSON record."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    import hil.gym
    from hil.gym.residual import make_residual_sb3_vec, open_loops as _open
    from hil.gym.train_example import heldout_evaluation

    for key, v in (("timesteps", timesteps), ("n_envs", n_envs), ("n_steps", n_steps), ("batch_size", batch_size),
                   ("n_epochs", n_epochs), ("eval_episodes", eval_episodes), ("threads", threads)):
        if int(v) < 1:
            raise ValueError(f"{key}: must be >= 1, got {v}")
    for key, v in (("lr", lr), ("scale", np.min(scale)), ("max_wall_s", max_wall_s)):
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{key}: must be > 0 and finite, got {v}")
    if not 0 < gamma <= 1 or not 0 <= gae_lambda <= 1:
        raise ValueError(f"gamma in (0, 1] and gae_lambda in [0, 1], got {gamma}, {gae_lambda}")
    torch.set_num_threads(int(threads))
    over = {} if episode_s is None else {"episode_s": float(episode_s)}
    sc = hil.gym.load(config, over)
    if sc.safety is None:
        raise ValueError(f"{config}: no [safety] section, so no baseline to ride on")
    fallback = _open(sc.safety.fallback, list(open_loops))
    load0 = os.getloadavg()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    venv = VecNormalize(make_residual_sb3_vec(config, n_envs, scale=scale, track=track, fallback=fallback, **over),
                        norm_obs=True, norm_reward=True, gamma=gamma, clip_obs=10.0)
    venv.seed(seed)
    model = PPO("MlpPolicy", venv, n_steps=n_steps, batch_size=min(batch_size, n_steps * n_envs), n_epochs=n_epochs,
                learning_rate=lr, gamma=gamma, gae_lambda=gae_lambda, clip_range=0.2, ent_coef=0.0,
                policy_kwargs={"log_std_init": log_std, "net_arch": [64, 64]}, seed=seed, device="cpu", verbose=0)
    with torch.no_grad():  # the deterministic policy starts at the baseline: a zero correction
        model.policy.action_net.weight.zero_()
        model.policy.action_net.bias.zero_()
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    history: list[dict] = []
    best = {"validation_return": -np.inf, "steps": 0}

    def validate(steps: int) -> None:
        venv.training = False
        ev = heldout_evaluation(config, _residual_policy_act(model, venv, scale, track, fallback),
                                episodes=eval_episodes,
                                episode_s=episode_s, seed0=VALIDATION_SEED, baseline=False)
        venv.training = True
        r = ev["policy"]["mean"]
        history.append({"steps": steps, "validation_return": round(r, 3),
                        "wall_s": round(time.perf_counter() - wall0, 1)})
        log(f"{steps:9,d} steps: validation return {r:9.2f}  (best {max(r, best['validation_return']):9.2f})  "
            f"{time.perf_counter() - wall0:7.1f} s")
        if r > best["validation_return"]:
            best.update(validation_return=r, steps=steps)
            model.save(outp / "ppo_best.zip")
            venv.save(str(outp / "vecnormalize_best.pkl"))

    class Loop(BaseCallback):
        def __init__(self):
            super().__init__()
            self.next_eval = eval_every

        def _on_step(self) -> bool:
            if eval_every and self.num_timesteps >= self.next_eval:
                self.next_eval += eval_every
                validate(self.num_timesteps)
            return time.perf_counter() - wall0 < max_wall_s

    if eval_every:
        validate(0)
    model.learn(total_timesteps=int(timesteps), callback=Loop())
    steps = int(model.num_timesteps)
    if eval_every:
        validate(steps)
    train_wall, train_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    load1 = os.getloadavg()
    model.save(outp / "ppo_last.zip")
    venv.save(str(outp / "vecnormalize_last.pkl"))
    if eval_every:  # the selected policy
        model = PPO.load(outp / "ppo_best.zip", device="cpu")
        venv = VecNormalize.load(str(outp / "vecnormalize_best.pkl"), venv.venv)
    else:
        model.save(outp / "ppo_best.zip")
        venv.save(str(outp / "vecnormalize_best.pkl"))
    venv.training = False
    ev = heldout_evaluation(config, _residual_policy_act(model, venv, scale, track, fallback), episodes=8,
                            episode_s=episode_s)
    # the controller the residual rides on, alone (a zero correction): what PPO added is the difference
    from hil.gym.residual import residual_act_fn

    def rides_on(v):
        return residual_act_fn(v, scale, lambda obs: np.zeros((v.num_envs, len(v.action_names))), track, fallback)
    ev0 = heldout_evaluation(config, rides_on, episodes=8, episode_s=episode_s, baseline=False)
    rec = {"algorithm": "PPO, residual on [safety.fallback]" + (f" with {', '.join(open_loops)} open (held at "
                                                                "the loop's bias)" if open_loops else ""),
           "config": str(config), "residual": {"scale": scale, "track": track, "fallback": fallback.model_dump()},
           "policy_return": round(ev["policy"]["mean"], 3), "baseline_return": round(ev["baseline"]["mean"], 3),
           "beats_baseline": bool(ev["policy"]["mean"] > ev["baseline"]["mean"]),
           "rides_on_return": round(ev0["policy"]["mean"], 3),
           "steps_per_s": round(steps / train_wall, 1),
           "policy_returns": [round(float(r), 3) for r in ev["policy"]["returns"]],
           "baseline_returns": [round(float(r), 3) for r in ev["baseline"]["returns"]],
           "safety_stops": {"policy": ev["policy"]["safety_stops"], "baseline": ev["baseline"]["safety_stops"]},
           "heldout_seeds": ev["seeds"], "episode_s": ev["episode_s"],
           "steps": steps, "selected_at_steps": best["steps"] if eval_every else steps,
           "wall_s": round(train_wall, 1), "cpu_s": round(train_cpu, 1),
           "load_avg_1min": {"start": round(load0[0], 2), "end": round(load1[0], 2)},
           "hyper": {"n_envs": n_envs, "n_steps": n_steps, "batch_size": batch_size, "n_epochs": n_epochs, "lr": lr,
                     "gamma": gamma, "gae_lambda": gae_lambda, "scale": scale, "track": track,
                     "open_loops": list(open_loops), "log_std_init": log_std,
                     "net_arch": [64, 64], "eval_every": eval_every, "eval_episodes": eval_episodes,
                     "timesteps": timesteps,
                     "max_wall_s": max_wall_s, "threads": threads, "seed": seed},
           "validation": history, "model": str(outp / "ppo_best.zip"),
           "vecnormalize": str(outp / "vecnormalize_best.pkl"),
           "import_command": " ".join(
               ["hil policy import", str(outp / "ppo_best.zip"), str(config), "--out", "DIR", "--vecnormalize",
                str(outp / "vecnormalize_best.pkl"), "--residual-scale",
                ",".join(str(float(v)) for v in np.atleast_1d(scale))]
               + (["--residual-track"] if track else [])
               + [f"--residual-open-loop {n}" for n in open_loops])}
    (outp / "result.json").write_text(json.dumps(rec, indent=1))
    return rec


def _scales(text: str):
    vals = [float(v) for v in text.split(",")]
    return vals[0] if len(vals) == 1 else vals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hil.gym.sb3_recipe", description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="configs/bioreactor_gym.toml")
    ap.add_argument("--out", required=True, help="directory for the models, normalizers and result.json")
    ap.add_argument("--timesteps", type=int, default=2_000_000)
    ap.add_argument("--max-wall-s", type=float, default=1500.0, help="stop training after this many wall s")
    ap.add_argument("--n-envs", type=int, default=16)
    ap.add_argument("--n-steps", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--n-epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--gamma", type=float, default=0.99)
    ap.add_argument("--scale", type=_scales, default=0.1,
                    help="largest correction, fraction of each input's span: one value, or one per action in the "
                         "env's order (comma-separated, e.g. 0.05,0.01 for agitation_power, base_flow)")
    ap.add_argument("--track", action="store_true", help="the baseline PID tracks the corrected action (residual.py)")
    ap.add_argument("--open-loop", action="append", default=[], metavar="INPUT",
                    help="ride on [safety.fallback] with this input's loop open (held at its bias); repeatable")
    ap.add_argument("--log-std", type=float, default=-1.5, help="initial log std of the correction")
    ap.add_argument("--episode-s", type=float, default=None, help="override [gym].episode_s")
    ap.add_argument("--eval-every", type=int, default=50_000, help="validation period in steps (0: no selection)")
    ap.add_argument("--eval-episodes", type=int, default=8, help="validation episodes per selection point")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rec = train(args.config, out=args.out, timesteps=args.timesteps, max_wall_s=args.max_wall_s, n_envs=args.n_envs,
                n_steps=args.n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs, lr=args.lr,
                gamma=args.gamma, scale=args.scale, track=args.track, log_std=args.log_std, open_loops=args.open_loop,
                episode_s=args.episode_s,
                eval_every=args.eval_every, eval_episodes=args.eval_episodes, threads=args.threads, seed=args.seed,
                log=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
