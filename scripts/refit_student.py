"""Refit a warm-start student on a training run's saved labels, and validate it.

The labels of a warm start (``runs/NAME/pretrain/demonstrations_<round>.npz``) cost a
planner solve each; this fits a fresh student to any subset of them with another epoch
count or seed, without running the teacher again (the studies in the README's "What was
tried" table):

    .venv/bin/python scripts/refit_student.py runs/NAME --rounds 0,1 --epochs 15 --seed 1 --out student.onnx --validation-episodes 16

It prints the fit's accuracy and its mean validation Goodput on the run's ``eval_scenario``
(JSON); ``rlsched eval --policies ppo:student.onnx`` evaluates the result on any scenario.
"""

from __future__ import annotations

import argparse
import json
import sys

from rlsched.agents.ppo.train import refit_student
from rlsched.errors import RlschedError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="training run folder with saved demonstrations")
    parser.add_argument("--out", required=True, help="the student's .onnx file")
    parser.add_argument("--rounds", help="ROUND,ROUND,... whose labels to fit (default: all saved)")
    parser.add_argument("--epochs", type=int, help="passes over the labels (default: the run's pretrain.epochs)")
    parser.add_argument("--seed", type=int, help="initialization seed (default: the run's seed)")
    parser.add_argument("--validation-episodes", type=int, help="validation episodes (default: the run's pretrain.validation_episodes)")
    parser.add_argument("--perf-model", default="calibrated", choices=("calibrated", "toy"))
    args = parser.parse_args(argv)
    try:
        rounds = None if args.rounds is None else [int(r) for r in args.rounds.split(",")]
    except ValueError:
        print(f"error: --rounds: {args.rounds!r}: expected ROUND,ROUND,... (integers)", file=sys.stderr)
        return 2
    try:
        result = refit_student(args.run, args.out, rounds, args.epochs, args.seed, args.validation_episodes, args.perf_model)
    except RlschedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"out": args.out, "rounds": rounds, **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
