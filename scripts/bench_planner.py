"""Benchmark of the planner MILP (``migrator-ilp``, and the true-rate planner of the hindsight search): solve-time percentiles.

Two cases, each planning every decision interval of a simulated episode (so the rates,
queues and running configuration are the ones the planner really meets):

- the ``default`` scenario (1 A100-40GB, 4 inference tenants);
- 8 GPUs / 32 tenants: the default scenario's tenants replicated 8 times (rates unchanged
  per copy), the reference configuration on every GPU.

The plan is applied and simulated each step (the next plan starts from it). Times are
wall-clock build + solve of the MILP (value table included), one thread.

    python scripts/bench_planner.py                 # 60 decisions per case
    python scripts/bench_planner.py --steps 360
"""

from __future__ import annotations

import argparse
import copy
import dataclasses

import numpy as np

from rlsched.decision import Configuration, TenantPlacement
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.solver.planner import Planner
from rlsched.workloads.scenario import Scenario, load_scenario


def replicated(scenario: Scenario, copies: int) -> Scenario:
    """``scenario`` with its tenants and reference configuration copied onto ``copies`` GPUs."""
    tenants, placements = [], {}
    reference = scenario.reference
    assert reference is not None
    for k in range(copies):
        for t in scenario.tenants:
            tenants.append(dataclasses.replace(copy.deepcopy(t), name=f"{t.name}{k}"))
            p = reference.placements[t.name]
            placements[f"{t.name}{k}"] = TenantPlacement(k, p.instance_index, p.mps_pct, p.batch_size)
    config = Configuration(reference.layouts * copies, reference.modes * copies, placements)
    return dataclasses.replace(scenario, name=f"{scenario.name}-x{copies}", gpu_count=scenario.gpu_count * copies,
                               tenants=tenants, reference=config)


def bench(scenario: Scenario, steps: int, lookahead: int) -> dict[str, float]:
    """Plan (true rates of the next ``lookahead`` windows + queues) and apply, ``steps`` times."""
    env = GpuShareEnv(scenario)
    env.reset(seed=0)
    planner = Planner(env.scenario, env.backend.perf_model, env.backend.memory_gib)
    simulator = env.backend.simulator
    times, columns = [], []
    for _ in range(steps):
        measured = env.backend.observe()
        windows = simulator.upcoming_rates_rps(lookahead)
        backlog = {n: float(measured[n].get("queue_length", 0.0)) for n in windows[0]}
        plan = planner.plan(planner.forecast(windows, backlog), env.current)
        times.append(plan.solve_ms)
        columns.append(plan.columns)
        _, _, _, truncated, _ = env.step_configuration(plan.configuration)
        if truncated:
            break
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)),
            "max_ms": float(np.max(times)), "columns": float(np.mean(columns)), "plans": float(len(times))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="decisions per case")
    parser.add_argument("--lookahead", type=int, default=3, help="windows the planner looks ahead")
    args = parser.parse_args()
    default = load_scenario("default")
    for label, scenario in (("default (1 GPU / 4 tenants)", default), ("8 GPUs / 32 tenants", replicated(default, 8))):
        r = bench(scenario, args.steps, args.lookahead)
        print(f"{label}: {int(r['plans'])} plans, ~{r['columns']:.0f} columns, solve p50 {r['p50_ms']:.1f} ms, "
              f"p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms (decision interval {scenario.decision_interval_s:.0f} s)")


if __name__ == "__main__":
    main()
