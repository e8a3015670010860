"""rlsched: a learned resource manager for shared NVIDIA GPUs (MIG layouts, MPS shares, batch sizes)."""

__version__ = "0.1.0"
