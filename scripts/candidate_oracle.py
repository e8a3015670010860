"""A foresight oracle over ``candidate-ppo``'s offered slots: how much the candidates hold.

On each episode it follows the library planner (``planner-library``, the candidate policy's
warm start) through :class:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv`. At every
``--every``-th interval it measures each offered slot against the planner's choice with
:meth:`~rlsched.agents.ppo.candidate_env.CandidateChoiceEnv.paired_advantage` (the node's
state copied, the slot applied, then the library planner for ``--horizon`` intervals on the
same arrivals), and applies the best slot if it beats the planner's choice.

It sees the real arrivals ``--horizon`` intervals ahead and chooses greedily, so it is a
reference for what a choice among these candidates could earn, not a bound (a greedy
departure can lose after its horizon). It prints each episode's Goodput against the library
planner's on the same seed; ``--json`` also writes every measured decision point: the
observation the policy sees there, the planner's slot and each slot's paired advantage
(in intervals of the node's requests), as labels for a model of when a departure pays.

    python scripts/candidate_oracle.py --scenario configs/scenarios/suite/heldout-bursty-high.yaml --seeds 0 --every 6
    python scripts/candidate_oracle.py --scenario default --seeds 10,11 --every 1 --json labels.json

About 1 minute per one-hour episode at ``--every 6`` and 4-7 minutes at ``--every 1`` on one
core (docs/history-candidate-policy.md, stop 57).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tqdm import tqdm

from rlsched.agents.experts import scenario_of
from rlsched.agents.ppo.candidate_env import CandidateChoiceEnv
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.fileio import write_text_atomically


def run_episode(spec: str, seed: int, every: int, horizon: int, labels: list[dict[str, Any]] | None, progress: bool) -> dict[str, Any]:
    """One episode: the library planner's Goodput and the oracle's, on the same seed; the
    oracle's measured decision points are appended to ``labels`` (when given)."""
    goodput = {}
    departures = points = 0
    for oracle in (False, True):
        env = CandidateChoiceEnv(GpuShareEnv(scenario_of(spec, "--scenario")))  # its own steps measure nothing
        observation, _ = env.reset(seed=seed)
        bar = tqdm(desc=f"{spec} seed {seed}, {'oracle' if oracle else 'planner-library'}", unit="interval",
                   disable=not progress, leave=False, file=sys.stderr)
        step, done = 0, False
        while not done:
            planner_slot = action = env.planner_choice()
            if oracle and step % every == 0:
                points += 1
                planned = env.observer.configuration(planner_slot)
                advantages: dict[int, float] = {}
                for slot in range(len(env.offered)):
                    configuration = env.observer.configuration(slot)
                    if slot != planner_slot and configuration != planned:
                        advantages[slot] = env.paired_advantage(configuration, planned, horizon)
                best = max(advantages, key=advantages.__getitem__, default=planner_slot)
                if advantages.get(best, 0.0) > 0.0:
                    action = best
                    departures += 1
                if labels is not None:
                    labels.append({"scenario": spec, "seed": seed, "step": step, "observation": observation.tolist(),
                                   "planner_slot": planner_slot, "advantages": {str(k): v for k, v in advantages.items()}})
            observation, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            step += 1
            bar.update()
        bar.close()
        goodput["oracle" if oracle else "planner-library"] = env.env.objective
    return {"scenario": spec, "seed": seed, "every": every, "horizon": horizon, **goodput,
            "ratio": goodput["oracle"] / goodput["planner-library"] if goodput["planner-library"] else None,
            "departures": departures, "decision_points": points}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", required=True, help="a scenario name or file (NAME@TENANT=TRACE[:SCALE[:WARP]] replays a trace)")
    parser.add_argument("--seeds", default="0", help="comma-separated episode seeds")
    parser.add_argument("--every", type=int, default=6, help="measure the slots every this many intervals (1: every interval)")
    parser.add_argument("--horizon", type=int, default=12, help="intervals each branch runs (the slot, then the library planner)")
    parser.add_argument("--json", default=None, help="write the episodes and every measured decision point here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args()
    if args.every < 1 or args.horizon < 1:
        parser.error(f"--every and --horizon must be at least 1 (got {args.every}, {args.horizon})")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: comma-separated integers expected, got {args.seeds!r}")
    labels: list[dict[str, Any]] | None = [] if args.json else None
    episodes = []
    for seed in seeds:
        episode = run_episode(args.scenario, seed, args.every, args.horizon, labels, not args.no_progress)
        episodes.append(episode)
        ratio = "n/a" if episode["ratio"] is None else f"{episode['ratio']:.4f}"
        print(f"{args.scenario} seed {seed}: planner-library {episode['planner-library']:,.0f}, oracle {episode['oracle']:,.0f} "
              f"(x {ratio}), {episode['departures']} departures at {episode['decision_points']} decision points", flush=True)
    if args.json:
        write_text_atomically(args.json, json.dumps({"episodes": episodes, "labels": labels}))
        print(f"wrote {args.json}: {len(episodes)} episodes, {len(labels or [])} decision points")


if __name__ == "__main__":
    main()
