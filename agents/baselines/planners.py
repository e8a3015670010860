"""Baselines that size MIG instances from per-model latency profiles: PARIS-ELSA and MIGRator
(its MILP every interval, or its own solutions kept in a library and chosen from)."""

from __future__ import annotations

import numpy as np

from rlsched.agents.baselines.base import CapacityModel, Policy, observed_load, sized_requests
from rlsched.agents.candidates import CandidateLibrary
from rlsched.decision import Configuration
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.solver import TenantRequest
from rlsched.solver.planner import Plan, Planner

#: Decision intervals the planner looks ahead (restarts are amortised over them).
MIGRATOR_LOOKAHEAD = 3


class ParisElsa(Policy):
    """Heterogeneous MIG partitions sized per model, SLA-aware batching; fixed for the episode.

    Follows PARIS and ELSA (Kim et al., "PARIS and ELSA: An Elastic Scheduling Algorithm
    for Reconfigurable Multi-GPU Inference Servers", DAC 2022): PARIS chooses each model's
    partition size from its per-batch latency profile (here: the performance model) as the
    smallest GI that serves the model's load within the SLO; ELSA serves on it with the
    largest batch that still meets the SLO. The ILP repair turns the sizes into a valid
    layout.

    Departs: PARIS sizes for a request-size distribution and keeps a pool of partitions
    that ELSA schedules individual requests across; here each tenant gets its own
    partition, sized for its long-run mean rate and then fitted to the node's MIG layouts
    (shrunk until they pack, grown until the GPU is used: :func:`fit_to_node`), and
    batching is the simulator's dynamic batcher capped at ELSA's SLA-feasible batch (half
    the SLO budgeted for execution). PARIS has no retraining or best-effort jobs: they get
    a smallest GI each, which the repair changes when their memory does not fit it. The
    sizes are requests, not an exact layout: where the packing differs from the running
    layout, the repair may keep the running one rather than pay the moves, every step
    (repair rate 0 on diurnal, default, mixed-priorities and steady; 1.00 on cl-drift,
    best-effort-tuning and 6 of the 10 suite scenarios). Requesting the packed layout as an
    exact configuration would remove that.
    """

    name = "paris-elsa"

    def reset(self, env: GpuShareEnv) -> None:
        rates = {t.name: t.arrivals.mean_rate_rps() for t in env.scenario.inference_tenants()}
        self.requests = sized_requests(env, CapacityModel(env), rates, headroom=1.0)

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> dict[str, TenantRequest]:
        return self.requests


class MigratorIlp(Policy):
    """Dynamic MIG reconfiguration planned by a Goodput-maximising ILP every interval.

    Follows MIGRator (arXiv 2407.13126): every decision interval one HiGHS MILP
    (:class:`rlsched.solver.planner.Planner`) chooses each GPU's MIG layout and each
    tenant's GI, MPS share and batch so as to maximise the Goodput predicted from forecast
    arrival rates (on-time requests x accuracy x priority weight, minus the SLO penalty,
    plus best-effort progress and retraining gains) minus the reconfiguration cost (GI
    create/destroy seconds and restart downtime x the value it loses), over a lookahead of
    :data:`MIGRATOR_LOOKAHEAD` windows. The forecast is the smoothed (EWMA) rate measured so
    far, held over the lookahead, plus the queued requests spread over the first window.

    Departs: MIGRator forecasts arrivals with a learned predictor and plans a per-window
    sequence over its lookahead, reconfigures every second and hides the cost by
    pre-initializing instances; here the forecast is an EWMA, one configuration is held over
    the lookahead (receding horizon), restarts are paid in full, every GI runs MPS (no
    priority fill or time slicing), and co-location is priced with the worst co-runner
    (see the planner's docstring).
    """

    name = "migrator-ilp"

    def reset(self, env: GpuShareEnv) -> None:
        self.planner = Planner(env.scenario, env.backend.perf_model, env.backend.memory_gib)
        self.last_plan: Plan | None = None

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> Configuration:
        # Unmeasured tenants (see arrival_rates_rps): no backlog, the scenario's accuracy.
        rates, backlog, accuracy = observed_load(env)
        windows = self.planner.forecast([rates] * MIGRATOR_LOOKAHEAD, backlog)
        self.last_plan = self.planner.plan(windows, env.current, accuracy)
        return self.last_plan.configuration


class PlannerLibrary(Policy):
    """MIGRator's objective, maximised over a library of its own solutions instead of solved
    for every interval (:class:`~rlsched.agents.candidates.CandidateLibrary`).

    Every interval it values the running configuration and each library entry at the same
    forecast as ``migrator-ilp`` (EWMA rates held over :data:`MIGRATOR_LOOKAHEAD` windows,
    the backlog spread over the first) with the planner's model, and applies the best. The
    library holds the MILP's solutions for loads around the scenario's mean rates, solved at
    reset, and for each new load bin met while running, which joins from the next interval:
    so a decision is a few hundred value-table lookups, not a MILP solve, except for the
    solves a new load asks for (counted in the episode report).

    Departs from ``migrator-ilp``: it can only choose configurations the MILP produced for
    some load (plus the running one), and a new load's solution arrives an interval late.
    """

    name = "planner-library"

    def reset(self, env: GpuShareEnv) -> None:
        self.planner = Planner(env.scenario, env.backend.perf_model, env.backend.memory_gib)
        self.library = CandidateLibrary(env, self.planner)
        self.library.seed(MIGRATOR_LOOKAHEAD)
        self.report = {"library_seed_solves": self.library.solves, "planner_solves": 0}

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> Configuration:
        self.library.refresh()
        rates, backlog, accuracy = observed_load(env)
        windows = self.planner.forecast([rates] * MIGRATOR_LOOKAHEAD, backlog)
        solves = self.library.solves
        self.library.request(windows)
        self.report["planner_solves"] += self.library.solves - solves
        self.report["library_size"] = len(self.library.configurations)
        if env.current is None:
            return self.planner.plan(windows, None, accuracy).configuration
        scored = self.library.score(windows, env.current, accuracy)
        return scored.configurations[scored.best()]
