"""Random repair problems, shared by the tests and ``scripts/bench_repair.py``.

They stand in for policy actions: arbitrary amounts, preferences and modes, with memory
needs drawn so that a feasible configuration always exists (each GPU could hold its share
of the tenants in its largest GI), so every one of them must be repaired.
"""

from __future__ import annotations

import numpy as np

from rlsched.decision import SharingMode
from rlsched.solver.instances import gpu_table
from rlsched.solver.repair import RepairProblem


def random_problem(rng: np.random.Generator, gpus: tuple[str, ...], tenant_count: int) -> RepairProblem:
    """A random request for ``tenant_count`` tenants on a node of ``gpus``.

    Compute 0.05..4 slices; about half the tenants state a share (10..100 %), a preferred
    GPU, a mode. Memory per tenant is at most the smallest GPU's whole-GPU memory divided by
    the tenants per GPU (rounded up), so tenants can always share the largest GIs.
    """
    n = tenant_count
    per_gpu = -(-n // len(gpus))
    memory_cap = min(gpu_table(g).total_memory_gib for g in gpus) / per_gpu
    modes: list[SharingMode | None] = [None, *SharingMode]
    return RepairProblem.from_arrays(
        gpus,
        [f"t{i}" for i in range(n)],
        compute_slices=rng.uniform(0.05, 4.0, n),
        memory_gib=rng.uniform(0.0, 1.0, n) * memory_cap,
        preferred_gpu=np.where(rng.random(n) < 0.5, rng.integers(0, len(gpus), n), -1),
        mps_pct=np.where(rng.random(n) < 0.5, rng.uniform(10.0, 100.0, n), np.nan),
        batch_size=rng.integers(1, 65, n),
        modes=[modes[i] if rng.random() < 0.5 else None for i in rng.integers(0, len(modes), n)],
    )
