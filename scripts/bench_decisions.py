"""Decision time of the decision paths, as ratios to ``migrator-ilp`` in the same process.

For each case (the ``default`` scenario; 8 GPUs / 32 tenants, its tenants replicated as in
``bench_planner.py``) one episode prefix of ``--steps`` decisions per policy, on the same
seed:

- ``migrator-ilp``: the planner MILP every interval;
- ``planner-library``: its time split into the MILP solves a new load asks for (work a
  deployment can run beside the decision loop: the solution joins the library an interval
  later) and the rest (valuing the library, choosing);
- the candidate scorer's network alone (``CandidateScorerPolicy``'s forward pass on one
  observation), without the candidate valuing it needs as input;
- with ``--policies NAMES``: each named policy's whole ``act`` (e.g. ``migrator-pf-held``,
  what the daemon's ``auto`` runs on the simulator backend); for one with a candidate library
  (``candidate-ppo:PATH``, ``queue-slo-offered``) also without its solves, and as the daemon runs
  it: the solves on the library's worker thread, done between decisions. The second is the
  daemon's figure: a solve made at once fills caches its decision then reads (the queue
  planner's request-log replays), so the time less the solves understates a decision;
- with ``--hedge-ppo SPEC`` (e.g. ``hedge-ppo:runs/NAME``): ``hedge-ppo``'s time split into
  replaying the last interval in its shadows (work a deployment can run beside the decision
  loop, as soon as the interval's request log is in) and the rest (the evidence, the
  observation, the network, and the planner's MILP while the planner leads).

    python scripts/bench_decisions.py              # 60 decisions per case
    python scripts/bench_decisions.py --hedge-ppo hedge-ppo:runs/hedge-ppo-v1
    python scripts/bench_decisions.py --policies migrator-pf,migrator-pf-held,migrator-hedge
    python scripts/bench_decisions.py --policies candidate-ppo:runs/candidate-ppo
    python scripts/bench_decisions.py --no-priority-fill-scheduler --policies migrator-queue,migrator-hedge-mps   # a real node's auto
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import wait

import numpy as np
import torch

from rlsched.agents.baselines import apply, make_policy
from rlsched.agents.ppo.candidate_env import CandidateChoiceEnv
from rlsched.agents.ppo.candidate_policy import CandidateScorer
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.workloads.scenario import Scenario, load_scenario, without_priority_fill_scheduler
from bench_planner import replicated  # scripts/ is on the path when run as a script


def decision_times(scenario: Scenario, policy_name: str, steps: int, background: bool = False) -> tuple[list[float], list[float]]:
    """Per decision: (wall ms of ``act``, ms spent in MILP solves for the library).

    :param background: the library solves on its worker thread, as the daemon runs it; the
        solves asked for in a decision are waited for before the next one (the daemon's interval,
        10 s in the scenarios, is longer than a solve), outside the timed ``act``, so the
        decisions are those of the solves made at once
    """
    env = GpuShareEnv(scenario)
    observation, _ = env.reset(seed=0)
    policy = make_policy(policy_name)
    if background:
        policy.background_solves = True
    policy.reset(env)
    library = getattr(policy, "library", None)
    total, solving = [], []
    for _ in range(steps):
        solved = library.solve_ms if library is not None else 0.0
        started = time.perf_counter()
        decision = policy.act(observation, env)
        total.append((time.perf_counter() - started) * 1e3)
        if background:
            wait([future for future, _ in library.running])
        solving.append((library.solve_ms if library is not None else 0.0) - solved)
        observation, _, _, truncated, _ = apply(env, decision)
        if truncated:
            break
    return total, solving


def hedge_times(scenario: Scenario, spec: str, steps: int) -> tuple[list[float], list[float]]:
    """Per decision of ``hedge-ppo``: (wall ms of ``act``, ms of it spent replaying the shadows)."""
    env = GpuShareEnv(scenario)
    observation, _ = env.reset(seed=0)
    policy = make_policy(spec)
    policy.reset(env)
    replay = policy.replay_last_interval
    replaying = [0.0]

    def timed(node: GpuShareEnv) -> None:
        started = time.perf_counter()
        replay(node)
        replaying[0] += (time.perf_counter() - started) * 1e3

    policy.replay_last_interval = timed  # type: ignore[method-assign]
    total, shadows = [], []
    for _ in range(steps):
        replaying[0] = 0.0
        started = time.perf_counter()
        decision = policy.act(observation, env)
        total.append((time.perf_counter() - started) * 1e3)
        shadows.append(replaying[0])
        observation, _, _, truncated, _ = apply(env, decision)
        if truncated:
            break
    return total, shadows


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
    parser.add_argument("--policies", default="", help="also time these baselines' whole act (comma-separated names)")
    parser.add_argument("--hedge-ppo", default=None, help="also time this hedge-ppo policy (hedge-ppo or hedge-ppo:PATH)")
    parser.add_argument("--no-priority-fill-scheduler", action="store_true",
                        help="a node without a priority-fill scheduler, as a real rlsched node is (the planners plan MPS only)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    default = load_scenario("default")
    if args.no_priority_fill_scheduler:
        default = without_priority_fill_scheduler(default)
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
        for name in filter(None, args.policies.split(",")):
            whole, solves = decision_times(scenario, name, args.steps)
            print(f"  {name + ', whole act':<36} {percentiles(whole)}  (p99 {np.percentile(whole, 99) / p99:.2f}x the planner's)")
            if any(solves):  # a library policy: the daemon runs its solves beside the loop
                rest = [t - s for t, s in zip(whole, solves, strict=True)]
                print(f"  {name + ', without the solves':<36} {percentiles(rest)}  (p99 {np.percentile(rest, 99) / p99:.2f}x; "
                      f"{sum(s > 0 for s in solves)} decisions asked for a solve)")
                daemon, worker = decision_times(scenario, name, args.steps, background=True)
                # The node's first decision may be a MILP (queue-slo-offered's); a daemon makes it once.
                print(f"  {name + ', solves on the worker':<36} {percentiles(daemon[1:])}  (p99 {np.percentile(daemon[1:], 99) / p99:.2f}x; "
                      f"after the first decision, {daemon[0]:.0f} ms; the worker's solves per decision at most {max(worker) / 1e3:.1f} s)")
        if args.hedge_ppo:
            whole, shadows = hedge_times(scenario, args.hedge_ppo, args.steps)
            rest = [t - s for t, s in zip(whole, shadows, strict=True)]
            print(f"  hedge-ppo, whole act                {percentiles(whole)}  (p99 {np.percentile(whole, 99) / p99:.2f}x the planner's)")
            print(f"  hedge-ppo, without the shadows      {percentiles(rest)}  (p99 {np.percentile(rest, 99) / p99:.2f}x)")
    print(f"candidate scorer network alone: {percentiles(network_ms())}")


if __name__ == "__main__":
    main()
