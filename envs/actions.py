"""The action of ``rlsched/GpuShare-v0``: per-tenant resource requests, decoded for the ILP repair.

A policy does not pick MIG profiles and start slots (a huge, mostly infeasible space); each
tenant asks for an amount of GPU and how it wants it, as five discrete levels:

========== ============================================================================
component  meaning
========== ============================================================================
size       compute slices of the GPU instance (GI) it wants (the GPU type's standard
           GI sizes, e.g. 1, 2, 3, 4, 7 on an A100; the whole device without MIG)
share      its MPS share of that GI, percent (:data:`SHARE_LEVELS_PCT`); the compute it
           asks for is ``size x share``, so several tenants asking for fractions of the
           same size can be co-located in one GI
gpu        0: any GPU; g + 1: GPU g
mode       sharing mode of its GI (:class:`~rlsched.decision.SharingMode`, in enum order)
batch      batch size (:data:`BATCH_LEVELS`; a retraining job's training batch)
========== ============================================================================

The flat ``MultiDiscrete`` holds tenant 0's five components, then tenant 1's, and so on.
:func:`rlsched.solver.repair` turns the requests into an exact feasible configuration,
so every action of the space can be executed. :meth:`ActionCodec.masks` marks the levels a
tenant cannot use (batch sizes beyond its ``max_batch`` or beyond the largest GI's
memory); the decoder still accepts them and clamps them, so that unmasked algorithms are
safe too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from rlsched.decision import BATCH_LEVELS, SHARE_LEVELS_PCT, Configuration, SharingMode
from rlsched.errors import ConfigError
from rlsched.hardware import load_gpu
from rlsched.solver import NON_MIG_COMPUTE_SLICES, RepairProblem, TenantRequest
from rlsched.workloads.scenario import Scenario
from rlsched.workloads.tenants import InferenceTenant

#: Sharing modes, in the order of the ``mode`` component.
MODES: tuple[SharingMode, ...] = tuple(SharingMode)
#: The five components of one tenant's request, in action order.
COMPONENTS: tuple[str, ...] = ("size", "share", "gpu", "mode", "batch")
#: Source named in errors about actions.
SOURCE = "action"


@dataclass(frozen=True)
class DecodedAction:
    """What an action asks for, ready for the repair.

    :param problem: the node and every tenant's request
    :param clamped: tenant -> components whose level was masked and replaced (e.g. a batch
        beyond the tenant's ``max_batch``)
    """

    problem: RepairProblem
    clamped: dict[str, tuple[str, ...]]


class ActionCodec:
    """Translates between the flat MultiDiscrete action and per-tenant repair requests.

    :param scenario: the node (GPU type and count) and its tenants
    :param memory_gib: ``(tenant name, batch size) -> device memory GiB`` the tenant needs
        (from the performance model); it decides which batch levels fit in the largest GI
    """

    def __init__(self, scenario: Scenario, memory_gib: Callable[[str, int], float]) -> None:
        self.scenario = scenario
        self.memory_gib = memory_gib
        self.gpu = load_gpu(scenario.gpu)
        self.tenant_names = [t.name for t in scenario.tenants]
        if self.gpu.mig_supported:
            sizes = {p.compute_slices for p in self.gpu.profiles.values() if p.variant == "standard"}
            self.size_levels: tuple[float, ...] = tuple(float(s) for s in sorted(sizes))
            largest_gi_gib = max(p.memory_gib for p in self.gpu.profiles.values() if p.variant == "standard")
        else:
            self.size_levels = (NON_MIG_COMPUTE_SLICES,)
            largest_gi_gib = self.gpu.memory_gib
        self.gpu_levels = scenario.gpu_count + 1
        self.nvec_per_tenant = np.array([len(self.size_levels), len(SHARE_LEVELS_PCT), self.gpu_levels, len(MODES), len(BATCH_LEVELS)], dtype=np.int64)
        self.space = spaces.MultiDiscrete(np.tile(self.nvec_per_tenant, len(self.tenant_names)))
        # The largest usable batch level per tenant: within max_batch (inference) and within
        # the largest GI's memory; level 0 (batch 1) is always kept so a tenant can run.
        self.max_batch_level = []
        for t in scenario.tenants:
            limit = t.max_batch if isinstance(t, InferenceTenant) else BATCH_LEVELS[-1]
            levels = [i for i, b in enumerate(BATCH_LEVELS) if b <= limit and memory_gib(t.name, b) <= largest_gi_gib]
            self.max_batch_level.append(max(levels, default=0))

    # ------------------------------------------------------------------ masks
    def masks(self) -> np.ndarray:
        """Boolean mask over every level of every component (sb3-contrib's layout: the
        concatenation of one boolean vector per MultiDiscrete dimension)."""
        parts = []
        for i in range(len(self.tenant_names)):
            parts.append(np.ones(len(self.size_levels), dtype=bool))
            parts.append(np.ones(len(SHARE_LEVELS_PCT), dtype=bool))
            parts.append(np.ones(self.gpu_levels, dtype=bool))
            parts.append(np.ones(len(MODES), dtype=bool))
            parts.append(np.arange(len(BATCH_LEVELS)) <= self.max_batch_level[i])
        return np.concatenate(parts)

    # ------------------------------------------------------------------ decode
    def check(self, action: object) -> np.ndarray:
        """The action as an ``(N, 5)`` int array; a clear :class:`ConfigError` if malformed."""
        array = np.asarray(action)
        expected = self.space.shape
        if array.shape != expected:
            raise ConfigError(SOURCE, "shape", array.shape, f"expected {expected}: {len(COMPONENTS)} levels ({', '.join(COMPONENTS)}) per tenant ({', '.join(self.tenant_names)})")
        if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating) or array.dtype == bool):
            raise ConfigError(SOURCE, "dtype", str(array.dtype), "expected integer levels")
        per_tenant = array.reshape(len(self.tenant_names), len(COMPONENTS))
        for i, name in enumerate(self.tenant_names):
            for c, component in enumerate(COMPONENTS):
                value = per_tenant[i, c]
                where = f"[{i * len(COMPONENTS) + c}] (tenant {name!r}, {component})"
                if np.issubdtype(array.dtype, np.floating) and (not math.isfinite(float(value)) or float(value) != int(value)):
                    raise ConfigError(SOURCE, where, float(value), "expected an integer level")
                if not 0 <= int(value) < self.nvec_per_tenant[c]:
                    raise ConfigError(SOURCE, where, int(value), f"allowed levels: 0..{self.nvec_per_tenant[c] - 1}")
        return per_tenant.astype(np.int64)

    def decode(self, action: object) -> DecodedAction:
        """The repair problem an action asks for (masked levels clamped to the nearest allowed)."""
        levels = self.check(action)
        requests = {}
        clamped: dict[str, tuple[str, ...]] = {}
        for i, t in enumerate(self.scenario.tenants):
            size_level, share_level, gpu_level, mode_level, batch_level = (int(x) for x in levels[i])
            if batch_level > self.max_batch_level[i]:
                batch_level = self.max_batch_level[i]
                clamped[t.name] = ("batch",)
            size = self.size_levels[size_level]
            share = SHARE_LEVELS_PCT[share_level]
            batch = BATCH_LEVELS[batch_level]
            requests[t.name] = TenantRequest(
                compute_slices=size * share / 100.0,
                memory_gib=self.memory_gib(t.name, batch),
                preferred_gpu=None if gpu_level == 0 else gpu_level - 1,
                mode=MODES[mode_level],
                mps_pct=share,
                batch_size=batch,
            )
        return DecodedAction(RepairProblem((self.scenario.gpu,) * self.scenario.gpu_count, requests, make_before_break=self.scenario.make_before_break), clamped)

    def with_smallest_batches(self, problem: RepairProblem) -> RepairProblem:
        """The same requests at batch 1 (least memory): the fallback when memory cannot be packed."""
        requests = {
            name: TenantRequest(r.compute_slices, self.memory_gib(name, 1), r.preferred_gpu, r.mode, r.mps_pct, 1)
            for name, r in problem.tenants.items()
        }
        return RepairProblem(problem.gpus, requests, problem.variants, problem.driver_major, problem.make_before_break)

    # ------------------------------------------------------------------ encode
    def encode(self, config: Configuration) -> np.ndarray:
        """The action whose request an existing configuration meets most closely.

        Used by baselines that think in configurations, and to describe the running
        configuration: GI size, share, GPU, mode and batch are rounded to the nearest level.
        """
        action = np.zeros(self.space.shape, dtype=np.int64)
        for i, name in enumerate(self.tenant_names):
            p = config.placements.get(name)
            if p is None:
                continue
            size = self.instance_slices(config, name)
            mode = config.modes[p.gpu_index][p.instance_index]
            base = i * len(COMPONENTS)
            action[base + 0] = _nearest(self.size_levels, size)
            action[base + 1] = _nearest(SHARE_LEVELS_PCT, p.mps_pct if mode == SharingMode.MPS else 100.0)
            action[base + 2] = p.gpu_index + 1
            action[base + 3] = MODES.index(mode)
            action[base + 4] = min(_nearest(BATCH_LEVELS, p.batch_size), self.max_batch_level[i])
        return action

    def instance_slices(self, config: Configuration, tenant: str) -> float:
        """Compute slices of the GI a tenant is placed in (the whole device without MIG)."""
        p = config.placements[tenant]
        layout = config.layouts[p.gpu_index]
        if not self.gpu.mig_supported or not len(layout):
            return NON_MIG_COMPUTE_SLICES if not self.gpu.mig_supported else float(self.gpu.compute_slices)
        return float(self.gpu.profiles[layout.instances[p.instance_index].profile].compute_slices)


def _nearest(levels: tuple[float, ...] | tuple[int, ...], value: float) -> int:
    """Index of the level closest to ``value`` (the lower one on ties)."""
    return int(np.argmin([abs(level - value) for level in levels]))
