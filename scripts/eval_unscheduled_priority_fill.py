"""Score policies on a node that has no priority-fill scheduler, as a real rlsched node is.

The simulator's priority fill is FIKIT's kernel scheduler (the high-priority tenant keeps its
solo latency plus 5%). rlsched starts no such scheduler on a real GPU, where the tenants of a
priority-fill instance time-slice it (docs/hardware-probes/README.md, 2026-11-27). Here the
simulator executes every priority-fill instance as time slicing, while the policies plan as
usual, so that what a policy that relies on priority fill would earn on a real node can be
compared with an MPS-only one:

    python scripts/eval_unscheduled_priority_fill.py --scenario configs/scenarios/suite/heldout-deploy.yaml \\
        --policies migrator-pf-held,migrator-ilp --seed 0
    python scripts/eval_unscheduled_priority_fill.py --scenario default \\
        --trace resnet=configs/traces/servegen_m_small_rate_10min.csv:0.52:48 --policies migrator-pf-held

Prints one line per policy: Goodput, high-priority SLO attainment, reconfigurations. The
policy ``static-best`` is the best fixed configuration in hindsight on this node (the same
candidates as the evaluation's ``static-best``, their priority-fill instances time-sliced).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from rlsched.agents.baselines.hindsight import best_fixed_configuration
from rlsched.agents.evaluation import run_episode
from rlsched.decision import Configuration, SharingMode
from rlsched.envs.backends import SimBackend, performance_model
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.simulator.node import StepResult
from rlsched.errors import RlschedError
from rlsched.workloads.scenario import load_scenario, with_trace_overrides


def time_sliced(configuration: Configuration | None) -> Configuration | None:
    """``configuration`` with every priority-fill instance run as time slicing instead."""
    if configuration is None:
        return None
    modes = tuple(tuple(SharingMode.TIME_SLICE if m == SharingMode.PRIORITY_FILL else m for m in gpu) for gpu in configuration.modes)
    return dataclasses.replace(configuration, modes=modes)


class UnscheduledSimBackend(SimBackend):
    """The request-level simulator of a node without a priority-fill scheduler: every
    configuration it is given runs with its priority-fill instances time-sliced."""

    def reset(self, seed: int | None, configuration: Configuration | None) -> None:
        super().reset(seed, time_sliced(configuration))

    def step(self, configuration: Configuration) -> StepResult:
        return super().step(time_sliced(configuration))


def unscheduled_env(scenario) -> GpuShareEnv:
    """A simulated node whose priority-fill instances time-slice (the policy is not told)."""
    return GpuShareEnv(scenario, backend=UnscheduledSimBackend(scenario, performance_model("calibrated")))


def static_best(scenario, seed: int) -> float:
    """The Goodput of the best fixed configuration in hindsight on a node whose priority-fill
    instances time-slice, on the episode of ``seed`` (``static-best``'s candidates)."""
    env = GpuShareEnv(scenario)
    env.reset(seed=seed)
    return best_fixed_configuration([(unscheduled_env(scenario), env.backend_seed)])[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", required=True, help="scenario YAML file, or the name of a bundled one")
    parser.add_argument("--trace", action="append", default=[], metavar="TENANT=FILE[:SCALE[:WARP]]")
    parser.add_argument("--policies", default="migrator-pf-held,migrator-ilp")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        scenario = with_trace_overrides(load_scenario(args.scenario), args.trace)
        for name in args.policies.split(","):
            if name == "static-best":
                print(f"{name:<24} goodput {static_best(scenario, args.seed):>14,.0f}")
                continue
            episode = run_episode(unscheduled_env(scenario), name, args.seed)
            slo = episode.on_time_high / episode.decided_high if episode.decided_high else float("nan")
            print(f"{name:<24} goodput {episode.goodput:>14,.0f}  high-priority SLO {slo:.3f}  reconfigurations {episode.reconfigurations}")
    except RlschedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
