"""Benchmark of ``rlsched plan``: GPUs needed by rlsched vs the iGniter-style greedy.

Random tenant sets (3-24 services drawn from the calibrated inference models; each SLO
between 1.5x and 8x the model's least request latency on the GPU, each rate between 2% and
35% of what one whole GPU serves within that SLO) on A100-40GB, H100-80GB and V100-16GB.
For each set and GPU type: rlsched's plan (verified and repaired in the simulator under
Poisson arrivals), the greedy's plan as it is and after the same verification-driven
repair. Prints GPU totals and ratios, verification pass rates and solve-time percentiles.

    python scripts/bench_plan.py --sets 100 --seed 0 --workers 2 --json bench-plan.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import time

import numpy as np
from tqdm import tqdm

from rlsched.fileio import write_text_atomically
from rlsched.perfmodel import PerformanceModel
from rlsched.solver.capacity import OptionTable, ServiceSpec, max_rate_rps, plan_capacity, plan_igniter
from rlsched.solver.capacity_verify import plan_verified, verify

GPUS = ("a100-40gb", "h100-80gb", "v100-16gb")
#: A service's rate: this range of fractions of what one whole GPU serves within its SLO,
#: and at least MIN_RATE_RPS.
RATE_FRACTIONS = (0.02, 0.35)
MIN_RATE_RPS = 1.0


def draw(rng: random.Random, table: OptionTable, models: list[str]) -> list[ServiceSpec]:
    """One random tenant set for ``table``'s GPU."""
    services = []
    for i in range(rng.randint(3, 24)):
        while True:  # an SLO at which one whole GPU serves fewer than MIN_RATE_RPS / 0.35 requests/s is drawn again
            model = rng.choice(models)
            slo = round(table.min_latency_ms(model) * rng.uniform(1.5, 8.0), 2)
            most = max_rate_rps(table, model, slo)
            if most * RATE_FRACTIONS[1] >= MIN_RATE_RPS:
                break
        rate = most * rng.uniform(*RATE_FRACTIONS)
        services.append(ServiceSpec(f"s{i}", model, slo, max(MIN_RATE_RPS, round(rate, 1))))
    return services


_WORKER: dict[str, object] = {}


def run_set(task: tuple[str, int, list[ServiceSpec], float]) -> dict:
    """Plan one tenant set on one GPU type both ways, verify and repair; one result row."""
    gpu, k, services, duration_s = task
    if "perf" not in _WORKER:  # one performance model per worker process, option tables per GPU type
        _WORKER["perf"] = PerformanceModel.load()
    perf = _WORKER["perf"]
    table = _WORKER.setdefault(gpu, OptionTable(gpu, perf))
    started = time.perf_counter()
    ours, check, repairs = plan_verified(services, lambda s: plan_capacity(s, gpu, perf, table), table, perf, duration_s)
    ours_s = time.perf_counter() - started
    greedy = plan_igniter(services, gpu, perf, table)
    greedy_check = verify(greedy, services, perf, duration_s)
    fixed, fixed_check, _ = plan_verified(services, lambda s: plan_igniter(s, gpu, perf, table), table, perf, duration_s)
    return {"gpu": gpu, "set": k, "services": len(services), "rlsched_gpus": ours.gpus, "lower_bound": ours.lower_bound_gpus,
            "rlsched_solve_s": ours.solve_s, "rlsched_total_s": ours_s, "rlsched_passed": check.passed,
            "rlsched_passed_first": not repairs, "rlsched_min_attainment": min(check.slo_attainment.values()),
            "greedy_gpus": greedy.gpus, "greedy_passed": greedy_check.passed, "greedy_solve_s": greedy.solve_s,
            "greedy_repaired_gpus": fixed.gpus, "greedy_repaired_passed": fixed_check.passed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", type=int, default=100, help="tenant sets per GPU type")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verify-duration-s", type=float, default=60.0, help="simulated seconds per replay, at least")
    parser.add_argument("--workers", type=int, default=1, help="processes (solve times then share the cores)")
    parser.add_argument("--json", default=None, help="write the per-set rows here")
    args = parser.parse_args()
    wall = time.perf_counter()
    perf = PerformanceModel.load()
    models = perf.inference_models()
    tasks = []
    for gpu in GPUS:
        table = OptionTable(gpu, perf)
        rng = random.Random(f"{args.seed}-{gpu}")
        tasks += [(gpu, k, draw(rng, table, models), args.verify_duration_s) for k in range(args.sets)]
    if args.workers > 1:
        # spawn, not fork: forking a process that holds solver and numba threads can deadlock the children
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            rows = list(tqdm(pool.imap(run_set, tasks), total=len(tasks)))
    else:
        rows = [run_set(t) for t in tqdm(tasks)]
    print(f"{'gpu':<10} {'sets':>4} {'rlsched':>7} {'greedy':>6} {'ratio':>6} {'greedy+repair':>13} {'ratio':>6} {'rl pass':>7} {'rl 1st':>6} "
          f"{'gr pass':>7} {'gr+r pass':>9} {'LB=opt':>6} {'p50 s':>6} {'p99 s':>6}")
    for gpu in GPUS + ("total",):
        sel = [r for r in rows if gpu in ("total", r["gpu"])]
        ours = sum(r["rlsched_gpus"] for r in sel)
        greedy = sum(r["greedy_gpus"] for r in sel)
        fixed = sum(r["greedy_repaired_gpus"] for r in sel)
        solve = np.array([r["rlsched_solve_s"] for r in sel])
        print(f"{gpu:<10} {len(sel):>4} {ours:>7} {greedy:>6} {ours / greedy:>6.3f} {fixed:>13} {ours / fixed:>6.3f} "
              f"{np.mean([r['rlsched_passed'] for r in sel]):>7.3f} {np.mean([r['rlsched_passed_first'] for r in sel]):>6.3f} "
              f"{np.mean([r['greedy_passed'] for r in sel]):>7.3f} {np.mean([r['greedy_repaired_passed'] for r in sel]):>9.3f} "
              f"{np.mean([r['lower_bound'] == r['rlsched_gpus'] for r in sel]):>6.3f} "
              f"{np.percentile(solve, 50):>6.2f} {np.percentile(solve, 99):>6.2f}")
    print("columns: GPU totals (rlsched: after verification and repair; greedy: as planned; greedy+repair: after the same verification "
          "and repair); ratio = rlsched / that greedy column (the acceptance ratio is rlsched / greedy+repair); rl pass = rlsched plans "
          "verified (>= 0.99 SLO attainment per service, Poisson) after repair, rl 1st = without repair; gr pass = the greedy's plans as "
          "planned; gr+r pass = after repair; LB=opt = plans proven minimal (column generation converged); p50/p99 s = rlsched solve "
          "time per set (all repair rounds)")
    print(f"wall time {time.perf_counter() - wall:.0f} s with {args.workers} worker(s)")
    if args.json:
        write_text_atomically(args.json, json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
