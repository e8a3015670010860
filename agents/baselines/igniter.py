"""iGniter-style interference-aware provisioning (Xu et al., TPDS 2023; icloud-ecnu/igniter)."""

from __future__ import annotations

import math

import numpy as np

from rlsched.agents.baselines.base import LatencyTable, Policy, one_gi_per_gpu, reference_batch, whole_device_profile
from rlsched.decision import Configuration, SharingMode
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.solver.igniter import IgniterGreedy
from rlsched.workloads.tenants import InferenceTenant

#: Share a retraining or best-effort job gets at least, percent (iGniter has none).
MIN_BACKGROUND_SHARE_PCT = 5.0


class Igniter(Policy):
    """Provision each inference tenant a batch and the least MPS share that meets its SLO,
    predicted with the interference-aware performance model, then place greedily.

    Follows iGniter (Xu et al., "iGniter: Interference-Aware GPU Resource Provisioning for
    Predictable DNN Inference in the Cloud", TPDS 2023): half the SLO is budgeted for
    queueing and half for execution; the batch is the requests arriving in half an SLO at
    the measured rate; the share is the least (in 2.5% steps) whose predicted batch latency
    fits the execution budget with throughput above the rate; tenants are placed in
    descending share order on the first GPU where, after raising co-located shares step by
    step, every predicted latency (with the model's L2 interference) still fits.

    Departs: the node's GPU count is fixed, so a tenant that fits nowhere goes to the GPU
    with the least share in use (iGniter would rent another GPU); the share left over on a
    GPU is handed out to its tenants in proportion (iGniter leaves it idle to save cost);
    retraining and best-effort jobs, which iGniter does not serve, get the leftover share on
    the least-loaded GPU (at least 5%). It provisions once per episode for each tenant's
    long-run mean arrival rate (iGniter is given the rate; re-provisioning on measured
    rates made it restart MPS clients every few intervals, each restart costing seconds of
    downtime, and lose far more than it gained on the shipped scenarios).
    """

    name = "igniter"

    def reset(self, env: GpuShareEnv) -> None:
        self.table = LatencyTable(env)
        self.profile = whole_device_profile(env.scenario.gpu)
        self.greedy = IgniterGreedy(lambda model, batch, share, colocated: self.table.mean_ms(model, batch, self.profile, share, SharingMode.MPS, colocated))
        rates = {t.name: t.arrivals.mean_rate_rps() for t in env.scenario.inference_tenants()}
        self.configuration = self.provision(env, rates)

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> Configuration:
        return self.configuration

    # ------------------------------------------------------------------ provisioning
    def alone(self, t: InferenceTenant, rate_rps: float) -> tuple[int, float]:
        """(batch, least share %) for one tenant alone on a whole GPU (:meth:`IgniterGreedy.alone`)."""
        return self.greedy.alone(t, rate_rps)

    def provision(self, env: GpuShareEnv, rates: dict[str, float]) -> Configuration:
        """The configuration for the measured rates."""
        tenants = {t.name: t for t in env.scenario.inference_tenants()}
        gpus = self.greedy.place(tenants, rates, env.scenario.gpu_count)
        background = [t for t in env.scenario.tenants if not isinstance(t, InferenceTenant)]
        extra: list[list[tuple[str, float, int]]] = [[] for _ in gpus]
        for t in background:
            g = min(range(len(gpus)), key=lambda i: sum(s for _, s in gpus[i].values()) + len(extra[i]) * MIN_BACKGROUND_SHARE_PCT)
            extra[g].append((t.name, 0.0, reference_batch(env, t)))
        groups = []
        for group, jobs in zip(gpus, extra, strict=True):
            used = sum(s for _, s in group.values())
            reserve = max(100.0 - used, MIN_BACKGROUND_SHARE_PCT * len(jobs)) if jobs else 0.0
            # Scale inference shares so that they and the background reserve fill the GPU.
            scale = (100.0 - reserve) / used if used > 0 else 0.0
            members = [(n, _floor_pct(s * scale), b) for n, (b, s) in group.items()]
            members += [(n, _floor_pct(reserve / len(jobs)), b) for n, _, b in jobs]
            groups.append(members)
        return one_gi_per_gpu(env, groups, SharingMode.MPS)


def _floor_pct(share: float) -> float:
    """A share floored to 0.01% (so that a GI's shares never sum above 100 by rounding)."""
    return max(0.01, math.floor(share * 100.0) / 100.0)
