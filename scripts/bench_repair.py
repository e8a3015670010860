"""Benchmark of the repair ILP: solve-time percentiles and feasibility of random requests.

Acceptance (issue 5): p99 <= 10 ms for 1 GPU / 8 tenants, <= 100 ms for 8 GPUs / 32
tenants. The baseline, measured in the same process on the same requests, is the naive
free-placement formulation (one binary per profile@start, the catalog rules as rows).

    python scripts/bench_repair.py                      # 200 requests per case
    python scripts/bench_repair.py --requests 50 --feasibility 100000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rlsched.solver import feasibility_problems, repair, requests_from_configuration
from rlsched.solver.random_requests import random_problem

CASES = {"1 GPU / 8 tenants": (("a100-40gb",), 8, 10.0), "8 GPUs / 32 tenants": (("a100-40gb",) * 8, 32, 100.0)}


def _percentiles(times_ms: list[float]) -> tuple[float, float]:
    return float(np.percentile(times_ms, 50)), float(np.percentile(times_ms, 99))


def bench_case(gpus: tuple[str, ...], tenants: int, requests: int, seed: int) -> dict[str, tuple[float, float]]:
    """p50 / p99 repair time (ms) per formulation, plus the fast path, on the same requests."""
    rng = np.random.default_rng(seed)
    problems = [random_problem(rng, gpus, tenants) for _ in range(requests)]
    found: dict[str, tuple[float, float]] = {}
    for formulation in ("layouts", "placements"):
        times, results = [], []
        for problem in problems:
            result = repair(problem, formulation=formulation)
            assert feasibility_problems(result.configuration, problem) == [], "infeasible repair"
            times.append(result.solve_ms)
            results.append(result)
        found[formulation] = _percentiles(times)
    # Fast path: each repaired configuration asked for exactly, while it is running.
    fast = []
    for problem, result in zip(problems, results):
        memory = {n: r.memory_gib for n, r in problem.tenants.items()}
        again = repair(requests_from_configuration(result.configuration, memory), result.configuration)
        assert again.fast_path
        fast.append(again.solve_ms)
    found["fast path (request already met)"] = _percentiles(fast)
    return found


def feasibility_run(count: int, seed: int) -> tuple[int, float]:
    """Repair ``count`` random requests on mixed small nodes; returns (failures, seconds)."""
    rng = np.random.default_rng(seed)
    gpu_types = ("a100-40gb", "a30-24gb", "v100-16gb", "h100-80gb")
    failures, started = 0, time.perf_counter()
    for i in range(count):
        gpus = tuple(gpu_types[j] for j in rng.integers(0, len(gpu_types), int(rng.integers(1, 3))))
        problem = random_problem(rng, gpus, int(rng.integers(1, 3 * len(gpus) + 1)))
        result = repair(problem)
        failures += bool(result.configuration.problems(list(problem.tenants)) or feasibility_problems(result.configuration, problem))
    return failures, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="random requests per case")
    parser.add_argument("--feasibility", type=int, default=0, help="also repair this many random requests and count infeasible results (e.g. 100000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name, (gpus, tenants, target_ms) in CASES.items():
        found = bench_case(gpus, tenants, args.requests, args.seed)
        base_p50, base_p99 = found["placements"]
        print(f"{name} ({args.requests} requests, p99 target {target_ms:g} ms)")
        for label, (p50, p99) in found.items():
            print(f"  {label:32s} p50 {p50:8.2f} ms  p99 {p99:8.2f} ms  p99 ratio to baseline {p99 / base_p99:5.2f}")
        p99 = found["layouts"][1]
        print(f"  layouts p99 {'meets' if p99 <= target_ms else 'MISSES'} the {target_ms:g} ms target")
    if args.feasibility:
        failures, seconds = feasibility_run(args.feasibility, args.seed)
        print(f"feasibility: {args.feasibility} random requests, {failures} infeasible results, {seconds:.0f} s")


if __name__ == "__main__":
    main()
