"""FIKIT-style priority fill (arXiv 2311.10359)."""

from __future__ import annotations

import numpy as np

from rlsched.agents.baselines.base import Policy, equal_shares, one_gi_per_gpu, reference_batch
from rlsched.decision import Configuration, SharingMode
from rlsched.envs.gpushare import GpuShareEnv


class Fikit(Policy):
    """Priority fill: each GPU is one GI in ``priority-fill`` mode, so its highest-priority
    tenant runs as if alone (plus FIKIT's <= 5% overhead) and the others fill its idle gaps.

    Follows FIKIT (Wu et al., "FIKIT: Priority-Based Real-time GPU Multi-tasking Scheduling
    with Kernel Identification", arXiv 2311.10359). Departs: FIKIT fills at kernel
    granularity from profiled kernel gaps; here the simulator's priority-fill mode grants
    the low-priority tenants the high-priority tenant's measured idle fraction per interval.
    Tenants are dealt to GPUs in priority order, round-robin, so that high-priority tenants
    land on different GPUs where there are several; batches are the scenario reference's.
    """

    name = "fikit"

    def reset(self, env: GpuShareEnv) -> None:
        ordered = sorted(env.scenario.tenants, key=lambda t: t.priority.rank)  # stable: scenario order breaks ties
        groups: list[list[tuple[str, float, int]]] = [[] for _ in range(env.scenario.gpu_count)]
        for i, t in enumerate(ordered):
            groups[i % len(groups)].append((t.name, 0.0, reference_batch(env, t)))
        # MPS shares do not apply under priority fill, but a GI's shares must still sum to
        # at most 100% to be a valid configuration: equal shares.
        groups = [[(n, equal_shares(len(group)), b) for n, _, b in group] for group in groups]
        self.configuration: Configuration = one_gi_per_gpu(env, groups, SharingMode.PRIORITY_FILL)

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> Configuration:
        return self.configuration
