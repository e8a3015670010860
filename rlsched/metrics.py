"""The metric names rlsched logs, and how each is computed from an environment step's ``info``.

One module so that training (TensorBoard), evaluation and the daemon log the same names
for the same quantities (CleanRL-style namespaces):

================================ ==========================================================
name                             meaning (over the steps aggregated)
================================ ==========================================================
``goodput/total``                Goodput objective per decision interval (the reward),
                                 request-equivalents; likewise ``goodput/goodput``,
                                 ``goodput/slo_penalty``, ``goodput/best_effort_progress``,
                                 ``goodput/reconfiguration_cost`` (terms of
                                 :mod:`rlsched.goodput`)
``slo/attainment``               on-time requests / decided (completed + dropped) requests,
                                 all inference tenants (ratio of sums, not mean of ratios)
``slo/attainment_<class>``       the same for priority class ``high``, ``normal``, ``low``
                                 (absent when no request of the class was decided)
``reconfig/rate``                fraction of steps whose configuration changed
``reconfig/restarts_per_step``   tenants restarted per step
``repair/rate``                  fraction of steps whose request the repair changed
``repair/fallback_rate``         fraction of steps that needed the batch-1 fallback
``repair/distance``              mean weighted repair distance per step
``repair/ms_mean``, ``ms_max``   decision (decode + repair) wall time per step, ms
                                 (absent when no repair timing was added)
``perf/steps_per_s``             environment steps per wall second (measured by the caller:
                                 see :meth:`MetricAggregator.summary`)
================================ ==========================================================

API: :func:`step_metrics` for one step; :class:`MetricAggregator` (``add`` each step's
``info``, ``summary()``, ``reset()``) for a span of steps; ``totals()`` /
``from_totals()`` carry an aggregator's state between processes (RLlib's env runners), so
that spans sampled in parallel combine into the same ratios of sums.

The ``info`` keys read (as :meth:`GpuShareEnv.step` writes them; a daemon builds the same
dict): the ``goodput/*`` terms (request-equivalents), ``slo_counts`` (priority class ->
``{"on_time": int, "decided": int}``), ``reconfigured`` (bool), ``restarted_tenants``
(list), ``repaired`` and ``repair_fallback`` (bool) and ``repair_distance`` (float).
Missing keys count as zero / False.

Repair wall time is not in ``info``: a step's ``info`` must be a function of the seed and
the actions (Gymnasium's determinism check), and a timing is not. The environment keeps it
in a :class:`RepairTiming` (``env.last_repair_ms``, ``env.take_repair_timing()``), and an
aggregator is given it with :meth:`MetricAggregator.add_repair_timing`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The Goodput terms of ``info`` (keys as :meth:`rlsched.goodput.GoodputTerms.as_dict` writes them).
GOODPUT_KEYS: tuple[str, ...] = (
    "goodput/total", "goodput/goodput", "goodput/slo_penalty", "goodput/best_effort_progress", "goodput/reconfiguration_cost",
)
#: Priority classes reported under ``slo/attainment_<class>``.
PRIORITY_CLASSES: tuple[str, ...] = ("high", "normal", "low")
#: Name of the throughput metric.
STEPS_PER_S = "perf/steps_per_s"
#: The one entry of :meth:`MetricAggregator.totals` that combines by maximum (the others add up).
MAX_TOTAL = "repair_ms_max"


@dataclass
class RepairTiming:
    """Wall time of the repairs since the last :meth:`take`: a constant-size summary that an
    environment keeps beside ``info`` and a metrics reader collects now and then (from
    environments in other processes too: :meth:`take` returns plain numbers)."""

    count: int = 0
    sum_ms: float = 0.0
    max_ms: float = 0.0

    def add(self, ms: float) -> None:
        """Count one repair that took ``ms`` milliseconds."""
        self.count += 1
        self.sum_ms += ms
        self.max_ms = max(self.max_ms, ms)

    def take(self) -> tuple[int, float, float]:
        """``(count, sum_ms, max_ms)`` of the repairs since the last take, and start afresh."""
        out = (self.count, self.sum_ms, self.max_ms)
        self.count, self.sum_ms, self.max_ms = 0, 0.0, 0.0
        return out


class MetricAggregator:
    """Sums step ``info`` dicts and reports the metrics of the span (see the module table)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every step added so far."""
        self.steps = 0
        self._sums: dict[str, float] = dict.fromkeys(GOODPUT_KEYS, 0.0)
        self._on_time: dict[str, int] = {}
        self._decided: dict[str, int] = {}
        self._reconfigured = self._restarts = self._repaired = self._fallbacks = 0
        self._distance = self._repair_ms = self._repair_ms_max = 0.0
        self._repairs_timed = 0

    def add(self, info: Mapping[str, Any]) -> MetricAggregator:
        """Add one step's ``info`` (from :meth:`GpuShareEnv.step` or the daemon's equivalent);
        returns ``self``. Steps without Goodput terms (e.g. a reset's info) are ignored."""
        if "goodput/total" not in info:
            return self
        self.steps += 1
        for key in GOODPUT_KEYS:
            self._sums[key] += float(info.get(key, 0.0))
        for priority, counts in info.get("slo_counts", {}).items():
            self._on_time[priority] = self._on_time.get(priority, 0) + int(counts["on_time"])
            self._decided[priority] = self._decided.get(priority, 0) + int(counts["decided"])
        self._reconfigured += bool(info.get("reconfigured", False))
        self._restarts += len(info.get("restarted_tenants", ()))
        self._repaired += bool(info.get("repaired", False))
        self._fallbacks += bool(info.get("repair_fallback", False))
        self._distance += float(info.get("repair_distance", 0.0))
        return self

    def add_repair_timing(self, count: int, sum_ms: float, max_ms: float) -> MetricAggregator:
        """Add the wall time of ``count`` repairs (``RepairTiming.take()``; one step's:
        ``(1, env.last_repair_ms, env.last_repair_ms)``); returns ``self``."""
        self._repairs_timed += int(count)
        self._repair_ms += float(sum_ms)
        self._repair_ms_max = max(self._repair_ms_max, float(max_ms))
        return self

    def totals(self) -> dict[str, float]:
        """The state of the span as plain numbers: the totals of spans aggregated apart add up
        (:data:`MAX_TOTAL` combines by maximum) to the totals of the spans together."""
        out = {"steps": float(self.steps), **self._sums, "reconfigured": float(self._reconfigured), "restarts": float(self._restarts),
               "repaired": float(self._repaired), "fallbacks": float(self._fallbacks), "distance": self._distance, "repair_ms": self._repair_ms,
               "repairs_timed": float(self._repairs_timed), MAX_TOTAL: self._repair_ms_max}
        out.update({f"on_time/{p}": float(n) for p, n in self._on_time.items()})
        out.update({f"decided/{p}": float(n) for p, n in self._decided.items()})
        return out

    @classmethod
    def from_totals(cls, totals: Mapping[str, float]) -> MetricAggregator:
        """An aggregator holding the span whose :meth:`totals` are given (missing keys: zero)."""
        out = cls()
        out.steps = int(totals.get("steps", 0))
        for key in GOODPUT_KEYS:
            out._sums[key] = float(totals.get(key, 0.0))
        for key, value in totals.items():
            kind, _, priority = key.partition("/")
            if kind == "on_time" and priority:
                out._on_time[priority] = int(value)
            elif kind == "decided" and priority:
                out._decided[priority] = int(value)
        out._reconfigured, out._restarts = int(totals.get("reconfigured", 0)), int(totals.get("restarts", 0))
        out._repaired, out._fallbacks = int(totals.get("repaired", 0)), int(totals.get("fallbacks", 0))
        out._distance, out._repair_ms = float(totals.get("distance", 0.0)), float(totals.get("repair_ms", 0.0))
        out._repair_ms_max = float(totals.get(MAX_TOTAL, 0.0))
        out._repairs_timed = int(totals.get("repairs_timed", 0))
        return out

    def summary(self, wall_s: float | None = None) -> dict[str, float]:
        """The metrics of the steps added since the last reset (empty if none).

        :param wall_s: wall time those steps took, seconds; adds ``perf/steps_per_s``
        """
        if self.steps == 0:
            return {}
        n = float(self.steps)
        out = {key: value / n for key, value in self._sums.items()}
        decided = sum(self._decided.values())
        if decided:
            out["slo/attainment"] = sum(self._on_time.values()) / decided
        for priority in PRIORITY_CLASSES:
            if self._decided.get(priority):
                out[f"slo/attainment_{priority}"] = self._on_time[priority] / self._decided[priority]
        out["reconfig/rate"] = self._reconfigured / n
        out["reconfig/restarts_per_step"] = self._restarts / n
        out["repair/rate"] = self._repaired / n
        out["repair/fallback_rate"] = self._fallbacks / n
        out["repair/distance"] = self._distance / n
        if self._repairs_timed:
            out["repair/ms_mean"] = self._repair_ms / self._repairs_timed
            out["repair/ms_max"] = self._repair_ms_max
        if wall_s is not None and wall_s > 0:
            out[STEPS_PER_S] = n / wall_s
        return out


def step_metrics(info: Mapping[str, Any], repair_ms: float | None = None) -> dict[str, float]:
    """The metrics of a single step (what a daemon logs after each decision).

    :param repair_ms: the step's repair wall time, ms (``env.last_repair_ms``; None: not timed)
    """
    aggregator = MetricAggregator().add(info)
    if repair_ms is not None and aggregator.steps:
        aggregator.add_repair_timing(1, repair_ms, repair_ms)
    return aggregator.summary()
