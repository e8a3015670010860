"""A small deterministic performance model for tests and examples (not calibrated).

Latency is linear in the batch and inversely proportional to the compute the tenant gets
(instance slices x MPS share), with a fixed relative slowdown per co-runner. It has the
real model's interface (:class:`~rlsched.simulator.perf.PerformanceModelLike`), so the
simulator can be tested without the calibration data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlsched.decision import SharingMode
from rlsched.hardware import load_gpu
from rlsched.simulator.perf import CoRunner


@dataclass(frozen=True)
class FakePrediction:
    """Same fields as the real model's Prediction."""

    latency_ms_mean: float
    latency_ms_p99: float
    throughput_per_s: float
    memory_gib: float
    fits: bool


@dataclass
class FakePerformanceModel:
    """Deterministic toy model: latency_ms(b) = (base_ms + per_item_ms * b) / compute_fraction.

    :param base_ms: per-batch fixed cost on the whole GPU, ms
    :param per_item_ms: cost per request on the whole GPU, ms
    :param p99_ratio: p99 / mean (1.0: deterministic service)
    :param colocation_slowdown: relative slowdown per co-runner (MPS) or share of time lost
        per co-runner (time slicing)
    :param memory_gib_per_model: memory a model needs, GiB (plus 0.01 GiB per batch item)
    :param train_step_ms: training step time on the whole GPU per sample, ms
    """

    base_ms: float = 2.0
    per_item_ms: float = 0.5
    p99_ratio: float = 1.0
    colocation_slowdown: float = 0.1
    memory_gib_per_model: float = 2.0
    train_step_ms: float = 1.0

    model_names: tuple[str, ...] = ("toy-a", "toy-b", "toy-c", "toy-d", "resnet50", "vit", "bert-base", "vgg19", "alexnet", "ssd", "mobilenet")

    def models(self) -> list[str]:
        return list(self.model_names)

    def _fraction(self, gpu: str, profile: str | None, mps_pct: float, mode: SharingMode, colocated: Sequence[CoRunner], compute_slices: int | None) -> float:
        spec = load_gpu(gpu)
        if not spec.mig_supported:
            fraction = 1.0
        else:
            slices = compute_slices if compute_slices is not None else (spec.profiles[profile].compute_slices if profile else spec.compute_slices)
            fraction = slices / spec.compute_slices
        if mode == SharingMode.TIME_SLICE:
            return fraction / (1 + len(colocated))
        return fraction * mps_pct / 100.0 / (1 + self.colocation_slowdown * len(colocated))

    def latency_curve_ms(self, gpu, model, max_batch, profile=None, mps_pct=100.0, mode=SharingMode.MPS, colocated=(), compute_slices=None, *, high_priority=True):
        batches = np.arange(1, max_batch + 1)
        if mode == SharingMode.PRIORITY_FILL:
            # Solo speed; the high-priority tenant pays FIKIT's 5% when it has co-runners.
            solo = (self.base_ms + self.per_item_ms * batches) / self._fraction(gpu, profile, 100.0, SharingMode.MPS, (), compute_slices)
            mean = solo * (1.05 if high_priority and colocated else 1.0)
            return mean, mean * self.p99_ratio
        mean = (self.base_ms + self.per_item_ms * batches) / self._fraction(gpu, profile, mps_pct, mode, colocated, compute_slices)
        return mean, mean * self.p99_ratio

    def predict(self, gpu, model, batch, profile=None, mps_pct=100.0, mode=SharingMode.MPS, colocated=(), compute_slices=None):
        mean, p99 = self.latency_curve_ms(gpu, model, batch, profile, mps_pct, mode, colocated, compute_slices)
        memory = self.memory_gib(gpu, model, batch)
        capacity = load_gpu(gpu).profiles[profile].memory_gib if profile else load_gpu(gpu).memory_gib
        return FakePrediction(float(mean[-1]), float(p99[-1]), batch * 1000.0 / float(mean[-1]), memory, memory <= capacity)

    def memory_gib(self, gpu, model, batch):
        return self.memory_gib_per_model + 0.01 * batch

    def train_step_s(self, gpu, model, batch, profile=None, mps_pct=100.0, colocated=()):
        return batch * self.train_step_ms / 1000.0 / self._fraction(gpu, profile, mps_pct, SharingMode.MPS, colocated, None)
