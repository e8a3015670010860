"""iGniter's provisioning greedy (Xu et al., TPDS 2023; icloud-ecnu/igniter), below any environment.

The solver layer owns it because both the ``igniter`` baseline policy
(:mod:`rlsched.agents.baselines.igniter`) and the capacity planner's side-by-side method
(``rlsched plan --method igniter``, :mod:`rlsched.solver.capacity`) run it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Protocol

from rlsched.decision import BATCH_LEVELS
from rlsched.perfmodel import CoRunner
from rlsched.solver.capacity import SHARE_STEP_PCT  # iGniter's 2.5% share steps

#: iGniter's split of the SLO: half for queueing, half for executing a batch.
EXECUTION_BUDGET_FRACTION = 0.5


class ServiceLike(Protocol):
    """What the greedy reads of a tenant (an :class:`InferenceTenant` or a planned service)."""

    model: str
    slo_ms: float
    max_batch: int


class IgniterGreedy:
    """iGniter's provisioning greedy on whole-GPU MPS shares, independent of any environment
    (the :class:`~rlsched.agents.baselines.igniter.Igniter` policy and ``rlsched plan --method
    igniter`` both run it).

    :param latency_ms: ``(model, batch, share %, co-runners) -> mean batch latency, ms`` on
        the whole GPU (its largest instance)
    """

    def __init__(self, latency_ms: Callable[[str, int, float, tuple[CoRunner, ...]], float]) -> None:
        self.latency_ms = latency_ms

    def alone(self, t: ServiceLike, rate_rps: float) -> tuple[int, float]:
        """(batch, least share %) for one tenant alone on a whole GPU."""
        budget_ms = t.slo_ms * EXECUTION_BUDGET_FRACTION
        wanted = max(1, math.ceil(rate_rps * budget_ms / 1000.0))
        batch = next((b for b in BATCH_LEVELS if b >= wanted and b <= t.max_batch), max(b for b in BATCH_LEVELS if b <= t.max_batch))
        for step in range(1, int(100.0 / SHARE_STEP_PCT) + 1):
            share = step * SHARE_STEP_PCT
            if self._fits(t, batch, share, (), rate_rps):
                return batch, share
        return batch, 100.0

    def _fits(self, t: ServiceLike, batch: int, share: float, colocated: tuple[CoRunner, ...], rate_rps: float) -> bool:
        latency = self.latency_ms(t.model, batch, share, colocated)
        return latency <= t.slo_ms * EXECUTION_BUDGET_FRACTION and batch * 1000.0 / latency >= rate_rps

    def _raise_until_fit(self, group: dict[str, list], tenants: Mapping[str, ServiceLike], rates: Mapping[str, float]) -> bool:
        """Raise violating tenants' shares by one step until all fit; False if over 100%."""
        while True:
            violating = []
            for name, (batch, share) in group.items():
                others = tuple(CoRunner(tenants[o].model, b, s) for o, (b, s) in group.items() if o != name)
                if not self._fits(tenants[name], batch, share, others, rates[name]):
                    violating.append(name)
            if not violating:
                return True
            for name in violating:
                group[name][1] += SHARE_STEP_PCT
            if sum(s for _, s in group.values()) > 100.0 + 1e-9:
                return False

    def place(self, tenants: Mapping[str, ServiceLike], rates: Mapping[str, float], gpu_count: int | None) -> list[dict[str, list]]:
        """Per GPU, tenant -> [batch, share %]: tenants in descending share order on the first
        GPU where, after raising co-located shares step by step, every one still fits.

        :param gpu_count: the node's GPUs (a tenant that fits nowhere joins the GPU with the
            least share in use); None rents a new GPU for it, as iGniter does
        """
        wanted = {name: self.alone(t, rates[name]) for name, t in tenants.items()}
        gpus: list[dict[str, list]] = [{} for _ in range(gpu_count or 0)]
        for name in sorted(wanted, key=lambda n: -wanted[n][1]):
            batch, share = wanted[name]
            for group in gpus:
                trial = {k: list(v) for k, v in group.items()} | {name: [batch, share]}
                if sum(s for _, s in trial.values()) <= 100.0 + 1e-9 and self._raise_until_fit(trial, tenants, rates):
                    group.clear()
                    group.update(trial)
                    break
            else:
                if gpu_count is None:
                    gpus.append({name: [batch, share]})
                else:
                    min(gpus, key=lambda g: sum(s for _, s in g.values()))[name] = [batch, share]
        return gpus
