"""Decision methods on random node shapes that no scenario in the repository has.

Held-out evaluation uses node shapes and GPU types that are not in the repository. This
benchmark draws such nodes: a MIG-capable GPU of the catalog (A30, A100-40/80GB, H100, H200),
1 to ``--max-gpus`` of them, and 1 to 4 inference services per GPU (plus two) of the calibrated
models, with Poisson or two-state MMPP arrivals, random SLO priorities, and sometimes a
retraining job (for a resnet50 service) and a best-effort tuning job. Each shape is written
as a scenario file under ``--out`` (so any row can be rerun with ``rlsched eval --scenario
FILE``) and every policy runs one episode of it, in this process.

Prints one row per shape: its GPU, GPU count and tenants, ``--reference``'s Goodput (by
default ``static-best``, the best fixed configuration in hindsight) and each policy's ratio to
it (a difference over the reference's magnitude where the reference earns below zero: an
overloaded node), its high-priority SLO attainment and its decision time p99. Then, per policy,
the geometric mean of its ratios over the shapes where the reference and the policy both earn
above zero, how many of its ratios are at or below zero, the worst ratio, and the policies that
failed, with their error::

    python scripts/bench_shapes.py --shapes 16 --seed 1 --duration-s 300 --policies migrator-queue-slo,migrator-ilp --out runs/bench-shapes

On this 2-core machine a 5-minute episode of a 4-GPU, 16-tenant shape takes about a minute for
``migrator-queue-slo`` and a few seconds for ``migrator-ilp`` and ``static-best``.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import traceback
from pathlib import Path

import numpy as np
import yaml
from tqdm import tqdm

from rlsched.agents.evaluation import run_episode
from rlsched.envs.gpushare import GpuShareEnv

#: MIG-capable GPUs of the catalog the shapes draw from.
GPUS = ["a30-24gb", "a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"]
#: Inference models with calibrations, each with an SLO (ms) and a restart time (s) of the
#: scale the bundled scenarios use (SCENARIO PARAMETERS, as there).
MODELS = [("resnet50", 50, 5.0), ("bert-base", 100, 8.0), ("vgg19", 150, 8.0), ("alexnet", 20, 4.0),
          ("vit", 150, 8.0), ("mobilenetv2", 30, 4.0), ("densenet121", 80, 5.0), ("inceptionv3", 80, 5.0)]
POISSON_RATES_RPS = [20, 60, 150, 400]
MMPP_BASE_RPS = [20, 50, 100]


def draw_shape(index: int, rng: random.Random, max_gpus: int, duration_s: float) -> dict:
    """One random node (a scenario document)."""
    gpu_count = rng.randint(1, max_gpus)
    tenants = []
    for k in range(rng.randint(1, 4 * gpu_count + 2)):
        model, slo_ms, restart_s = rng.choice(MODELS)
        if rng.random() < 0.5:
            arrivals = {"kind": "poisson", "rate_rps": rng.choice(POISSON_RATES_RPS)}
        else:
            base = rng.choice(MMPP_BASE_RPS)
            arrivals = {"kind": "mmpp", "rates_rps": [base, base * rng.choice([3, 6])], "mean_sojourn_s": [60, 20]}
        tenants.append({"name": f"s{k}", "model": model, "slo_ms": slo_ms, "priority": rng.choice(["high", "normal", "normal", "low"]),
                        "max_batch": 32, "batch_timeout_ms": 2, "restart_s": restart_s, "arrivals": arrivals})
    if tenants[0]["model"] == "resnet50" and rng.random() < 0.5:
        tenants.append({"name": "retrain-s0", "kind": "continual-learning", "serves": "s0", "model": "resnet50", "restart_s": 10.0,
                        "ekya": {"b0": 0.5, "b1": 2.0, "b2": 0.05}, "samples_per_unit": 3000, "drift_window_s": 600,
                        "active": [{"from_s": 0, "until_s": duration_s / 5}]})
    if rng.random() < 0.5:
        tenants.append({"name": "tune", "kind": "best-effort", "model": "bert-base", "restart_s": 8.0})
    return {"name": f"shape-{index}", "description": "bench_shapes.py: a random node shape", "gpu": GPUS[index % len(GPUS)],
            "gpu_count": gpu_count, "duration_s": duration_s, "decision_interval_s": 10, "tenants": tenants}


def relative(value: float, reference: float) -> float:
    """The ratio to the reference, or, where the reference earns below zero, 1 + the
    difference over its magnitude (above 1: better, as a ratio reads)."""
    return value / reference if reference > 0 else 1.0 + (value - reference) / abs(reference)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=int, default=16, help="how many node shapes to draw")
    parser.add_argument("--seed", type=int, default=1, help="seed of the draw (the episodes run seed 0)")
    parser.add_argument("--max-gpus", type=int, default=4)
    parser.add_argument("--duration-s", type=float, default=300.0, help="episode length, simulated seconds")
    parser.add_argument("--policies", required=True, help="NAME,NAME,...")
    parser.add_argument("--reference", default="static-best")
    parser.add_argument("--out", type=Path, required=True, help="folder the scenario files are written to")
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    files = []
    for index in range(args.shapes):
        path = args.out / f"shape-{index}.yaml"
        path.write_text(yaml.safe_dump(draw_shape(index, rng, args.max_gpus, args.duration_s), sort_keys=False))
        files.append(path)
    ratios: dict[str, list[float]] = {p: [] for p in policies}
    failures: list[str] = []
    rows = []
    for path in tqdm(files, desc="shapes", file=sys.stderr):
        document = yaml.safe_load(path.read_text())
        results = {}
        for name in [args.reference, *policies]:
            try:
                episode = run_episode(GpuShareEnv(path), name, 0)
            except Exception as error:  # a policy that fails on a shape is the finding
                failures.append(f"{path.name} {name}: {type(error).__name__}: {error}")
                traceback.print_exc(file=sys.stderr)
                continue
            high = episode.on_time_high / episode.decided_high if episode.decided_high else math.nan
            results[name] = (episode.goodput, high, float(np.percentile(episode.decision_ms, 99)))
        if args.reference not in results:
            continue
        reference = results[args.reference][0]
        cells = []
        for name in policies:
            if name not in results:
                cells.append("failed")
                continue
            goodput, high, p99 = results[name]
            ratio = relative(goodput, reference)
            if reference > 0:
                ratios[name].append(ratio)
            cells.append(f"{ratio:.3f} ({high:.3f}, {p99:.0f} ms)")
        rows.append(f"| {path.name} | {document['gpu']} x{document['gpu_count']} | {len(document['tenants'])} | {reference:,.0f} | " + " | ".join(cells) + " |")
    print(f"| shape | GPUs | tenants | {args.reference} | " + " | ".join(f"{p} (high SLO, p99)" for p in policies) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(policies))
    print("\n".join(rows))
    print()
    for name in policies:
        values = ratios[name]
        # A ratio at or below 0 (the policy lost Goodput where the reference earned) has no
        # logarithm: counted apart, not folded into the geometric mean as NaN.
        positive = [v for v in values if v > 0.0]
        if values:
            geomean = f"{math.exp(np.log(positive).mean()):.3f}" if positive else "none"
            print(f"{name}: geomean x {args.reference} {geomean} over {len(positive)} shapes whose reference earns above zero "
                  f"and the policy too; {len(values) - len(positive)} at or below 0; worst {min(values):.3f}")
    for failure in failures:
        print(f"FAILED {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
