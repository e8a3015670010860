"""Fit the constants of ``rlsched plan``'s request-latency estimate against the simulator.

Draws random operating points (GPU type, model, GI profile, MPS share, co-runner pressure,
maximum batch, and a rate between 2% and 98% of what that batch serves), replays each in
the simulator's request-level queue (:func:`rlsched.simulator.queueing.replay_poisson_p99_ms`:
Poisson arrivals, the dynamic batcher, lognormal service), and grid-searches the constants
of :func:`rlsched.solver.capacity.request_p99_many_ms` on one set of points: the tightest
(least median over-prediction) whose predictions are optimistic by more than 5% on at most
2% of the points. It then reports the error on held-back points drawn with another seed and
writes the chosen constants, with their source, to ``configs/calibration/plan-latency.yaml``.

    python scripts/calibrate_plan_latency.py --points 1500 --seed 0
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

from rlsched.decision import BATCH_LEVELS
from rlsched.fileio import write_text_atomically
from rlsched.perfmodel import PerformanceModel
from rlsched.perfmodel.calibration import packaged_calibration_dir
from rlsched.simulator.queueing import replay_poisson_p99_ms
from rlsched.solver.capacity import BATCH_TIMEOUT_MS, QUEUEING_CALIBRATION_FILE, OptionTable, QueueingCalibration, request_p99_many_ms

GPUS = ("a100-40gb", "h100-80gb", "v100-16gb")
#: The grid searched (quantiles of the in-flight and own batch sizes; the tail constant).
IN_FLIGHT_QUANTILES = (0.5, 0.6915, 0.8413, 0.9332)
OWN_BATCH_QUANTILES = (0.9, 0.95, 0.99)
TAIL_CONSTANTS = (0.5, 0.7, 1.0)
#: The planner keeps this headroom below a server's full-batch throughput: a policy, not a
#: fit (near saturation a replay's p99 depends on the run length more than on the server).
MAX_LOAD = 0.9
#: The acceptance rule of a candidate: at most this share of points under-predicted by more than 5%.
MAX_OPTIMISTIC_SHARE = 0.02
#: Requests per replay (at least; more at high rates so that a replay lasts >= 10 s).
REPLAY_REQUESTS = 40_000


def draw_points(count: int, seed: int, perf: PerformanceModel) -> dict[str, np.ndarray]:
    """``count`` operating points and their replayed p99 (ms), as arrays."""
    rng = random.Random(seed)
    tables = {g: OptionTable(g, perf) for g in GPUS}
    models = perf.inference_models()
    mean, p99, batch, rate, replayed = [], [], [], [], []
    for _ in range(count):
        table = tables[rng.choice(GPUS)]
        model, profile, share = rng.choice(models), rng.choice(table.profiles), rng.choice(table.shares)
        b = rng.choice(table.batches(model, profile) or [1])
        pressure = rng.choice([0.0, rng.uniform(0.0, 1.5)])
        m0, p0, m1, p1 = table.curves(model, profile, share)
        m, p = m0 + pressure * (m1 - m0), p0 + pressure * (p1 - p0)
        r = b * 1000.0 / m[b - 1] * rng.uniform(0.02, 0.98)
        mean.append(m), p99.append(p), batch.append(b), rate.append(r)
        replayed.append(replay_poisson_p99_ms(m, p, b, r, BATCH_TIMEOUT_MS, max(REPLAY_REQUESTS, int(r * 10)), rng.randrange(1 << 30)))
    return {"mean": np.array(mean), "p99": np.array(p99), "batch": np.array(batch), "rate": np.array(rate), "replayed": np.array(replayed)}


def errors(points: dict[str, np.ndarray], cal: QueueingCalibration) -> dict[str, float]:
    """Predicted over replayed p99 on the points both find finite: median, 5th and 95th
    percentile, shares under-predicted by > 5% and > 10%, the worst; and the share of points
    the estimate rejects (above the load limit)."""
    predicted = request_p99_many_ms(points["mean"], points["p99"], points["batch"], points["rate"], BATCH_TIMEOUT_MS, cal)
    both = np.isfinite(predicted) & np.isfinite(points["replayed"])
    ratio = predicted[both] / points["replayed"][both]
    return {"points": int(both.sum()), "rejected": float(np.mean(~np.isfinite(predicted))), "median": float(np.median(ratio)),
            "p5": float(np.percentile(ratio, 5)), "p95": float(np.percentile(ratio, 95)), "optimistic_5pct": float(np.mean(ratio < 0.95)),
            "optimistic_10pct": float(np.mean(ratio < 0.90)), "worst": float(ratio.min())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=1500, help="points per set (fit and held-back)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fit set (the held-back set uses seed + 1)")
    parser.add_argument("--out", type=Path, default=packaged_calibration_dir() / QUEUEING_CALIBRATION_FILE)
    args = parser.parse_args()
    perf = PerformanceModel.load()
    started = time.perf_counter()
    fit, held = draw_points(args.points, args.seed, perf), draw_points(args.points, args.seed + 1, perf)
    print(f"replayed {2 * args.points} points in {time.perf_counter() - started:.1f} s")
    best = None
    for q_in, q_own, c in itertools.product(IN_FLIGHT_QUANTILES, OWN_BATCH_QUANTILES, TAIL_CONSTANTS):
        cal = QueueingCalibration(q_in, q_own, c, MAX_LOAD, "candidate")
        e = errors(fit, cal)
        if e["optimistic_5pct"] <= MAX_OPTIMISTIC_SHARE and (best is None or e["median"] < best[1]["median"]):
            best = (cal, e)
    if best is None:
        raise SystemExit(f"no candidate on the grid keeps under-predictions by > 5% to {MAX_OPTIMISTIC_SHARE:.0%} of the points")
    cal, fit_errors = best
    held_errors = errors(held, cal)
    for name, e in (("fit", fit_errors), ("held-back", held_errors)):
        print(f"{name:>9}: {e['points']} points, predicted/replayed median {e['median']:.3f} (p5 {e['p5']:.3f}, p95 {e['p95']:.3f}), "
              f"under by >5% {e['optimistic_5pct']:.1%}, >10% {e['optimistic_10pct']:.1%}, worst {e['worst']:.3f}; rejected {e['rejected']:.1%}")
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    source = (f"scripts/calibrate_plan_latency.py --points {args.points} --seed {args.seed} ({day}): grid fit against "
              f"{args.points} replays of the simulator's queue (Poisson, dynamic batcher, lognormal service; {', '.join(GPUS)}, "
              f"every calibrated inference model, GI profile, MPS share, batch {BATCH_LEVELS[0]}-{BATCH_LEVELS[-1]}, 2-98% load); "
              f"on {held_errors['points']} held-back replays (seed {args.seed + 1}) predicted/replayed p99 median "
              f"{held_errors['median']:.3f}, p5 {held_errors['p5']:.3f}, p95 {held_errors['p95']:.3f}, under-predicted by >5% on "
              f"{held_errors['optimistic_5pct']:.1%} and by >10% on {held_errors['optimistic_10pct']:.1%} of them")
    doc = {
        "schema": "rlsched-plan-latency/1",
        "request_p99": {"in_flight_quantile": cal.in_flight_quantile, "own_batch_quantile": cal.own_batch_quantile,
                        "tail_constant": cal.tail_constant, "max_load": cal.max_load, "source": source,
                        "max_load_source": f"policy: the planner keeps {1 - MAX_LOAD:.0%} headroom below a server's full-batch throughput "
                                           "(scripts/calibrate_plan_latency.py MAX_LOAD), not a fit"},
    }
    header = "# Constants of rlsched plan's request-latency estimate (rlsched.solver.capacity.request_p99_many_ms).\n"
    write_text_atomically(args.out, header + yaml.safe_dump(doc, sort_keys=False, width=10_000))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
