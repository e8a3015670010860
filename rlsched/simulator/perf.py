"""What the simulator needs from the performance model (issue 3), as a Protocol.

The simulator asks only for per-batch latency curves, memory and training step times; the
calibrated :class:`rlsched.perfmodel.PerformanceModel` satisfies this, and so do the small
deterministic fakes in :mod:`rlsched.simulator.testing` used by the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from rlsched.decision import SharingMode
from rlsched.perfmodel import CoRunner

__all__ = ["CoRunner", "PerformanceModelLike"]


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
        *,
        high_priority: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(mean_ms, p99_ms) per-batch latency for batch 1..max_batch.

        ``high_priority`` matters under priority fill only: the high-priority tenant's
        latency (solo plus FIKIT's overhead) or a filler's.
        """
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
