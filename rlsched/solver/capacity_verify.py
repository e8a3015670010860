"""A capacity plan as a scenario: replay in the request-level simulator, repair, export.

:func:`plan_scenario` turns a :class:`~rlsched.solver.capacity.CapacityPlan` into a
:class:`~rlsched.workloads.scenario.Scenario` (Poisson arrivals at each service's rate, or
an MMPP of the same mean with ``burst``) whose reference configuration is the plan;
:func:`verify` simulates it; :func:`plan_verified` repairs a plan that misses the target
SLO attainment (first the share its GI leaves free, then a re-plan for a higher rate, which
may add a GPU) until it passes; :func:`scenario_yaml` writes what ``rlsched simulate`` and
``rlsched eval`` read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import yaml

from rlsched.perfmodel import PerformanceModel
from rlsched.solver.capacity import CapacityPlan, OptionTable, PlannedService, ServiceSpec, repredict
from rlsched.workloads.arrivals import ArrivalProcess, MmppArrivals, PoissonArrivals
from rlsched.workloads.scenario import Scenario
from rlsched.workloads.tenants import InferenceTenant

#: SLO attainment every service must reach in the replay (the issue's acceptance).
TARGET_ATTAINMENT = 0.99
#: Simulated seconds of a verification replay (at least).
VERIFY_DURATION_S = 120.0
#: A replay lasts long enough for every service to expect this many requests, so that a
#: slow service's attainment is read from enough requests to tell 0.99 apart (standard
#: error 0.003 at 1,000), but at most VERIFY_MAX_DURATION_S (the simulator serves millions
#: of requests a second, so this costs seconds only at thousands of requests/s in all).
VERIFY_MIN_REQUESTS = 1000
VERIFY_MAX_DURATION_S = 1000.0
#: The burst replay: an MMPP alternating between these multiples of the mean rate with equal
#: mean sojourns (so its mean is the rate). A user-facing stress choice, not a measurement.
BURST_RATE_FACTORS = (0.5, 1.5)
BURST_MEAN_SOJOURN_S = 10.0
#: A re-plan plans a failing service for its rate times this (compounding per round).
REPAIR_RATE_FACTOR = 1.15
#: Repair rounds before giving up (the output then says verification failed).
MAX_REPAIR_ROUNDS = 8


@dataclass
class Verification:
    """The outcome of replaying a plan.

    :param slo_attainment: per service, on-time answers over answered plus dropped requests
    :param passed: every service reached ``target``
    :param burst: True when the replay used the MMPP arrivals
    """

    slo_attainment: dict[str, float]
    passed: bool
    target: float
    duration_s: float
    burst: bool
    latency_ms_p99: dict[str, float] = field(default_factory=dict)


def _arrivals(rate_rps: float, burst: bool) -> ArrivalProcess:
    if burst:
        return MmppArrivals([rate_rps * f for f in BURST_RATE_FACTORS], [BURST_MEAN_SOJOURN_S] * len(BURST_RATE_FACTORS))
    return PoissonArrivals(rate_rps)


def plan_scenario(plan: CapacityPlan, services: Sequence[ServiceSpec], duration_s: float = VERIFY_DURATION_S, burst: bool = False) -> Scenario:
    """A scenario whose reference configuration is ``plan`` (one tenant per service, its
    ``max_batch`` the planned batch)."""
    by_name = {s.name: s for s in services}
    tenants = [InferenceTenant(name=p.name, model=p.model, slo_ms=by_name[p.name].slo_ms, arrivals=_arrivals(by_name[p.name].rate_rps, burst),
                               max_batch=p.batch) for p in plan.services]
    return Scenario(name=f"plan-{plan.gpu_type}-{plan.gpus}gpu", gpu=plan.gpu_type, gpu_count=plan.gpus, duration_s=duration_s,
                    decision_interval_s=10.0, tenants=tenants, reference=plan.configuration(),
                    description=f"{plan.method} capacity plan: {len(plan.services)} services on {plan.gpus} x {plan.gpu_type}")


def replay_duration_s(services: Sequence[ServiceSpec], duration_s: float) -> float:
    """``duration_s``, lengthened (up to :data:`VERIFY_MAX_DURATION_S`) until the slowest
    service expects :data:`VERIFY_MIN_REQUESTS` requests."""
    wanted = VERIFY_MIN_REQUESTS / min(s.rate_rps for s in services)
    return max(duration_s, min(wanted, VERIFY_MAX_DURATION_S))


def verify(plan: CapacityPlan, services: Sequence[ServiceSpec], perf: PerformanceModel, duration_s: float = VERIFY_DURATION_S,
           burst: bool = False, seed: int = 0, target: float = TARGET_ATTAINMENT) -> Verification:
    """Replay every service at its rate under the plan in the request-level simulator, for
    ``duration_s`` or longer (:func:`replay_duration_s`)."""
    from rlsched.simulator.run import run_fixed  # the simulator (numba) only when verifying

    duration_s = replay_duration_s(services, duration_s)
    scenario = plan_scenario(plan, services, duration_s, burst)
    result = run_fixed(scenario, perf, scenario.reference, seed=seed)
    attainment = {name: (1.0 if t["slo_attainment"] is None else float(t["slo_attainment"])) for name, t in result["tenants"].items()}
    p99 = {name: t["latency_ms_p99"] for name, t in result["tenants"].items()}
    return Verification(attainment, all(a >= target for a in attainment.values()), target, duration_s, burst, p99)


def _give_free_share(plan: CapacityPlan, failing: Sequence[str]) -> list[str]:
    """Hand the share its GI leaves free to each failing service (split evenly among the
    failing services of a GI); returns the services that got more."""
    grown = []
    services = list(plan.services)
    for key in {(s.gpu, s.instance) for s in services if s.name in failing}:
        members = [k for k, s in enumerate(services) if (s.gpu, s.instance) == key]
        free = 100.0 - sum(services[k].mps_pct for k in members)
        takers = [k for k in members if services[k].name in failing]
        if free < 0.5 or not takers:
            continue
        for k in takers:
            share = math.floor((services[k].mps_pct + free / len(takers)) * 100.0) / 100.0
            services[k] = dataclasses.replace(services[k], mps_pct=min(100.0, share))
            grown.append(services[k].name)
    plan.services = services
    return grown


def plan_verified(services: Sequence[ServiceSpec], planner: Callable[[Sequence[ServiceSpec]], CapacityPlan], table: OptionTable,
                  perf: PerformanceModel, duration_s: float = VERIFY_DURATION_S, burst: bool = False, seed: int = 0,
                  target: float = TARGET_ATTAINMENT) -> tuple[CapacityPlan, Verification, list[dict]]:
    """Plan, replay, and repair until every service reaches ``target`` (or the rounds run out).

    :param planner: services -> plan (called again with raised rates to repair)
    :returns: (the final plan, its verification, the repairs made: one entry per round with
        the failing services, their attainment and the action taken)
    """
    factor = {s.name: 1.0 for s in services}
    plan = planner(services)
    repairs: list[dict] = []
    tried_share = False
    for round_ in range(MAX_REPAIR_ROUNDS + 1):
        check = verify(plan, services, perf, duration_s, burst, seed, target)
        failing = sorted(n for n, a in check.slo_attainment.items() if a < target)
        if not failing or round_ == MAX_REPAIR_ROUNDS:
            break
        entry: dict = {"round": round_ + 1, "failing": {n: round(check.slo_attainment[n], 4) for n in failing}, "gpus_before": plan.gpus}
        grown = [] if tried_share else _give_free_share(plan, failing)
        tried_share = True
        if grown:
            entry["action"] = f"more share in their GI for {', '.join(grown)}"
            repredict(plan, services, table)
        else:
            tried_share = False
            for n in failing:
                factor[n] *= REPAIR_RATE_FACTOR
            raised = [dataclasses.replace(s, rate_rps=s.rate_rps * factor[s.name]) for s in services]
            solve_s = plan.solve_s
            plan = planner(raised)
            plan.solve_s += solve_s
            entry["action"] = "re-planned for " + ", ".join(f"{n} at {factor[n]:.2f}x its rate" for n in failing)
            plan = repredict(plan, services, table)  # predictions at the true rates
        entry["gpus_after"] = plan.gpus
        repairs.append(entry)
    if repairs:
        plan.notes.append(f"verification-driven repair: {len(repairs)} round(s), {'passed' if check.passed else 'still failing'}")
    return plan, check, repairs


def scenario_yaml(plan: CapacityPlan, services: Sequence[ServiceSpec], duration_s: float = 600.0) -> str:
    """A scenario file (``rlsched simulate --scenario FILE`` / ``rlsched eval``) that replays
    the services at their rates under the plan."""
    by_name = {s.name: s for s in services}
    config = plan.configuration()
    doc = {
        "name": f"plan-{plan.gpu_type}",
        "description": f"{plan.method} capacity plan: {len(plan.services)} services on {plan.gpus} x {plan.gpu_type} (rlsched plan)",
        "gpu": plan.gpu_type,
        "gpu_count": plan.gpus,
        "duration_s": float(duration_s),
        "decision_interval_s": 10.0,
        "tenants": [{"name": p.name, "model": p.model, "slo_ms": float(by_name[p.name].slo_ms), "max_batch": int(p.batch),
                     "arrivals": {"kind": "poisson", "rate_rps": float(by_name[p.name].rate_rps)}} for p in plan.services],
        "reference": {
            "layouts": [layout.spec() for layout in config.layouts],
            "modes": [[m.value for m in modes] for modes in config.modes],
            "placements": {name: {"gpu": p.gpu_index, "instance": p.instance_index, "mps_pct": float(p.mps_pct), "batch_size": int(p.batch_size)}
                           for name, p in config.placements.items()},
        },
    }
    return yaml.safe_dump(doc, sort_keys=False)


__all__ = ["PlannedService", "Verification", "plan_scenario", "plan_verified", "scenario_yaml", "verify"]
