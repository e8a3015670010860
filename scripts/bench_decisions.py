"""Decision time of the decision paths, as ratios to ``migrator-ilp`` in the same process.

For each case (the ``default`` scenario; 8 GPUs / 32 tenants, its tenants replicated as in
``bench_planner.py``) one episode prefix of ``--steps`` decisions per policy, on the same
seed:

- ``migrator-ilp``: the planner MILP every interval;
- ``planner-library``: its time split into the MILP solves a new load asks for (work a
  deployment can run beside the decision loop: the solution joins the library an interval
  later) and the rest (valuing the library, choosing);
- the candidate scorer's network alone (``CandidateScorerPolicy``'s forward pass on one
  observation), without the candidate valuing it needs as input.

    python scripts/bench_decisions.py              # 60 decisions per case
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from rlsched.agents.baselines import apply, make_policy
from rlsched.agents.ppo.candidate_env import CandidateChoiceEnv
from rlsched.agents.ppo.candidate_policy import CandidateScorer
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.workloads.scenario import Scenario, load_scenario
from bench_planner import replicated  # scripts/ is on the path when run as a script


def decision_times(scenario: Scenario, policy_name: str, steps: int) -> tuple[list[float], list[float]]:
    """Per decision: (wall ms of ``act``, ms of it spent in MILP solves for the library)."""
    env = GpuShareEnv(scenario)
    observation, _ = env.reset(seed=0)
    policy = make_policy(policy_name)
    policy.reset(env)
    library = getattr(policy, "library", None)
    total, solving = [], []
    for _ in range(steps):
        solved = library.solve_ms if library is not None else 0.0
        started = time.perf_counter()
        decision = policy.act(observation, env)
        total.append((time.perf_counter() - started) * 1e3)
        solving.append((library.solve_ms if library is not None else 0.0) - solved)
        observation, _, _, truncated, _ = apply(env, decision)
        if truncated:
            break
    return total, solving


def network_ms(repeats: int = 200) -> list[float]:
    """Forward passes of the candidate scorer on one observation, ms each."""
    scorer = CandidateScorer()
    observation = torch.zeros(1, CandidateChoiceEnv(GpuShareEnv("default")).observation_space.shape[0])
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            started = time.perf_counter()
            scorer.forward_actor(observation)
            times.append((time.perf_counter() - started) * 1e3)
    return times


def percentiles(times: list[float]) -> str:
    return f"p50 {np.percentile(times, 50):8.2f} ms  p99 {np.percentile(times, 99):8.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="decisions per case and policy")
    args = parser.parse_args()
    torch.set_num_threads(1)
    default = load_scenario("default")
    for label, scenario in (("default (1 GPU / 4 tenants)", default), ("8 GPUs / 32 tenants", replicated(default, 8))):
        planner, _ = decision_times(scenario, "migrator-ilp", args.steps)
        library, solving = decision_times(scenario, "planner-library", args.steps)
        choosing = [t - s for t, s in zip(library, solving, strict=True)]
        p99 = np.percentile(planner, 99)
        print(f"{label}, {len(planner)} decisions")
        print(f"  migrator-ilp                       {percentiles(planner)}")
        print(f"  planner-library, whole act          {percentiles(library)}  (p99 {np.percentile(library, 99) / p99:.2f}x the planner's)")
        print(f"  planner-library, without the solves {percentiles(choosing)}  (p99 {np.percentile(choosing, 99) / p99:.2f}x; "
              f"{sum(s > 0 for s in solving)} decisions asked for a solve)")
    print(f"candidate scorer network alone: {percentiles(network_ms())}")


if __name__ == "__main__":
    main()
