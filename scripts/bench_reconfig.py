"""Downtime per reconfiguration with and without make-before-break, under a policy.

For each scenario and each setting of ``reconfiguration.make_before_break``, runs the
policy (default ``migrator-ilp``) over simulated episodes and prints, per tenant change
(:class:`rlsched.simulator.node.ChangeRecord`): the downtime paid (mean, p99, max), the
share of changes made before the break, the seconds the old instance kept serving (mean),
reconfigurations per hour (decision steps whose configuration changed), tenant changes per
hour, Goodput and the SLO attainment (all and high-priority tenants).

    python scripts/bench_reconfig.py                              # default + bursty, seed 0, 1 h
    python scripts/bench_reconfig.py --scenarios default bursty --seeds 0 1 2 --duration-s 3600
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from rlsched.agents.evaluation import run_episode
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.workloads.scenario import load_scenario


def measure(scenario_name: str, make_before_break: bool, policy: str, seeds: list[int], duration_s: float | None) -> dict[str, float]:
    """One row: per-change downtime statistics and rates over ``seeds``' episodes."""
    scenario = load_scenario(scenario_name)
    scenario = dataclasses.replace(scenario, make_before_break=make_before_break,
                                   duration_s=duration_s if duration_s is not None else scenario.duration_s)
    env = GpuShareEnv(scenario)
    downtimes, served, staged, reconfigurations, goodput = [], [], 0, 0, 0.0
    on_time = decided = on_time_high = decided_high = 0
    for seed in seeds:
        episode = run_episode(env, policy, seed)
        changes = [c for c in env.backend.simulator.changes if c.kind != "start"]
        downtimes += [c.downtime_s for c in changes]
        served += [c.old_served_s for c in changes]
        staged += sum(c.mechanism == "make-before-break" for c in changes)
        reconfigurations += episode.reconfigurations
        goodput += episode.goodput
        on_time, decided = on_time + episode.on_time, decided + episode.decided
        on_time_high, decided_high = on_time_high + episode.on_time_high, decided_high + episode.decided_high
    hours = len(seeds) * scenario.duration_s / 3600.0
    d = np.asarray(downtimes) if downtimes else np.zeros(1)
    return {
        "changes": float(len(downtimes)),
        "downtime_mean_s": float(d.mean()),
        "downtime_p99_s": float(np.percentile(d, 99)),
        "downtime_max_s": float(d.max()),
        "staged_fraction": staged / len(downtimes) if downtimes else float("nan"),
        "old_served_mean_s": float(np.mean(served)) if served else 0.0,
        "reconfigurations_per_h": reconfigurations / hours,
        "tenant_changes_per_h": len(downtimes) / hours,
        "goodput": goodput / len(seeds),
        "slo_attainment": on_time / decided if decided else float("nan"),
        "slo_attainment_high": on_time_high / decided_high if decided_high else float("nan"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", nargs="+", default=["default", "bursty"])
    parser.add_argument("--policy", default="migrator-ilp")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--duration-s", type=float, default=None, help="episode length (default: the scenario's)")
    args = parser.parse_args(argv)
    print(f"policy {args.policy}, seeds {args.seeds}")
    print("| scenario | make-before-break | changes | downtime mean s | p99 s | max s | staged | old served mean s "
          "| reconfigs/h | tenant changes/h | Goodput | SLO att. | SLO att. (high) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.scenarios:
        for mbb in (True, False):
            r = measure(name, mbb, args.policy, args.seeds, args.duration_s)
            print(f"| {name} | {'on' if mbb else 'off'} | {r['changes']:.0f} | {r['downtime_mean_s']:.2f} | {r['downtime_p99_s']:.2f} "
                  f"| {r['downtime_max_s']:.2f} | {r['staged_fraction']:.0%} | {r['old_served_mean_s']:.2f} | {r['reconfigurations_per_h']:.1f} "
                  f"| {r['tenant_changes_per_h']:.1f} | {r['goodput']:,.0f} | {r['slo_attainment']:.4f} | {r['slo_attainment_high']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
