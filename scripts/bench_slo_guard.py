"""How well ``migrator-queue-slo``'s SLO guard predicts a high-priority service's late answers.

Runs one episode of ``migrator-queue-slo`` (or, with ``--fixed-from``, of the configuration
another policy of an eval JSON applied first, held all episode while ``migrator-queue-slo``
only observes). Before every interval it takes the guard the planner would plan with
(:class:`~rlsched.agents.baselines.planners.BurstRates`) and predicts the share of each
guarded tenant's requests answered late over the guard's lookahead in the placement that
then runs (:meth:`~rlsched.solver.planner.Planner.guarded_requests`). The request-level
simulator then measures the share answered late over the same intervals.

Prints, per guarded tenant, over the intervals after the guard's prior (the first
:data:`~rlsched.agents.baselines.planners.SLO_HOLD_S`): the mean predicted and measured late
share, the same over the windows in which the tenant was not restarted (the late answers a
restart leaves are the planner's restart charge to predict, not the guard's), the share of
lookahead windows each puts beyond the SLO target's allowance (1%), and how often the two
agree on that. The guard charges a placement for every request
predicted late beyond the allowance, so a guard that flags windows the node then serves on
time moves tenants into larger instances than they need.

    python scripts/bench_slo_guard.py --scenario default --no-priority-fill-scheduler \\
        --trace resnet=../shared/data/traces/servegen/raw_trace_csv/deepseek-r1/chunk-66-trace.csv:1047.78:24
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from rlsched.agents.baselines.base import HIGH_PRIORITY_SLO_TARGET, apply
from rlsched.agents.baselines.planners import SLO_HOLD_S, MigratorQueueSlo
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.errors import ConfigError, RlschedError
from rlsched.workloads.scenario import _Reader, load_scenario, parse_configuration, with_trace_overrides, without_priority_fill_scheduler


def measure(env: GpuShareEnv, seed: int, fixed=None) -> dict[str, dict[str, float]]:
    """Per guarded tenant: predicted and measured late shares over the guard's lookahead."""
    observation, _ = env.reset(seed=seed)
    policy = MigratorQueueSlo()
    policy.reset(env)
    names = list(policy.bursts.history)
    predicted: dict[str, list[float]] = {n: [] for n in names}
    on_time: dict[str, list[int]] = {n: [] for n in names}
    decided: dict[str, list[int]] = {n: [] for n in names}
    restarted: dict[str, list[bool]] = {n: [] for n in names}
    truncated = False
    while not truncated:
        decision = policy.act(observation, env)
        if fixed is not None:
            decision = policy.chosen = fixed
        planner = policy.planner
        for name in names:
            p = decision.placements[name]
            layout = decision.layouts[p.gpu_index]
            gi = layout.instances[p.instance_index] if len(layout) else None
            guarded = planner.guarded_requests(env.scenario.tenant(name), gi.profile if gi else None, float(p.mps_pct), p.batch_size,
                                               planner.interval_s * policy.lookahead, planner.sharing(decision, name), policy.spread)
            on, requests = guarded if guarded is not None else (0.0, 0.0)
            predicted[name].append(max(1.0 - on / requests, 0.0) if requests > 0 else 0.0)
        observation, _, _, truncated, _ = apply(env, decision)
        for name in names:
            stats = env.last_step.tenants[name]
            on_time[name].append(stats.on_time)
            decided[name].append(stats.completed + stats.dropped)
            restarted[name].append(stats.restarted)
    skip = round(SLO_HOLD_S / env.scenario.decision_interval_s)
    allowance = 1.0 - HIGH_PRIORITY_SLO_TARGET
    report = {}
    for name in names:
        answered, late = np.array(decided[name], float), np.array(decided[name], float) - np.array(on_time[name], float)
        window = policy.lookahead
        measured = np.array([late[t:t + window].sum() / max(answered[t:t + window].sum(), 1.0) for t in range(len(late))])[skip:]
        guess = np.array(predicted[name])[skip:]
        # Late answers a restart leaves are the restart charge's to predict, not the guard's.
        calm = np.array([not any(restarted[name][t:t + window]) for t in range(len(late))])[skip:]
        report[name] = {
            "slo_attainment": float(1.0 - late.sum() / max(answered.sum(), 1.0)),
            "predicted_late_share": float(guess.mean()),
            "measured_late_share": float(measured.mean()),
            "windows_without_restart": float(calm.mean()),
            "predicted_late_share_without_restart": float(guess[calm].mean()) if calm.any() else float("nan"),
            "measured_late_share_without_restart": float(measured[calm].mean()) if calm.any() else float("nan"),
            "windows_predicted_beyond_allowance": float((guess > allowance).mean()),
            "windows_measured_beyond_allowance": float((measured > allowance).mean()),
            "agreement": float(((guess > allowance) == (measured > allowance)).mean()),
        }
    return report


def first_configuration(source: str, policy: str, scenario) -> Configuration:
    """The configuration ``policy`` applied first in its first episode of the eval JSON
    ``source`` (its ``trajectories``), for ``scenario``'s node; a ConfigError naming the file
    and field when it holds none."""
    try:
        with open(source, encoding="utf-8") as f:
            trajectories = json.load(f)["trajectories"]
        episodes = trajectories["episodes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(source, "trajectories", None, f"not an eval JSON with recorded trajectories ({exc})") from None
    if policy not in episodes:
        raise ConfigError(source, "trajectories.episodes", policy, f"no such policy (has {', '.join(episodes)})")
    try:
        first = episodes[policy][0]["steps"][0]
        recorded = trajectories["configurations"][first]
    except (KeyError, IndexError, TypeError) as exc:
        raise ConfigError(source, f"trajectories.episodes.{policy}", None, f"no recorded first step ({exc})") from None
    return parse_configuration(_Reader(source, recorded, f"trajectories.configurations[{first}]"),
                               scenario.gpu, scenario.gpu_count, [t.name for t in scenario.tenants])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="default")
    parser.add_argument("--trace", action="append", default=[], metavar="TENANT=FILE[:SCALE[:WARP]]")
    parser.add_argument("--no-priority-fill-scheduler", action="store_true", help="the node rlsched deploys (as rlsched eval's flag)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixed-from", nargs=2, metavar=("EVAL_JSON", "POLICY"),
                        help="hold the first configuration POLICY applied in this eval JSON (of the same scenario and traces) all episode")
    args = parser.parse_args(argv)
    scenario = with_trace_overrides(load_scenario(args.scenario), args.trace)
    if args.no_priority_fill_scheduler:
        scenario = without_priority_fill_scheduler(scenario)
    env = GpuShareEnv(scenario)
    fixed = first_configuration(*args.fixed_from, scenario) if args.fixed_from else None
    for name, figures in measure(env, args.seed, fixed).items():
        print(name + ": " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except RlschedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
