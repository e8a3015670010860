"""Surrogate benchmark: how fast the tabulated surrogate of the candidate choice steps and
trains, against the request-level environment in the same process, and how far its rewards
and departure advantages are from the simulator's.

    # speed: request-level steps, surrogate steps, PPO training steps on the surrogate
    .venv/bin/python scripts/bench_surrogate.py --scenario default --request-steps 60 --ppo-steps 40000
    # accuracy: one recorded episode against the simulator (path rewards, departures' paired advantages)
    .venv/bin/python scripts/bench_surrogate.py --scenario configs/scenarios/suite/train-bursty-high.yaml --error --every 4
    # reuse tables a training run recorded (<run>/surrogate/*.npz) for the speed figures
    .venv/bin/python scripts/bench_surrogate.py --tables runs/NAME/surrogate --ppo-steps 40000

Prints one JSON object. Speeds are environment steps per wall second on this machine; the
ratios divide by the request-level environment's speed measured in the same process.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def request_level_speed(scenario: str, steps: int, seed: int) -> float:
    """Steps/s of the request-level candidate-choice environment, the library planner deciding."""
    from rlsched.agents.ppo.candidate_env import CandidateChoiceEnv
    from rlsched.envs.gpushare import GpuShareEnv

    env = CandidateChoiceEnv(GpuShareEnv(scenario))
    env.reset(seed=seed)
    started = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.planner_choice())
        if terminated or truncated:
            env.reset(seed=seed + 1)
    return steps / (time.perf_counter() - started)


def surrogate_speed(episodes: list, steps: int, paired_horizon: int) -> float:
    """Steps/s of one surrogate environment, the library planner deciding."""
    from rlsched.agents.ppo.surrogate import SurrogateChoiceEnv

    env = SurrogateChoiceEnv(episodes, paired_horizon=paired_horizon)
    env.reset(seed=0)
    started = time.perf_counter()
    for _ in range(steps):
        _, _, _, truncated, _ = env.step(env.planner_choice())
        if truncated:
            env.reset()
    return steps / (time.perf_counter() - started)


def ppo_speed(episodes: list, steps: int, n_envs: int, paired_horizon: int, expected: bool) -> float:
    """Steps/s of PPO training (rollouts and updates) on ``n_envs`` surrogate environments and
    the candidate scorer, one torch thread as ``rlsched train`` runs it: MaskablePPO with paired
    advantages, or ``expected``: ExpectedPPO with every action's."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlsched.agents.ppo.candidate_policy import CandidateScorerPolicy
    from rlsched.agents.ppo.candidate_train import PairedCandidateAdvantages
    from rlsched.agents.ppo.expected_ppo import ExpectedPPO
    from rlsched.agents.ppo.surrogate import SurrogateChoiceEnv

    torch.set_num_threads(1)
    venv = DummyVecEnv([lambda: SurrogateChoiceEnv(episodes, paired_horizon=paired_horizon, action_advantages=expected) for _ in range(n_envs)])
    model = (ExpectedPPO if expected else MaskablePPO)(CandidateScorerPolicy, venv, n_steps=256, batch_size=1024, n_epochs=5, device="cpu", seed=0,
                                                       normalize_advantage=False, policy_kwargs={"hidden": 64, "prior_weight": 50.0, "learn_prior": False})
    started = time.perf_counter()
    model.learn(steps, callback=None if expected else [PairedCandidateAdvantages()])
    return model.num_timesteps / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="default", help="scenario to record (and to time the request-level environment on)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--tables", type=Path, help="a folder of recorded tables (*.npz) to time instead of recording one")
    parser.add_argument("--request-steps", type=int, default=60, help="request-level steps timed (0: skip)")
    parser.add_argument("--surrogate-steps", type=int, default=20_000)
    parser.add_argument("--ppo-steps", type=int, default=0, help="PPO training steps timed on the surrogate (0: skip)")
    parser.add_argument("--n-envs", type=int, default=16)
    parser.add_argument("--paired-horizon", type=int, default=12, help="> 0 (the advantages' horizon, intervals)")
    parser.add_argument("--error", action="store_true", help="measure the recorded episode against the simulator")
    parser.add_argument("--every", type=int, default=6, help="--error: measure departures at every this many decisions")
    args = parser.parse_args()

    from rlsched.agents.experts import scenario_of
    from rlsched.agents.ppo.surrogate import SurrogateEpisode, record_episode, surrogate_error
    from rlsched.envs.gpushare import GpuShareEnv

    report: dict[str, object] = {"scenario": args.scenario, "seed": args.seed}
    scenario = scenario_of(args.scenario, "--scenario")
    if args.tables:
        episodes = [SurrogateEpisode.load(p) for p in sorted(args.tables.glob("*.npz"))]
        report["tables"] = f"{len(episodes)} from {args.tables}"
    else:
        started = time.perf_counter()
        episodes = [record_episode(GpuShareEnv(scenario), args.seed, args.scenario, progress=True)]
        report["record_s"] = round(time.perf_counter() - started, 1)
    report["candidates"] = [int(e.value.shape[2]) for e in episodes][:20]
    if args.request_steps:
        report["request_level_steps_per_s"] = round(request_level_speed(scenario, args.request_steps, args.seed), 1)
    for horizon in sorted({0, args.paired_horizon}):
        speed = surrogate_speed(episodes, args.surrogate_steps, horizon)
        report[f"surrogate_steps_per_s_paired_{horizon}"] = round(speed, 0)
        if args.request_steps:
            report[f"surrogate_x_request_level_paired_{horizon}"] = round(speed / report["request_level_steps_per_s"], 1)  # type: ignore[operator]
    if args.ppo_steps:
        for name, expected in (("maskable_ppo_paired", False), ("expected_ppo", True)):
            speed = ppo_speed(episodes, args.ppo_steps, args.n_envs, args.paired_horizon, expected)
            report[f"{name}_training_steps_per_s"] = round(speed, 0)
            if args.request_steps:
                report[f"{name}_training_x_request_level_env"] = round(speed / report["request_level_steps_per_s"], 1)  # type: ignore[operator]
    if args.error:
        if args.tables:
            parser.error("--error needs a recorded episode (leave out --tables)")
        report["error"] = surrogate_error(GpuShareEnv(scenario), args.seed, episodes[0], every=args.every)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
