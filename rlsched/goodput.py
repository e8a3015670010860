"""Goodput: the one objective rlsched optimises and reports.

MIGRator's idea: a request counts only if it completes within its SLO, and then it counts
by the accuracy of the model that served it. A best-effort job adds its progress, a missed
or dropped request costs a penalty, and reconfiguration downtime costs its own term. Each
term is reported separately; per-interval terms add up, so the sum of per-step rewards is
exactly the episode objective. The simulator, the RL environment, the ILP planner, the
baselines and the daemon all score with :func:`goodput_terms`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GoodputWeights:
    """How the terms are weighted (scenario parameters).

    :param priority: weight of a request by its tenant's priority class
    :param slo_penalty: penalty per violated or dropped request, in units of one on-time,
        fully accurate request of the same priority class
    :param best_effort: goodput per full-GPU second of best-effort progress
    :param reconfiguration_per_s: cost per tenant-second of restart/reconfiguration downtime
    """

    priority: Mapping[str, float] = field(default_factory=lambda: {"high": 1.0, "normal": 1.0, "low": 1.0})
    slo_penalty: float = 1.0
    best_effort: float = 1.0
    reconfiguration_per_s: float = 0.0


@dataclass(frozen=True)
class GoodputTerms:
    """The objective over some span of time, term by term (all in request-equivalents).

    :param goodput: sum over on-time requests of priority weight x served accuracy
    :param slo_penalty: sum over violated and dropped requests of priority weight x penalty
    :param best_effort_progress: weighted best-effort progress
    :param reconfiguration_cost: weighted downtime
    """

    goodput: float = 0.0
    slo_penalty: float = 0.0
    best_effort_progress: float = 0.0
    reconfiguration_cost: float = 0.0

    @property
    def total(self) -> float:
        """The objective (the RL reward): goodput + best effort - penalty - reconfiguration."""
        return self.goodput + self.best_effort_progress - self.slo_penalty - self.reconfiguration_cost

    def __add__(self, other: GoodputTerms) -> GoodputTerms:
        return GoodputTerms(
            self.goodput + other.goodput,
            self.slo_penalty + other.slo_penalty,
            self.best_effort_progress + other.best_effort_progress,
            self.reconfiguration_cost + other.reconfiguration_cost,
        )

    def as_dict(self) -> dict[str, float]:
        """Namespaced metrics (``goodput/...``) for logs and JSON."""
        return {
            "goodput/goodput": self.goodput,
            "goodput/slo_penalty": self.slo_penalty,
            "goodput/best_effort_progress": self.best_effort_progress,
            "goodput/reconfiguration_cost": self.reconfiguration_cost,
            "goodput/total": self.total,
        }


def goodput_terms(
    weights: GoodputWeights,
    priority: str,
    on_time: float = 0.0,
    accuracy: float = 1.0,
    violated: float = 0.0,
    dropped: float = 0.0,
    best_effort_progress_s: float = 0.0,
    downtime_s: float = 0.0,
) -> GoodputTerms:
    """The terms contributed by one tenant over one span of time.

    :param priority: the tenant's priority class ("high", "normal", "low")
    :param on_time: requests completed within their SLO
    :param accuracy: accuracy of the serving model at their completion, in [0, 1]
    :param violated: requests completed after their SLO
    :param dropped: requests dropped (queue full, or rejected past the queue timeout)
    :param best_effort_progress_s: best-effort progress, full-GPU seconds
    :param downtime_s: restart/reconfiguration downtime of the tenant, seconds
    """
    w = weights.priority.get(priority, 1.0)
    return GoodputTerms(
        goodput=w * on_time * accuracy,
        slo_penalty=w * weights.slo_penalty * (violated + dropped),
        best_effort_progress=weights.best_effort * best_effort_progress_s,
        reconfiguration_cost=weights.reconfiguration_per_s * downtime_s,
    )
