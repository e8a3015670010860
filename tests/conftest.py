"""Helpers shared by the test modules."""

from __future__ import annotations

import numpy as np
import pytest


def _random_observations_and_masks(obs_dim: int, nvec: np.ndarray, n: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` random observations in [0, 1) and masks (70% of the levels allowed, the first
    level of every component always), and the offset of each component in a mask."""
    rng = np.random.default_rng(seed)
    obs = rng.random((n, obs_dim), dtype=np.float32)
    masks = rng.random((n, int(np.sum(nvec)))) < 0.7
    starts = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    masks[:, starts] = True  # every component keeps a level
    return obs, masks, starts


@pytest.fixture
def random_observations_and_masks():
    """The policy-parity inputs of the export tests (see :func:`_random_observations_and_masks`)."""
    return _random_observations_and_masks
