"""The request-level simulator of a node of shared GPUs (what PPO trains on and baselines are scored on)."""

from rlsched.simulator.node import NodeSimulator, StepResult, TenantStepStats

__all__ = ["NodeSimulator", "StepResult", "TenantStepStats"]
