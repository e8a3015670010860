"""What the simulator needs from the performance model (issue 3), as a Protocol.

The simulator asks only for per-batch latency curves, memory and training step times; the
calibrated :class:`rlsched.perfmodel.PerformanceModel` satisfies this, and so do the small
deterministic fakes in :mod:`rlsched.simulator.testing` used by the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rlsched.decision import SharingMode

try:  # The real definitions, once the performance model is merged.
    from rlsched.perfmodel import CoRunner  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - until issue 3 lands

    @dataclass(frozen=True)
    class CoRunner:  # type: ignore[no-redef]
        """A workload sharing the instance: model, batch, MPS share (percent)."""

        model: str
        batch: int
        mps_pct: float = 100.0


class PerformanceModelLike(Protocol):
    """The part of the performance model's interface the simulator uses."""

    def models(self) -> list[str]:
        """Model names the model can predict."""
        ...

    def predict(
        self,
        gpu: str,
        model: str,
        batch: int,
        profile: str | None = None,
        mps_pct: float = 100.0,
        mode: SharingMode = SharingMode.MPS,
        colocated: Sequence[CoRunner] = (),
        compute_slices: int | None = None,
    ) -> Any:
        """A Prediction (latency_ms_mean, latency_ms_p99, throughput_per_s, memory_gib, fits)."""
        ...

    def latency_curve_ms(
        self,
        gpu: str,
        model: str,
        max_batch: int,
        profile: str | None = None,
        mps_pct: float = 100.0,
        mode: SharingMode = SharingMode.MPS,
        colocated: Sequence[CoRunner] = (),
        compute_slices: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(mean_ms, p99_ms) per-batch latency for batch 1..max_batch."""
        ...

    def memory_gib(self, gpu: str, model: str, batch: int) -> float:
        """Device memory the model needs at that batch, GiB."""
        ...

    def train_step_s(
        self,
        gpu: str,
        model: str,
        batch: int,
        profile: str | None = None,
        mps_pct: float = 100.0,
        colocated: Sequence[CoRunner] = (),
    ) -> float:
        """One training step's time, seconds."""
        ...
