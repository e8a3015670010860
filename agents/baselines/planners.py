"""Baselines that size MIG instances from per-model latency profiles: PARIS-ELSA and MIGRator."""

from __future__ import annotations

import numpy as np

from rlsched.agents.baselines.base import CapacityModel, Policy, arrival_rates_rps, sized_requests
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.solver import TenantRequest

#: MIGRator plans for this multiple of the measured rate (room for bursts between plans).
MIGRATOR_HEADROOM = 1.2
#: Re-plan when a tenant's rate falls below this fraction of what the plan was made for.
MIGRATOR_SHRINK = 0.5


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
    partition, sized for its long-run mean rate, and batching is the simulator's dynamic
    batcher capped at ELSA's SLA-feasible batch (half the SLO budgeted for execution).
    """

    name = "paris-elsa"

    def reset(self, env: GpuShareEnv) -> None:
        rates = {t.name: t.arrivals.mean_rate_rps() for t in env.scenario.inference_tenants()}
        self.requests = sized_requests(env, CapacityModel(env), rates, headroom=1.0)

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> dict[str, TenantRequest]:
        return self.requests


class MigratorIlp(Policy):
    """Dynamic MIG reconfiguration planned by an ILP, re-planned as the load moves.

    Follows MIGRator (arXiv 2407.13126): the MIG layout is re-planned during the run by an
    ILP whose objective serves each inference tenant's load within its SLO, with retraining
    (continual-learning) jobs given the GPU left over. Each plan sizes every tenant's GI for
    1.2x its measured (smoothed) rate from the performance model, and the repair ILP
    (HiGHS, priced with GI create/destroy seconds and tenant moves) finds the layout.

    Departs: MIGRator solves one ILP over a lookahead window of predicted arrivals with the
    Goodput (SLO attainment x accuracy) in the objective, reconfigures every second and hides
    the cost by pre-initializing instances; here the plan is per decision interval from the
    measured rate, re-planned only when a tenant outgrows its capacity or falls below half
    its planned rate (restarts cost seconds in the simulator and are not hidden), and the
    ILP minimizes the distance to the sized requests rather than Goodput itself.
    """

    name = "migrator-ilp"

    def reset(self, env: GpuShareEnv) -> None:
        self.model = CapacityModel(env)
        self.planned: dict[str, float] | None = None
        self.requests: dict[str, TenantRequest] | None = None

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> dict[str, TenantRequest]:
        rates = arrival_rates_rps(env)
        if self.requests is None or self._outgrown(env, rates):
            self.requests = sized_requests(env, self.model, rates, MIGRATOR_HEADROOM)
            self.planned = rates
        return self.requests

    def _outgrown(self, env: GpuShareEnv, rates: dict[str, float]) -> bool:
        config = env.current
        assert self.planned is not None
        for t in env.scenario.inference_tenants():
            if rates[t.name] < MIGRATOR_SHRINK * self.planned[t.name]:
                return True
            if config is not None and t.name in config.placements:
                layout = config.layouts[config.placements[t.name].gpu_index]
                index = config.placements[t.name].instance_index
                profile = layout.instances[index].profile if len(layout) else None
                if self.model.capacity(t, profile, config.placements[t.name].mps_pct)[0] < rates[t.name]:
                    return True
        return False
