"""The three kinds of tenant that share a node's GPUs.

- :class:`InferenceTenant`: a DNN inference service with a latency SLO, a priority class,
  an arrival process and a dynamic batcher (max batch, batching timeout).
- :class:`ContinualLearningJob`: a retraining job paired with an inference tenant; the
  deployed model's accuracy drops with data drift and recovers with retraining progress
  along Ekya's curve ``acc(x) = 1 - (1/(b0*x + b1) + b2)``.
- :class:`BestEffortJob`: e.g. autotuning, with a throughput objective.

Numbers here that are not measured (restart costs, Ekya coefficients, drift) are scenario
parameters: every scenario file states its values and where they come from.

Any tenant may exist for part of the episode only (a service deployed mid-episode, a
retraining job that starts and ends): :class:`ActivityWindows` holds its windows.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import numpy as np

from rlsched.workloads.arrivals import ArrivalProcess


class Priority(str, enum.Enum):
    """Priority class of a tenant; priority fill lets the highest class run as if alone."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """0 for high, 1 for normal, 2 for low (smaller runs first)."""
        return ("high", "normal", "low").index(self.value)


@dataclass
class ActivityWindows:
    """When a tenant exists: half-open windows ``[from_s, until_s)`` of episode time.

    A base of every tenant kind, so each says when it is active the same way. The windows
    are sorted and disjoint (the scenario reader checks it); none at all means active the
    whole episode. The field is keyword-only so that it follows each kind's own fields.

    :param active_windows_s: ``((from_s, until_s), ...)``, seconds of episode time
    """

    active_windows_s: tuple[tuple[float, float], ...] = field(default=(), kw_only=True)

    def is_active(self, t_s: float) -> bool:
        """Whether the tenant exists at episode time ``t_s``."""
        return not self.active_windows_s or any(start <= t_s < end for start, end in self.active_windows_s)

    def active_seconds(self, t0_s: float, t1_s: float) -> float:
        """Seconds of ``[t0_s, t1_s)`` during which the tenant is active."""
        if not self.active_windows_s:
            return max(0.0, t1_s - t0_s)
        return sum(max(0.0, min(t1_s, end) - max(t0_s, start)) for start, end in self.active_windows_s)

    def activations_s(self, t0_s: float, t1_s: float) -> list[float]:
        """Times in ``[t0_s, t1_s)`` at which the tenant comes into existence (a window
        start that does not continue the previous window; the episode start is none: the
        tenant is deployed from the outset, like an always-active one)."""
        out = []
        previous_end = 0.0
        for start, end in self.active_windows_s:
            if t0_s <= start < t1_s and start > previous_end:
                out.append(start)
            previous_end = end
        return out

    def active_mask(self, times_s: np.ndarray) -> np.ndarray:
        """Bool per time of ``times_s``: whether the tenant is active then."""
        if not self.active_windows_s:
            return np.ones(times_s.shape, dtype=bool)
        starts = np.array([w[0] for w in self.active_windows_s])
        ends = np.array([w[1] for w in self.active_windows_s])
        index = np.searchsorted(starts, times_s, side="right") - 1
        return (index >= 0) & (times_s < ends[np.maximum(index, 0)])


@dataclass
class InferenceTenant(ActivityWindows):
    """A latency-critical inference service.

    :param name: unique tenant name (the key in :class:`~rlsched.decision.Configuration`)
    :param model: model name known to the performance model
    :param slo_ms: per-request latency objective (arrival to completion), milliseconds
    :param priority: priority class
    :param arrivals: the request arrival process
    :param max_batch: largest batch the policy may configure (the service curve is built up to it)
    :param batch_timeout_ms: longest the oldest waiting request is held for a fuller batch, ms
    :param queue_capacity: waiting requests beyond which arrivals are dropped
    :param queue_timeout_ms: a request that has waited longer than this when the server forms
        its next batch is rejected and counted as dropped (Triton's ``dynamic_batching {
        default_queue_policy { timeout_action: REJECT default_timeout_microseconds } }``),
        ms; None: every request is served, however late (FIFO)
    :param restart_s: downtime to restart the server process (CUDA context + model load),
        seconds: model dependent, a scenario parameter
    :param accuracy: accuracy of the deployed model when no CL job retrains it, in [0, 1]
    :param tuned_at_mps_pct: MPS share the model's kernels were autotuned at (None: not
        tuned for a share); serving at another share costs latency (SLICE-TUNE)
    :param tuning_mismatch_penalty: relative latency increase per 100 percentage points of
        |served share - tuned share| (scenario parameter)
    """

    name: str
    model: str
    slo_ms: float
    arrivals: ArrivalProcess
    priority: Priority = Priority.NORMAL
    max_batch: int = 32
    batch_timeout_ms: float = 2.0
    queue_capacity: int = 4096
    queue_timeout_ms: float | None = None
    restart_s: float = 0.0
    accuracy: float = 1.0
    tuned_at_mps_pct: float | None = None
    tuning_mismatch_penalty: float = 0.0

    kind = "inference"

    @property
    def queue_timeout_s(self) -> float:
        """:attr:`queue_timeout_ms` in seconds; inf for a server that rejects nothing."""
        return math.inf if self.queue_timeout_ms is None else self.queue_timeout_ms / 1000.0

    def tuning_latency_factor(self, served_mps_pct: float) -> float:
        """Latency multiplier for serving at ``served_mps_pct`` a model tuned at another share."""
        if self.tuned_at_mps_pct is None:
            return 1.0
        return 1.0 + self.tuning_mismatch_penalty * abs(served_mps_pct - self.tuned_at_mps_pct) / 100.0


@dataclass(frozen=True)
class EkyaCurve:
    """Ekya's accuracy after x units of retraining: ``1 - (1/(b0*x + b1) + b2)``.

    The coefficients are fitted per model from micro-profiles in Ekya (NSDI 2022); rlsched
    takes them as scenario parameters. ``x`` is measured in ``samples_per_unit`` training
    samples (see :class:`ContinualLearningJob`).
    """

    b0: float
    b1: float
    b2: float

    def accuracy(self, units: float) -> float:
        """Accuracy after ``units`` of retraining, clipped to [0, 1]."""
        value = 1.0 - (1.0 / (self.b0 * units + self.b1) + self.b2)
        return min(1.0, max(0.0, value))

    def units_for(self, accuracy: float) -> float:
        """The retraining units at which the curve reaches ``accuracy`` (its inverse; 0 below
        the curve's start, infinite at or above its ceiling ``1 - b2``)."""
        gap = 1.0 - self.b2 - accuracy
        return max(0.0, (1.0 / gap - self.b1) / self.b0) if gap > 0 else math.inf


@dataclass
class ContinualLearningJob(ActivityWindows):
    """A retraining job keeping an inference tenant's model accurate under data drift.

    Every ``drift_window_s`` the data distribution moves on: the retraining progress
    restarts at ``units_after_drift`` (so the served accuracy drops to
    ``curve.accuracy(units_after_drift)``) and grows by (samples trained) /
    ``samples_per_unit`` as the job trains; the served model tracks the retrained one.

    :param name: unique tenant name
    :param serves: name of the inference tenant whose model it retrains
    :param model: model name known to the performance model (training step time)
    :param curve: Ekya's accuracy curve
    :param samples_per_unit: training samples per unit of x
    :param drift_window_s: time between drift events, seconds (Ekya: 100-200 s windows)
    :param units_after_drift: retraining units the model keeps right after a drift
    :param restart_s: downtime to restart the training process, seconds (scenario parameter)
    """

    name: str
    serves: str
    model: str
    curve: EkyaCurve
    samples_per_unit: float
    drift_window_s: float
    units_after_drift: float = 0.0
    restart_s: float = 0.0
    priority: Priority = Priority.LOW

    kind = "continual-learning"


@dataclass
class BestEffortJob(ActivityWindows):
    """A best-effort job with a throughput objective (e.g. autotuning a model's kernels).

    Progress is counted in full-GPU seconds of work: each second it runs at throughput h
    adds h / h_solo, with h_solo the model's throughput alone on the whole GPU at the
    job's batch. ``work_weight`` converts progress into goodput units.

    :param tuned_at_mps_pct: share its kernels are being tuned for (SLICE-TUNE: running at
        another share costs ``tuning_mismatch_penalty`` relative throughput per 100 points)
    """

    name: str
    model: str
    restart_s: float = 0.0
    priority: Priority = Priority.LOW
    work_weight: float = 1.0
    tuned_at_mps_pct: float | None = None
    tuning_mismatch_penalty: float = 0.0
    extra: dict = field(default_factory=dict)

    kind = "best-effort"

    def tuning_throughput_factor(self, served_mps_pct: float) -> float:
        """Throughput multiplier at ``served_mps_pct`` for work tuned at another share."""
        if self.tuned_at_mps_pct is None:
            return 1.0
        return 1.0 / (1.0 + self.tuning_mismatch_penalty * abs(served_mps_pct - self.tuned_at_mps_pct) / 100.0)


Tenant = InferenceTenant | ContinualLearningJob | BestEffortJob
