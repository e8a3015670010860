"""The observation of ``rlsched/GpuShare-v0``: one flat float32 vector in [0, 1].

Per tenant (:data:`TENANT_FEATURES`), then per GPU (:data:`GPU_FEATURES`), then the
episode's elapsed fraction. Every feature is divided by a natural scale and clipped, so the
vector fits a ``Box(0, 1)`` whatever the load (NaN, e.g. no request completed, reads 0).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gymnasium import spaces

from rlsched.decision import Configuration, SharingMode
from rlsched.hardware import load_gpu
from rlsched.solver import NON_MIG_COMPUTE_SLICES
from rlsched.workloads.scenario import Scenario
from rlsched.workloads.tenants import BestEffortJob, ContinualLearningJob, InferenceTenant, Priority

#: Arrival rates are divided by this multiple of the tenant's long-run mean rate.
RATE_SCALE = 4.0
#: p99 latency / SLO is divided by this (4: "four times over the SLO" reads 1).
P99_OVER_SLO_SCALE = 4.0
#: SLOs are divided by this, milliseconds.
SLO_SCALE_MS = 1000.0
#: Batch sizes are divided by this.
BATCH_SCALE = 64.0

TENANT_FEATURES: tuple[str, ...] = (
    "arrival_rate", "arrival_rate_ewma", "queue_length", "p99_over_slo", "slo_attainment", "utilization",
    "accuracy", "progress", "kind_inference", "kind_continual_learning", "kind_best_effort",
    "priority_high", "priority_normal", "priority_low", "slo",
    "placed_gpu", "instance_slices", "mps_share", "batch_size", "mode_mps", "mode_time_slice", "mode_priority_fill",
    "load", "load_ewma",
)
#: Features whose clipped top reads "this much or worse" by design: p99 at four times the SLO
#: and p99 at forty times both read 1; a full queue (the batch in service counted too) reads
#: 1; a load beyond what the whole GPU serves reads 1. Training on overloaded scenarios sees that often, so a raw value above the Box is still
#: inside what the policy was trained on.
SATURATING_FEATURES: frozenset[str] = frozenset({"p99_over_slo", "queue_length", "load", "load_ewma"})
GPU_FEATURES: tuple[str, ...] = ("compute_slices_used", "instances", "tenants", "memory_used", "reconfiguration")


class ObservationEncoder:
    """Builds the normalized vector from the backend's measurements and the running configuration.

    :param scenario: the node and its tenants
    :param memory_gib: ``(tenant, batch) -> GiB`` the tenant needs (for the GPUs' memory use)
    :param capacity_rps: ``inference tenant -> requests/s`` one whole GPU serves for it (the
        ``load`` features divide arrival rates by it)
    """

    def __init__(self, scenario: Scenario, memory_gib: Callable[[str, int], float], capacity_rps: Callable[[str], float]) -> None:
        self.scenario = scenario
        self.memory_gib = memory_gib
        # The rate features are relative to the tenant's own long-run mean, which hides how
        # heavy the load is; the load features say it in whole GPUs (what the planner
        # decides from: absolute rates against the capacity of each slice).
        self.capacity_rps = {t.name: capacity_rps(t.name) for t in scenario.tenants if isinstance(t, InferenceTenant)}
        self.gpu = load_gpu(scenario.gpu)
        self.tenants = list(scenario.tenants)
        self.size = len(self.tenants) * len(TENANT_FEATURES) + scenario.gpu_count * len(GPU_FEATURES) + 1
        self.space = spaces.Box(low=0.0, high=1.0, shape=(self.size,), dtype=np.float32)
        self.gpu_slices = float(self.gpu.compute_slices) if self.gpu.mig_supported else NON_MIG_COMPUTE_SLICES
        self.max_instances = max((p.max_count for p in self.gpu.profiles.values()), default=1) if self.gpu.mig_supported else 1

    def names(self) -> list[str]:
        """A name per entry of the vector (``tenant/feature``, ``gpu<g>/feature``, ``time``)."""
        out = [f"{t.name}/{f}" for t in self.tenants for f in TENANT_FEATURES]
        out += [f"gpu{g}/{f}" for g in range(self.scenario.gpu_count) for f in GPU_FEATURES]
        return out + ["time"]

    def range_checked(self) -> np.ndarray:
        """Bool per entry: True where a raw value outside [0, 1] means "outside training"
        (every feature but :data:`SATURATING_FEATURES`)."""
        return np.array([name.rpartition("/")[2] not in SATURATING_FEATURES for name in self.names()])

    def encode(self, measured: dict[str, dict[str, float]], config: Configuration | None, gpu_reconfiguration_s: tuple[float, ...], elapsed_fraction: float) -> np.ndarray:
        """The observation (:meth:`raw`, clipped into the Box)."""
        return self.clip(self.raw(measured, config, gpu_reconfiguration_s, elapsed_fraction))

    @staticmethod
    def clip(raw: np.ndarray) -> np.ndarray:
        """A raw vector in the Box: NaN reads 0, everything clipped into [0, 1], float32."""
        return np.clip(np.where(np.isfinite(raw), raw, 0.0), 0.0, 1.0).astype(np.float32)

    def raw(self, measured: dict[str, dict[str, float]], config: Configuration | None, gpu_reconfiguration_s: tuple[float, ...], elapsed_fraction: float) -> np.ndarray:
        """The normalized features before clipping (a value outside [0, 1] is outside what
        training saw: the daemon falls back to the planner then).

        :param measured: the backend's per-tenant measurements of the last interval
        :param config: the running configuration (None: nothing deployed)
        :param gpu_reconfiguration_s: per GPU, GI destroy + create seconds of the last step
        :param elapsed_fraction: simulated time / episode duration
        """
        interval = self.scenario.decision_interval_s
        rows = []
        for t in self.tenants:
            m = measured.get(t.name, {})
            row = np.zeros(len(TENANT_FEATURES))
            if isinstance(t, InferenceTenant):
                mean_rate = max(t.arrivals.mean_rate_rps(), 1.0)
                row[0] = m.get("arrival_rate_rps", 0.0) / (RATE_SCALE * mean_rate)
                row[1] = m.get("arrival_rate_ewma_rps", 0.0) / (RATE_SCALE * mean_rate)
                row[2] = m.get("queue_length", 0.0) / t.queue_capacity
                row[3] = m.get("p99_over_slo", 0.0) / P99_OVER_SLO_SCALE
                row[4] = m.get("slo_attainment", 1.0)
                row[5] = m.get("utilization", 0.0)
                row[14] = t.slo_ms / SLO_SCALE_MS
                capacity = self.capacity_rps[t.name]
                row[22] = m.get("arrival_rate_rps", 0.0) / capacity
                row[23] = m.get("arrival_rate_ewma_rps", 0.0) / capacity
            elif isinstance(t, ContinualLearningJob):
                # Progress in retraining units per interval: one unit per interval reads 1.
                row[7] = m.get("progress", 0.0) / t.samples_per_unit
            elif isinstance(t, BestEffortJob):
                # Full-GPU seconds per second of interval (1 = a whole GPU's worth).
                row[7] = m.get("progress", 0.0) / interval
            row[6] = m.get("accuracy", 1.0)
            row[8 + ("inference", "continual-learning", "best-effort").index(t.kind)] = 1.0
            row[11 + t.priority.rank if isinstance(t.priority, Priority) else 12] = 1.0
            if config is not None and t.name in config.placements:
                p = config.placements[t.name]
                mode = config.modes[p.gpu_index][p.instance_index]
                row[15] = (p.gpu_index + 1) / self.scenario.gpu_count
                row[16] = self._instance_slices(config, p.gpu_index, p.instance_index) / self.gpu_slices
                row[17] = p.mps_pct / 100.0
                row[18] = p.batch_size / BATCH_SCALE
                row[19 + list(SharingMode).index(mode)] = 1.0
            rows.append(row)
        for g in range(self.scenario.gpu_count):
            row = np.zeros(len(GPU_FEATURES))
            if config is not None:
                count = config.instance_count(g)
                row[0] = sum(self._instance_slices(config, g, i) for i in range(count)) / self.gpu_slices
                row[1] = count / self.max_instances
                placed = [(n, p) for n, p in config.placements.items() if p.gpu_index == g]
                row[2] = len(placed) / len(self.tenants)
                row[3] = sum(self.memory_gib(n, p.batch_size) for n, p in placed) / self.gpu.memory_gib
            if g < len(gpu_reconfiguration_s):
                row[4] = gpu_reconfiguration_s[g] / interval
            rows.append(row)
        rows.append(np.array([elapsed_fraction]))
        return np.concatenate(rows)

    def _instance_slices(self, config: Configuration, g: int, i: int) -> float:
        layout = config.layouts[g]
        if not self.gpu.mig_supported or not len(layout):
            return self.gpu_slices
        return float(self.gpu.profiles[layout.instances[i].profile].compute_slices)

