"""Training benchmark: environment steps per second of PPO training on this machine, and the
wall time a run took to reach a Goodput level.

Two modes:

    # a short fresh run of a config (warm start off), then its throughput
    .venv/bin/python scripts/bench_train.py --config configs/train/ppo_default.yaml --steps 8192
    # the same with RLlib (extra "distributed"; make install-distributed)
    .venv-distributed/bin/python scripts/bench_train.py --engine rllib --config configs/train/rllib_ppo.yaml --steps 8192
    # an existing run folder: its throughput, when its evaluations reached --level, and the
    # wall time of each warm-start round (DAgger fit) with its validation Goodput
    .venv/bin/python scripts/bench_train.py --run runs/NAME [--level GOODPUT_PER_STEP]

Throughput is ``perf/steps_per_s`` (environment steps per wall second, rollouts and updates
included) from the run's TensorBoard events; ``--level`` is an evaluation Goodput per
decision step (``eval/goodput/total``; e.g. the best baseline's episode Goodput / 360).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def read_run(run_dir: Path) -> dict[str, list[tuple[float, int, float]]]:
    """(wall time, step, value) series of the run's TensorBoard scalars we report."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: dict[str, list[tuple[float, int, float]]] = {}
    for events in sorted((run_dir / "tb").glob("*_*")):  # ppo_1 (SB3), rllib_1 (RLlib)
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in ("perf/steps_per_s", "eval/goodput/total", "eval/slo/attainment_high"):
            if tag in accumulator.Tags()["scalars"]:
                series.setdefault(tag, []).extend((e.wall_time, e.step, e.value) for e in accumulator.Scalars(tag))
    return series


def _warm_start_rounds(run_dir: Path) -> list[dict[str, float]]:
    """Wall seconds from the run's start (its config.yaml) to each warm-start fit's
    validation, with the validation Goodput per decision step (``tb/pretrain``)."""
    import yaml
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not (run_dir / "tb" / "pretrain").exists():
        return []
    accumulator = EventAccumulator(str(run_dir / "tb" / "pretrain"))
    accumulator.Reload()
    if "pretrain/validation_goodput" not in accumulator.Tags()["scalars"]:
        return []
    start = (run_dir / "config.yaml").stat().st_mtime
    steps = yaml.safe_load((run_dir / "config.yaml").read_text())["max_episode_steps"]
    return [{"round": e.step, "wall_s": round(e.wall_time - start, 1), "validation_goodput_per_step": round(e.value / steps, 1)}
            for e in accumulator.Scalars("pretrain/validation_goodput")]


def report(run_dir: Path, level: float | None) -> dict[str, object]:
    """Throughput and, with ``level``, the first evaluation at or above it."""
    series = read_run(run_dir)
    speeds = [v for _, _, v in series.get("perf/steps_per_s", [])]
    evals = sorted(series.get("eval/goodput/total", []))
    start = min((w for values in series.values() for w, _, _ in values), default=None)
    out: dict[str, object] = {
        "run": str(run_dir),
        "steps_per_s_mean": sum(speeds) / len(speeds) if speeds else None,
        "evaluations": [{"wall_s": round(w - start, 1), "step": s, "goodput_per_step": round(v, 1)} for w, s, v in evals] if start else [],
    }
    warm_start = _warm_start_rounds(run_dir)
    if warm_start:
        out["warm_start"] = warm_start
    if level is not None:
        reached = next(((w, s) for w, s, v in evals if v >= level), None)
        out["level"] = level
        out["reached"] = None if reached is None or start is None else {"wall_s": round(reached[0] - start, 1), "step": reached[1]}
        out["best_goodput_per_step"] = max((v for _, _, v in evals), default=None)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/train/ppo_default.yaml", help="training config for a fresh benchmark run")
    parser.add_argument("--steps", type=int, default=8192, help="environment steps of the fresh run")
    parser.add_argument("--engine", default="sb3", choices=["sb3", "rllib"], help="training engine of the fresh run (rllib: an rllib_*.yaml config)")
    parser.add_argument("--run", default=None, help="report on this existing run folder instead of training")
    parser.add_argument("--level", type=float, default=None, help="evaluation Goodput per step to report the wall time to")
    args = parser.parse_args()
    if args.run:
        print(json.dumps(report(Path(args.run), args.level), indent=2))
        return 0
    import yaml

    if args.engine == "rllib":
        from rlsched.agents.rllib.config import load_rllib_config as load
        from rlsched.agents.rllib.train import train_rllib as train
    else:
        from rlsched.agents.ppo.config import load_config as load
        from rlsched.agents.ppo.train import train

    config = load(args.config).to_dict()
    config.update(total_timesteps=args.steps, eval_freq=10 * args.steps, checkpoint_freq=10 * args.steps, progress_bar=False)
    config["pretrain"]["teacher"] = ""  # throughput of PPO itself
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(yaml.safe_dump(config))
        run_dir = train(path, Path(tmp) / "run")
        print(json.dumps({"engine": args.engine, "config": args.config, **report(run_dir, None)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
