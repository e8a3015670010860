"""Replay ``migrator-hedge``'s switching rule on recorded expert streams, for several settings.

Each stream file (``scripts/record_expert_streams.py``) holds what every shadow of the hedge
earned per interval on one episode, so the rule can be replayed on it in milliseconds
(:class:`~rlsched.agents.ppo.expert_env.ExpertChoiceEnv`: a switch costs the requests that
arrive while the restarted tenants restart, times a factor fitted to the streams' simulated
switch costs; the rule's own simulated switch check is left out). For every setting of the
load weighting (:data:`~rlsched.agents.baselines.hedge.LOAD_BANDWIDTH` x
:data:`~rlsched.agents.baselines.hedge.LOAD_ERROR_RATIO`) it prints, per stream, what the rule
earns over what it earns without the load weighting, and over the best single expert of that
episode (the best fixed configuration in hindsight, or the planner), with geometric means: the
figures that chose the setting (docs/planner-bursts.md). Confirm a choice closed loop with
``rlsched eval``.

    .venv/bin/python scripts/tune_hedge.py --streams runs/hedge-streams --bandwidths 0.35 0.5 0.7 --error-ratios 1 0.8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from rlsched.agents.baselines.hedge import MigratorHedge
from rlsched.agents.experts import ExpertStreams, fit_switch_cost_factor
from rlsched.agents.ppo.expert_env import ExpertChoiceEnv


def rule_returns(streams: list[ExpertStreams], factor: float, bandwidth: float, error_ratio: float) -> np.ndarray:
    """Per stream, what the rule with this load weighting earns, request-equivalents."""
    env = ExpertChoiceEnv(streams, factor, MigratorHedge(load_bandwidth=bandwidth, load_error_ratio=error_ratio))
    earned = []
    for k, stream in enumerate(streams):
        env.reset(options={"stream": k})
        earned.append(env.rule_return(stream.steps))
    return np.array(earned)


def geometric_mean(values: list[float]) -> float:
    """Geometric mean (values at or below 1e-3, a ratio to a loss or to nothing, count as 1e-3)."""
    return float(np.exp(np.mean(np.log(np.clip(values, 1e-3, None)))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", required=True, type=Path, help="folder of stream files (*.pkl)")
    parser.add_argument("--bandwidths", nargs="+", type=float, default=[0.35, 0.5, 0.7])
    parser.add_argument("--error-ratios", nargs="+", type=float, default=[1.0, 0.8])
    args = parser.parse_args()
    paths = sorted(args.streams.glob("*.pkl"))
    if not paths:
        print(f"error: {args.streams}: no stream files (*.pkl)", file=sys.stderr)
        return 2
    try:
        streams = [ExpertStreams.load(p) for p in paths]
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    factor, error = fit_switch_cost_factor(streams)
    print(f"{len(streams)} streams; switch cost factor {factor:.2f} (relative error {error:.2f})")
    best = np.array([s.rewards[:, s.profile_intervals:].sum(axis=1).max() for s in streams])
    recency = rule_returns(streams, factor, 0.0, 1.0)
    settings = [(b, r) for b in args.bandwidths for r in args.error_ratios]
    table = {setting: rule_returns(streams, factor, *setting) for setting in tqdm(settings, desc="settings")}
    print("Per stream: the rule with the load weighting over the rule without (x recency), and over the best single expert (x best).")
    print("| stream | recency only x best | " + " | ".join(f"{b:g} / {r:g}: x recency, x best" for b, r in settings) + " |")
    print("|---|---:|" + "---:|" * len(settings))
    for k, path in enumerate(paths):
        cells = [f"{table[s][k] / recency[k]:.3f}, {table[s][k] / best[k]:.3f}" for s in settings]
        print(f"| {path.stem} | {recency[k] / best[k]:.3f} | " + " | ".join(cells) + " |")
    cells = [f"**{geometric_mean(list(table[s] / recency)):.4f}**, {geometric_mean(list(table[s] / best)):.4f}" for s in settings]
    print(f"| geometric mean | {geometric_mean(list(recency / best)):.4f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
