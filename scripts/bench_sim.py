"""Benchmark the request-level simulator on one core.

Prints simulated seconds per wall second and decision steps per second for a scenario
(default: ``default``) under its reference configuration, requests simulated per second,
and, as a baseline measured in the same process, the time a pure-numpy pass takes to only
generate the same arrivals (the ratio says what the queues, batching and bookkeeping cost
on top of the arrival draw itself).

    .venv/bin/python scripts/bench_sim.py [--scenario default] [--steps 2000] [--perf-model calibrated|toy]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="default")
    parser.add_argument("--steps", type=int, default=2000, help="decision steps to time (episodes restart as needed)")
    parser.add_argument("--perf-model", choices=["calibrated", "toy"], default="calibrated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")

    from rlsched.simulator.node import NodeSimulator
    from rlsched.simulator.run import load_performance_model
    from rlsched.workloads.scenario import load_scenario

    scenario = load_scenario(args.scenario)
    config = scenario.reference
    sim = NodeSimulator(scenario, load_performance_model(args.perf_model), args.seed)
    sim.step(config)  # compile the numba kernels and fill the curve cache before timing
    sim.reset(args.seed)

    requests = 0
    start = time.perf_counter()
    for _ in range(args.steps):
        if sim.done:
            sim.reset()
        result = sim.step(config)
        requests += sum(t.arrived for t in result.tenants.values())
    wall_s = time.perf_counter() - start
    simulated_s = args.steps * scenario.decision_interval_s

    # Baseline: only draw the same arrivals (vectorised numpy), nothing else.
    rng = np.random.default_rng(args.seed)
    processes = [t.arrivals for t in scenario.inference_tenants()]
    for p in processes:
        p.reset(rng)
    base_start = time.perf_counter()
    t = 0.0
    for _ in range(args.steps):
        for p in processes:
            p.sample(t, t + scenario.decision_interval_s, rng)
        t += scenario.decision_interval_s
        if t >= scenario.duration_s:
            t = 0.0
            for p in processes:
                p.reset(rng)
    base_s = time.perf_counter() - base_start

    figures = {
        "scenario": scenario.name,
        "perf_model": args.perf_model,
        "steps": args.steps,
        "decision_interval_s": scenario.decision_interval_s,
        "mean_arrival_rate_rps": round(scenario.total_mean_rate_rps(), 1),
        "requests_per_step": round(requests / args.steps, 1),
        "perf/steps_per_s": round(args.steps / wall_s, 1),
        "perf/simulated_s_per_wall_s": round(simulated_s / wall_s, 1),
        "perf/requests_per_s": round(requests / wall_s),
        "baseline/arrival_generation_steps_per_s": round(args.steps / base_s, 1),
        "ratio_sim_to_arrival_generation_time": round(wall_s / base_s, 2),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:<42} {value}")


if __name__ == "__main__":
    main()
