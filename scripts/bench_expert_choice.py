"""Training throughput of ``hedge-ppo``, as ratios to the request-level environment in the same process.

Prints environment steps per second of:

- ``rlsched/GpuShare-v0`` on ``default`` with the planner's configurations held (the
  environment the other PPO policies train on; the baseline of the ratios);
- ``ExpertChoiceEnv`` on the recorded streams, the rule choosing;
- MaskablePPO training on it, 8 environments in this process, with PPO's own (GAE)
  advantages and with the paired counterfactual ones (``configs/train/hedge_ppo.yaml``'s
  settings otherwise).

    python scripts/bench_expert_choice.py --streams runs/hedge-ppo-streams [--steps 16384]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", required=True, type=Path, help="folder of recorded expert streams (*.pkl)")
    parser.add_argument("--steps", type=int, default=16_384, help="PPO steps per training measurement")
    parser.add_argument("--config", default="configs/train/hedge_ppo.yaml")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlsched.agents.baselines import apply, make_policy
    from rlsched.agents.baselines.hedge import MigratorHedge
    from rlsched.agents.experts import ExpertStreams, fit_switch_cost_factor
    from rlsched.agents.ppo.candidate_policy import CandidateScorerPolicy
    from rlsched.agents.ppo.expert_env import EXPERT_LAYOUT, ExpertChoiceEnv
    from rlsched.agents.ppo.expert_train import PairedAdvantages, load_expert_config
    from rlsched.envs.gpushare import GpuShareEnv

    files = sorted(args.streams.glob("*.pkl"))
    if not files:
        raise SystemExit(f"{args.streams}: no recorded streams (*.pkl)")
    streams = [ExpertStreams.load(f) for f in files]
    factor, _ = fit_switch_cost_factor(streams)
    config = load_expert_config(args.config)

    env = GpuShareEnv("default")
    observation, _ = env.reset(seed=0)
    planner = make_policy("migrator-ilp")
    planner.reset(env)
    held = planner.act(observation, env)
    started, steps = time.perf_counter(), 0
    while time.perf_counter() - started < 5.0:
        _, _, _, truncated, _ = apply(env, held)
        steps += 1
        if truncated:
            env.reset(seed=steps)
    base = steps / (time.perf_counter() - started)
    print(f"GpuShare-v0 (default, one configuration held): {base:8.0f} steps/s")

    choice = ExpertChoiceEnv(streams, factor, MigratorHedge())
    choice.reset(seed=0)
    started, steps = time.perf_counter(), 0
    while time.perf_counter() - started < 5.0:
        _, _, _, truncated, _ = choice.step(choice.rule_action())
        steps += 1
        if truncated:
            choice.reset()
    rate = steps / (time.perf_counter() - started)
    print(f"ExpertChoiceEnv, the rule choosing:            {rate:8.0f} steps/s ({rate / base:.1f}x)")

    p = config.ppo
    for advantages in ("gae", "paired"):
        venv = DummyVecEnv([lambda: ExpertChoiceEnv(streams, factor, MigratorHedge()) for _ in range(config.n_envs)])
        model = MaskablePPO(CandidateScorerPolicy, venv, learning_rate=p.learning_rate, n_steps=p.n_steps, batch_size=p.batch_size,
                            n_epochs=p.n_epochs, gamma=p.gamma, ent_coef=p.ent_coef, seed=0, device="cpu",
                            normalize_advantage=advantages == "gae",
                            policy_kwargs={"prior_weight": config.expert_choice.prior_weight, "layout": EXPERT_LAYOUT, "learn_prior": False})
        callback = [PairedAdvantages(streams, factor, config.expert_choice.paired_horizon)] if advantages == "paired" else []
        started = time.perf_counter()
        model.learn(args.steps, callback=callback)
        rate = args.steps / (time.perf_counter() - started)
        print(f"MaskablePPO training, {advantages:6s} advantages:   {rate:8.0f} steps/s ({rate / base:.1f}x)")


if __name__ == "__main__":
    main()
