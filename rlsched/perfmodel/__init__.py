"""Calibrated performance model of tenants sharing NVIDIA GPUs (MIG, MPS, time slicing).

``PerformanceModel.load()`` reads ``configs/calibration``; the law is in :mod:`physics`,
the fits in :mod:`sources` and :mod:`fitting`, the raw-data readers in :mod:`data`.
"""

from rlsched.decision import SharingMode
from rlsched.perfmodel.model import CoRunner, PerformanceModel, Prediction

__all__ = ["CoRunner", "PerformanceModel", "Prediction", "SharingMode"]
