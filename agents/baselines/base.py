"""What every baseline policy shares: the interface and the small helpers they build on.

A policy sees the observation and the (unwrapped) environment, and returns either an action
of the environment's MultiDiscrete space (per-tenant requests) or an exact
:class:`~rlsched.decision.Configuration`; :func:`apply` sends either through the ILP
repair (:meth:`GpuShareEnv.step` / :meth:`GpuShareEnv.step_configuration`), so a baseline
cannot apply anything the hardware could not carry out.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from rlsched.decision import Configuration, SharingMode, TenantPlacement
from rlsched.envs.gpushare import GpuShareEnv
from rlsched.hardware import GpuInstance, Layout, load_gpu
from rlsched.simulator.perf import CoRunner
from rlsched.workloads.tenants import InferenceTenant, Tenant

#: Batch size of a tenant the scenario's reference does not place.
DEFAULT_BATCH = 8
#: What a policy returns.
Decision = np.ndarray | Configuration


class Policy:
    """A decision rule: :meth:`reset` once per episode, :meth:`act` every decision interval."""

    name: ClassVar[str] = ""

    def reset(self, env: GpuShareEnv) -> None:
        """Prepare for a new episode of ``env`` (called after ``env.reset``)."""

    def act(self, observation: np.ndarray, env: GpuShareEnv) -> Decision:
        """The decision for the next interval."""
        raise NotImplementedError


def apply(env: GpuShareEnv, decision: Decision) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
    """Execute a policy's decision (an action or a configuration) for one interval."""
    if isinstance(decision, Configuration):
        return env.step_configuration(decision)
    return env.step(decision)


def whole_device(gpu_name: str) -> Layout:
    """One GI holding the whole GPU (the largest standard profile), or no layout without MIG."""
    gpu = load_gpu(gpu_name)
    if not gpu.mig_supported:
        return Layout(gpu_name, ())
    largest = max((p for p in gpu.profiles.values() if p.variant == "standard"), key=lambda p: (p.compute_slices, p.memory_gib))
    return Layout(gpu_name, (GpuInstance(0, largest.name),))


def whole_device_profile(gpu_name: str) -> str | None:
    """The profile of :func:`whole_device` (None without MIG: the performance model's whole GPU)."""
    layout = whole_device(gpu_name)
    return layout.instances[0].profile if len(layout) else None


def reference_batch(env: GpuShareEnv, tenant: Tenant) -> int:
    """The batch the scenario's reference gives the tenant (:data:`DEFAULT_BATCH` if none),
    within its ``max_batch``."""
    reference = env.scenario.reference
    batch = reference.placements[tenant.name].batch_size if reference and tenant.name in reference.placements else DEFAULT_BATCH
    return min(batch, tenant.max_batch) if isinstance(tenant, InferenceTenant) else batch


def one_gi_per_gpu(env: GpuShareEnv, groups: list[list[tuple[str, float, int]]], mode: SharingMode) -> Configuration:
    """Each GPU as one whole-device GI in ``mode``, holding its group of (tenant, share %, batch)."""
    layout = whole_device(env.scenario.gpu)
    placements = {name: TenantPlacement(g, 0, share, batch) for g, group in enumerate(groups) for name, share, batch in group}
    order = {n: i for i, n in enumerate(env.tenant_names)}
    placements = dict(sorted(placements.items(), key=lambda kv: order[kv[0]]))
    return Configuration(tuple(layout for _ in groups), tuple((mode,) for _ in groups), placements)


def arrival_rates_rps(env: GpuShareEnv) -> dict[str, float]:
    """Each inference tenant's smoothed arrival rate as measured so far, requests/s."""
    measured = env.backend.observe()
    return {t.name: float(measured[t.name].get("arrival_rate_ewma_rps", 0.0)) for t in env.scenario.inference_tenants()}


def equal_shares(count: int) -> float:
    """Each of ``count`` tenants' equal MPS share of one GI, percent (floored to 0.01%)."""
    return math.floor(10000.0 / count) / 100.0


class LatencyTable:
    """Memoized performance-model predictions (mean batch latency, ms) for a scenario's GPU."""

    def __init__(self, env: GpuShareEnv) -> None:
        self.gpu = env.scenario.gpu
        self.perf = env.backend.perf_model
        self._cache: dict[tuple, float] = {}

    def mean_ms(self, model: str, batch: int, profile: str | None, mps_pct: float = 100.0,
                mode: SharingMode = SharingMode.MPS, colocated: tuple[CoRunner, ...] = ()) -> float:
        """Mean latency of one batch, ms."""
        key = (model, batch, profile, mps_pct, mode, colocated)
        if key not in self._cache:
            self._cache[key] = float(self.perf.predict(self.gpu, model, batch, profile, mps_pct, mode, colocated).latency_ms_mean)
        return self._cache[key]
