"""Benchmark rlsched/GpuShare-v0: random actions, all of which must be executed as feasible configurations.

Steps the environment with uniformly random actions (episodes restart as needed) and
checks, for every one, that the applied configuration is feasible for the requests
(``Configuration.problems`` and the repair's memory/share checks). Prints steps per second,
the decision (decode + ILP repair) time p50/p99 in ms, the share of actions the repair had to
change, and exits 1 on the first infeasible configuration.

    .venv/bin/python scripts/bench_env.py [--scenario default] [--actions 100000] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="default", help="bundled scenario name or YAML path")
    parser.add_argument("--actions", type=int, default=100_000, help="random actions to execute")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")

    from tqdm import tqdm

    from rlsched.envs.gpushare import GpuShareEnv
    from rlsched.solver import feasibility_problems

    env = GpuShareEnv(args.scenario)
    env.reset(seed=args.seed)
    env.action_space.seed(args.seed)
    decision_ms = np.empty(args.actions)
    repaired = fallbacks = 0
    started = time.perf_counter()
    for i in tqdm(range(args.actions), desc="random actions", unit="step", mininterval=5.0, file=sys.stderr):
        action = env.action_space.sample()
        _, _, _, truncated, info = env.step(action)
        problem = env.codec.decode(action).problem
        if info["repair_fallback"]:
            problem = env.codec.with_smallest_batches(problem)
        problems = info["configuration"].problems(env.tenant_names) + feasibility_problems(info["configuration"], problem)
        if problems:
            print(f"action {i} ({action.tolist()}): infeasible configuration applied: {problems}", file=sys.stderr)
            return 1
        decision_ms[i] = env.last_repair_ms
        repaired += info["repaired"]
        fallbacks += info["repair_fallback"]
        if truncated:
            env.reset()
    elapsed = time.perf_counter() - started
    figures = {
        "scenario": env.scenario.name,
        "gpus": env.scenario.gpu_count,
        "tenants": len(env.tenant_names),
        "actions": args.actions,
        "infeasible": 0,
        "steps_per_s": args.actions / elapsed,
        "decision_ms_p50": float(np.percentile(decision_ms, 50)),
        "decision_ms_p99": float(np.percentile(decision_ms, 99)),
        "repaired_fraction": repaired / args.actions,
        "batch_fallback_fraction": fallbacks / args.actions,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:24s} {value:.4g}" if isinstance(value, float) else f"{key:24s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
