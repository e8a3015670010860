"""Static baselines: one configuration for the whole episode."""

from __future__ import annotations

import numpy as np

from rlsched.decision import Configuration, SharingMode
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.agents.baselines.base import Policy, equal_shares, one_gi_per_gpu, reference_batch


class StaticEqual(Policy):
    """Equal split: the tenants are spread round-robin over the GPUs, each GPU is one GI
    shared under MPS in equal active-thread percentages, batches as in the scenario's
    reference.

    The textbook "fair share" starting point (Ekya's thief scheduler starts from it too,
    Ekya NSDI 2022); no paper to depart from. Equal MPS shares rather than equal MIG slices
    because MIG cannot split an A100 into, e.g., 3 or 5 equal parts.
    """

    name = "static-equal"

    def reset(self, env: GpuShareEnv) -> None:
        groups: list[list[str]] = [[] for _ in range(env.scenario.gpu_count)]
        for i, t in enumerate(env.scenario.tenants):
            groups[i % len(groups)].append(t.name)
        by_name = {t.name: t for t in env.scenario.tenants}
        self.configuration: Configuration = one_gi_per_gpu(
            env, [[(n, equal_shares(len(group)), reference_batch(env, by_name[n])) for n in group] for group in groups], SharingMode.MPS
        )

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> Configuration:
        return self.configuration
